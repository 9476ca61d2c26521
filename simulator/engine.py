"""The event engine (the only simpy code): runs a :class:`Schedule` on a :class:`Cluster`, records a timeline.

* Compute ops: roofline time on the rank's device (:func:`simulator.devices.compute_time`); one compute stream per
  rank, FIFO in the order ops become ready.
* Launch ops (the start of a collective on a rank) take ``comm_overhead``, off the compute stream.
* Transfers: when both ends are ready, the flow waits ``message_overhead + sum(link latency)`` of its route (plus
  ``comm_overhead`` for a transfer that is not part of a collective: it is a communication operation of its own), then
  drains over every directed link of the route at its max-min fair rate (:mod:`simulator.network`). Rates are
  recomputed once per simulated instant at which flows start or finish: the recomputation is an event of lower
  priority than everything else at that instant, scheduled at most once per instant.

Uncontended, a transfer of B bytes takes exactly ``overhead + sum(latency) + B / min(bandwidth)``, where
``overhead = message_overhead (+ comm_overhead outside a collective)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import simpy
from simpy.events import NORMAL, EventPriority

from simulator.devices import compute_time
from simulator.network import FlowNetwork
from simulator.schedule import COMPUTE_KINDS, Op, Schedule
from simulator.topology import Cluster

__all__ = ["Record", "SimResult", "simulate"]

_REALLOCATE = EventPriority(NORMAL + 1)  # lower priority than every ordinary event of the same instant


@dataclass(frozen=True, slots=True)
class Record:
    """One timeline entry: an op of a rank, its start and end in seconds, its size."""

    rank: int
    op: int
    kind: str
    name: str
    start: float
    end: float
    nbytes: float
    flops: float


@dataclass
class SimResult:
    """What a simulation returns: the timeline and counters. Results are derived from the timeline."""

    timeline: list[Record]
    events: int
    allocations: int
    ranks: int
    end_time: dict[int, float] = field(default_factory=dict)

    @property
    def makespan(self) -> float:
        return max((r.end for r in self.timeline), default=0.0)

    def op_ends(self) -> dict[int, float]:
        """End time of every op, by op id."""
        return {r.op: r.end for r in self.timeline}


class _Run:
    def __init__(self, schedule: Schedule, cluster: Cluster) -> None:
        self.env = simpy.Environment()
        self.sched = schedule
        self.cluster = cluster
        self.place = schedule.placement_on(cluster.ranks)
        self.pending = [len(op.deps) for op in schedule.ops]
        self.children: list[list[int]] = [[] for _ in schedule.ops]
        for op in schedule.ops:
            for d in op.deps:
                self.children[d].append(op.id)
        self.start: list[float | None] = [None] * len(schedule.ops)
        self.ready_at: list[float | None] = [None] * len(schedule.ops)
        self.stream_free = [0.0] * schedule.ranks
        self.links: dict[tuple[str, str], int] = {}
        capacity: list[float] = []
        for i, (u, v, bw) in enumerate(cluster.graph.edges(data="bandwidth")):
            self.links[(u, v)] = i
            capacity.append(bw)
        self.net = FlowNetwork(capacity)
        self.flow_op: dict[int, Op] = {}
        self.dirty = False
        self.generation = 0
        self.events = 0
        self.timeline: list[Record] = []

    # -- scheduling helpers ------------------------------------------------------------------------------------
    def _at(self, delay: float, callback: Any, priority: EventPriority = NORMAL) -> None:
        ev = simpy.Event(self.env)
        ev.callbacks.append(callback)  # type: ignore[union-attr]
        ev._ok = True
        ev._value = None
        self.env.schedule(ev, priority, delay)
        self.events += 1

    def run(self) -> SimResult:
        for op in self.sched.ops:
            if not op.deps:
                self._at(op.not_before_s, lambda _e, o=op: self._ready(o))
        self.env.run()
        unfinished = [op.id for op in self.sched.ops if self.start[op.id] is None]
        if unfinished:
            raise RuntimeError(f"schedule deadlocked: ops {unfinished[:10]} never started")
        ends: dict[int, float] = {}
        for rec in self.timeline:
            ends[rec.rank] = max(ends.get(rec.rank, 0.0), rec.end)
        self.timeline.sort(key=lambda r: (r.start, r.rank, r.op))
        return SimResult(self.timeline, self.events, self.net.allocations, self.sched.ranks, ends)

    # -- op life cycle -----------------------------------------------------------------------------------------
    def _ready(self, op: Op) -> None:
        now = self.env.now
        if now < op.not_before_s:
            self._at(op.not_before_s - now, lambda _e: self._ready(op))
            return
        self.ready_at[op.id] = now
        if op.kind == "launch":
            self.start[op.id] = now
            self._at(self.cluster.comm_overhead_s, lambda _e: self._done(op))
            return
        if op.kind in COMPUTE_KINDS:
            node = self.place[op.rank]
            duration = compute_time(self.cluster.specs[node], op.flops, op.nbytes, op.dtype, launch=not op.fused)
            begin = max(now, self.stream_free[op.rank])
            self.stream_free[op.rank] = begin + duration
            self.start[op.id] = begin
            self._at(begin + duration - now, lambda _e: self._done(op))
            return
        assert op.match is not None
        other = self.sched.ops[op.match]
        if self.ready_at[other.id] is None:
            return  # the other end starts the transfer when it becomes ready
        send = op if op.kind == "send" else other
        self._start_transfer(send, other if op.kind == "send" else op)

    def _start_transfer(self, send: Op, recv: Op) -> None:
        now = self.env.now
        self.start[send.id] = self.start[recv.id] = now
        src, dst = self.place[send.rank], self.place[recv.rank]
        route = self.cluster.route(src, dst) if src != dst else ()
        delay = self.cluster.message_overhead_s + self.cluster.route_latency(route)
        if not send.coll:
            delay += self.cluster.comm_overhead_s
        if not route or send.nbytes == 0:
            self._at(delay, lambda _e: self._finish_transfer(send))
            return
        link_ids = [self.links[e] for e in route]
        self._at(delay, lambda _e: self._inject(send, link_ids))

    def _inject(self, send: Op, link_ids: list[int]) -> None:
        self.net.advance(self.env.now)
        self.net.add(send.id, link_ids, send.nbytes)
        self.flow_op[send.id] = send
        self._mark_dirty()

    def _mark_dirty(self) -> None:
        if not self.dirty:
            self.dirty = True
            self._at(0.0, self._reallocate, _REALLOCATE)

    def _reallocate(self, _e: object) -> None:
        self.dirty = False
        self.net.advance(self.env.now)
        self.net.allocate()
        self.generation += 1
        when, due = self.net.next_finish()
        if due:
            gen = self.generation
            self._at(when - self.env.now, lambda _e: self._drained(gen, due))

    def _drained(self, gen: int, due: list[int]) -> None:
        if gen != self.generation:
            return  # rates changed since this finish was predicted
        self.net.advance(self.env.now)
        for flow in self.net.pop_finished(due):
            self._finish_transfer(self.flow_op.pop(flow))
        self._mark_dirty()

    def _finish_transfer(self, send: Op) -> None:
        assert send.match is not None
        self._done(send)
        self._done(self.sched.ops[send.match])

    def _done(self, op: Op) -> None:
        now = self.env.now
        start = self.start[op.id]
        assert start is not None
        self.timeline.append(Record(op.rank, op.id, op.kind, op.name, start, now, op.nbytes, op.flops))
        for child in self.children[op.id]:
            self.pending[child] -= 1
            if self.pending[child] == 0:
                self._ready(self.sched.ops[child])


def simulate(schedule: Schedule, cluster: Cluster) -> SimResult:
    """Run ``schedule`` on ``cluster`` in simulated time; returns the timeline and event counts."""
    return _Run(schedule, cluster).run()
