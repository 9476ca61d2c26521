"""The engine's reference: the same model as :mod:`simulator.engine.core`, one Python callback per event on a simpy
calendar (what the engine ran before its loop was compiled). Slow, and kept for the tests: the compiled engine
must give its floats exactly, on every kind of schedule (``tests/test_engine_reference.py``).

Everything due at one instant runs from one simpy event (a calendar of callbacks per time); rates are recomputed
once per instant at which flows started or finished, after every other callback of that instant.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import chain, compress
from operator import itemgetter
from typing import Any

import numpy as np
import simpy

from simulator.cluster.devices import DeviceSpec, compute_time, profiled_time
from simulator.cluster.size_curve import SizeCurve
from simulator.cluster.topology import Cluster
from simulator.collectives.p2p import p2p_channels
from simulator.engine import flowcore as fc
from simulator.engine.core import SimResult, contention_rates, slowed_by_contention, stream_ranks
from simulator.engine.host import HostResources
from simulator.schedule.colpass import stream_ordered
from simulator.schedule.core import COMPUTE_KINDS, OP_KINDS, Op, Schedule
from simulator.support.gcpause import gc_paused

__all__ = ["simulate_reference"]

Callback = Callable[[Any], None]
Weights = tuple[float, ...] | None
ROUTES_KEPT = 1 << 16  # routes kept as arrays (all forgotten at once when full)
_RANK, _KIND, _DEPS, _NBYTES, _PEER = itemgetter(1), itemgetter(2), itemgetter(4), itemgetter(6), itemgetter(8)
_KIND_INDEX = {kind: i for i, kind in enumerate(OP_KINDS)}
_COST = itemgetter(5, 6, 7, 18, 11, 25)  # Op.flops, nbytes, dtype, fused, fn, dims: what a kernel's duration depends on


class _Network:
    """The flow network's bookkeeping as it was in Python (slots, cap links, growth, the next finish) around the
    compiled filling of :mod:`simulator.engine.flowcore`: kept apart from :mod:`simulator.engine.netstate` (the
    compiled bookkeeping the engine uses), so that the tests compare two implementations of it.

    Active flows; call :meth:`add` / :meth:`remove`, then :meth:`allocate` once per instant.

    The state lives in arrays and the work is compiled (:mod:`simulator.engine.flowcore`): this class maps each
    flow's key to a slot (reused once the flow is gone), gives capped flows their private links, checks the input
    and grows the arrays."""

    def __init__(self, capacity: Sequence[float]) -> None:
        n = len(capacity)
        self._given = n  # the links routes may name
        self._links = n  # links in use: the given ones, then the private cap links handed out so far
        self._li = np.zeros((fc.NLI, 0), np.int64)
        self._lf = np.zeros((fc.NLF, 0))
        self._marks = np.zeros((2, 0), np.int64)
        self._grow_links(max(64, 2 * n))
        self._lf[fc.CAP, :n] = np.asarray(capacity, dtype=float)
        self._maxr = 8  # route positions per slot (grown for a longer route)
        self._si = np.zeros((fc.NSI, 0), np.int64)
        self._sf = np.zeros((fc.NSF, 0))
        self._route = np.zeros((0, self._maxr), np.int64)
        self._wts = np.ones((0, self._maxr))
        self._inc = np.full((2, 0), -1, np.int64)
        self._fresh = np.zeros(0, np.int64)
        self._free: list[int] = []
        self._grow_slots(64)
        self._eta = (np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._grow_eta(256)
        self._sc = np.zeros(fc.NSC, np.int64)
        self._scratch = (np.zeros(0, np.int64), np.zeros(0))  # allocate's room (_work)
        self._slot: dict[int, int] = {}  # flow key -> slot
        self._spare_caps: list[int] = []  # ids of cap links no flow holds now (reused before new ones)
        self._cap_link: dict[int, int] = {}  # flow -> its private cap link
        self.allocations = 0
        self._next: tuple[float, list[int]] | None = None  # next_finish's answer, until a flow comes or goes
        self._dirty = False  # a flow came or went since the last allocation
        self._eta_size = 0  # entries in the finish heap (as of the last allocation: at least as many as now)
        self._added = 0  # flows added since the last allocation (each may be listed once as fresh)
        self._routes: dict[tuple[int, ...], np.ndarray] = {}  # a route as an array, for the compiled code
        self._unweighted = np.ones(0)

    @property
    def capacity(self) -> list[float]:
        """Bytes/s of every link in use (the private cap links after the given ones)."""
        return self._lf[fc.CAP, :self._links].tolist()

    # -- growth ---------------------------------------------------------------------------------------------------
    def _grow_links(self, size: int) -> None:
        old = self._li.shape[1]
        li = np.zeros((fc.NLI, size), np.int64)
        li[:, :old] = self._li
        li[fc.HEAD, old:] = -1
        li[fc.TEPOCH, old:] = -1
        lf = np.zeros((fc.NLF, size))
        lf[:, :old] = self._lf
        marks = np.zeros((2, size), np.int64)
        marks[:, :old] = self._marks
        self._li, self._lf, self._marks = li, lf, marks

    def _grow_slots(self, size: int) -> None:
        old = self._si.shape[1]
        maxr = self._maxr
        si = np.zeros((fc.NSI, size), np.int64)
        si[:, :old] = self._si
        sf = np.zeros((fc.NSF, size))
        sf[:, :old] = self._sf
        route = np.zeros((size, maxr), np.int64)
        route[:old] = self._route
        wts = np.ones((size, maxr))
        wts[:old] = self._wts
        inc = np.full((2, size * maxr), -1, np.int64)
        inc[:, :old * maxr] = self._inc
        fresh = np.zeros(max(size + 1, len(self._fresh)), np.int64)
        fresh[:len(self._fresh)] = self._fresh
        self._si, self._sf, self._route, self._wts, self._inc, self._fresh = si, sf, route, wts, inc, fresh
        self._free.extend(range(size - 1, old - 1, -1))  # popped from the end: the lowest slot first

    def _grow_route(self, length: int) -> None:
        new = max(length, 2 * self._maxr)
        self._inc = fc.relayout(self._li, self._inc, self._maxr, new)
        route = np.zeros((len(self._route), new), np.int64)
        route[:, :self._maxr] = self._route
        wts = np.ones((len(self._wts), new))
        wts[:, :self._maxr] = self._wts
        self._route, self._wts, self._maxr = route, wts, new

    def _grow_eta(self, size: int) -> None:
        old = self._eta[0]
        eta = (np.zeros(size), np.zeros(size, np.int64), np.zeros(size, np.int64))
        for new, kept in zip(eta, self._eta, strict=True):
            new[:len(old)] = kept
        self._eta = eta

    # -- flows --------------------------------------------------------------------------------------------------
    def add(self, flow: int, links: Iterable[int], nbytes: float, now: float, cap: float = 0.0,
            weights: Weights = None) -> None:
        """Start draining ``flow`` at time ``now`` (rate 0 until the next :meth:`allocate`); ``cap`` > 0: the flow
        never goes faster (bytes/s), through a private link of that capacity appended to its route; ``weights``
        (one per link, > 0): bytes of each link's capacity one byte of the flow uses (None: 1 each)."""
        route = links if type(links) is tuple else tuple(links)
        arr = self._routes.get(route)
        if arr is None:
            if route and (min(route) < 0 or max(route) >= self._given):  # (the compiled code does not check)
                raise ValueError(f"flow {flow}: route {route} names a link outside 0..{self._given - 1}")
            arr = np.array(route, dtype=np.int64)
            if len(self._routes) >= ROUTES_KEPT:
                self._routes.clear()
            self._routes[route] = arr
        kind = 0
        warr = self._unweighted
        if weights is not None:
            weights = tuple(map(float, weights))
            if len(weights) != len(route) or not all(0.0 < w < math.inf for w in weights):
                raise ValueError(f"flow {flow}: needs one finite weight > 0 per link of its route {route}, got "
                                 f"{weights}")
            kind = fc.WEIGHTED
            warr = np.array(weights)
        if flow in self._slot:
            raise ValueError(f"flow {flow} is already active")
        if not self._free:
            self._grow_slots(2 * self._si.shape[1])
        if len(route) + (cap > 0.0) > self._maxr:
            self._grow_route(len(route) + 1)
        slot = self._free.pop()
        private = -1
        if cap > 0.0:
            if self._spare_caps:
                private = self._spare_caps.pop()
            else:
                private = self._links
                if private >= self._li.shape[1]:
                    self._grow_links(2 * self._li.shape[1])
                self._links += 1
            self._cap_link[flow] = private
            kind |= fc.CAPPED if weights is not None else fc.CAPPED | fc.CAPPED_PLAIN
        else:
            cap = 0.0
        self._slot[flow] = slot
        self._added += 1
        if self._added >= len(self._fresh):  # (a slot may be listed again after a reuse)
            self._fresh = np.concatenate((self._fresh, np.zeros(len(self._fresh), np.int64)))
        fc.add(slot, arr, warr, private, kind, flow, float(nbytes), float(now), float(cap), self._li, self._lf,
               self._si, self._sf, self._route, self._wts, self._inc, self._marks, self._fresh, self._sc)
        self._next = None
        self._dirty = True

    def remove(self, flow: int) -> None:
        """Stop ``flow`` (finished); the flows it shared links with get new rates at the next allocation."""
        slot = self._slot.pop(flow)
        fc.remove(slot, self._li, self._lf, self._si, self._sf, self._route, self._inc, self._marks, self._sc)
        self._free.append(slot)
        self._next = None
        self._dirty = True
        private = self._cap_link.pop(flow, None)
        if private is not None:
            self._spare_caps.append(private)

    def allocate(self, now: float, changed_links: bool = True) -> set[int]:
        """Recompute the max-min fair rates of the flows around the links touched since the last call, one
        connected component at a time (components share no link, so their rates are independent).

        Returns the links whose load may have changed (the touched ones and those of the recomputed flows; an
        empty set when ``changed_links`` is false, for a caller that does not read them).
        """
        if not self._dirty:  # no flow came or went since the last call
            return set()
        self._dirty = False
        if self._eta_size + len(self._slot) >= len(self._eta[0]):  # room for a new finish of every flow
            self._grow_eta(2 * (self._eta_size + len(self._slot)) + 16)
        work, fwork = self._work()
        did, changed, when, due, self._eta_size = fc.allocate(
            float(now), bool(changed_links), self._li, self._lf, self._si, self._sf, self._route, self._wts, self._inc,
            self._marks, self._fresh, *self._eta, self._sc, work, fwork)
        self._added = 0
        self._next = (when, due.tolist())
        if not did:
            return set()
        self.allocations += 1
        return set(changed.tolist()) if changed_links else set()

    def _work(self) -> tuple[np.ndarray, np.ndarray]:
        """Scratch room for an allocation (:func:`flowcore.work_size`), kept between calls."""
        ints, floats = fc.work_size(self._li, self._si, self._inc, self._eta[0])
        if len(self._scratch[0]) < ints or len(self._scratch[1]) < floats:
            self._scratch = (np.empty(ints, np.int64), np.empty(floats))
        return self._scratch

    def rate(self, flow: int) -> float:
        """Bytes/s ``flow`` drains at now (as of the last :meth:`allocate`)."""
        return float(self._sf[fc.RATE, self._slot[flow]])

    def load(self, link: int) -> float:
        """Bytes/s of ``link``'s capacity in use now (a flow that crosses it twice counts twice; a weighted flow
        its rate times its weight there)."""
        if not 0 <= link < self._links:
            return 0.0
        return float(fc.load(link, self._li, self._sf, self._wts, self._inc, self._maxr))

    def next_finish(self) -> tuple[float, list[int]]:
        """Earliest predicted finish time and every flow predicted to finish then (``(inf, [])`` when idle): the
        flows predicted within ``FINISH_RTOL`` of the earliest, in key order."""
        if self._next is None:
            when, due = fc.next_finish(self._si, *self._eta, self._sc, self._work()[0])
            self._next = (float(when), due.tolist())
        return self._next


class _Run:
    def __init__(self, schedule: Schedule, cluster: Cluster, record_links: bool = False) -> None:
        self.env = simpy.Environment()
        self.now: float = self.env.now  # the simulated time, kept by _run_due (a plain attribute: read for every op)
        self.record_links = record_links
        self.link_load: list[tuple[float, str, str, float]] = []
        self.sched = schedule
        self.ops = schedule.ops
        self.cluster = cluster
        self.place = schedule.placement_on(cluster.ranks)
        ops = schedule.ops
        n = len(ops)
        # seconds, by op id (None: not yet): lists of float objects, which the ops ending at one instant share and
        # the timeline's records reuse (an array of doubles would make a float object per record)
        self.start: list[float | None] = [None] * n
        self.end: list[float | None] = [None] * n
        self.ready = bytearray(n)  # 1 once the op is ready (a byte per op, not a list slot)
        self.stream_free = [0.0] * schedule.ranks
        self.specs = [cluster.specs.get(node) for node in self.place]  # rank -> device (shared by ranks of one kind)
        self.links: dict[tuple[str, str], int] = {}
        capacity: list[float] = []
        self.latency: list[float] = []
        self.edge_names: list[tuple[str, str]] = []
        for i, (u, v, data) in enumerate(cluster.graph.edges(data=True)):
            self.links[(u, v)] = i
            self.edge_names.append((u, v))
            capacity.append(data["bandwidth"])
            self.latency.append(data["latency"])
        self.hosts = HostResources(cluster, self.place, capacity)  # shared CPU cores and memory, if any
        # dependents as a CSR array (op d's children are kids[first_kid[d]:first_kid[d + 1]], in op-id order, as
        # they were appended): built by numpy, 8 bytes per edge instead of a list per op; a GPU's point-to-point
        # ends after the kernels its rank issued before them (stream order, the compiled loop's pass)
        deps_of = list(map(_DEPS, ops))
        counts = np.fromiter(map(len, deps_of), dtype=np.int64, count=n)
        parents = np.fromiter(chain.from_iterable(deps_of), dtype=np.int64, count=int(counts.sum()))
        del deps_of
        threads = np.array([self.hosts.shares(r) for r in range(schedule.ranks)], dtype=bool)
        # each op's kind as an index into OP_KINDS (the result keeps it): a C-level pass over the ops
        self.kind_of = np.fromiter(map(_KIND_INDEX.__getitem__, map(_KIND, ops)), dtype=np.uint8, count=n)
        counts, parents, _ = stream_ordered(
            counts, parents, self.kind_of, np.fromiter(map(_RANK, ops), dtype=np.int64, count=n),
            np.fromiter((-1 if op.match is None else op.match for op in ops), dtype=np.int64, count=n),
            np.fromiter((bool(op.coll) for op in ops), dtype=bool, count=n),
            stream_ranks(schedule, self.specs, threads), schedule.p2p)
        counts, parents = counts.astype(np.int64), parents.astype(np.int64)
        kids = np.repeat(np.arange(n, dtype=np.int64), counts)[np.argsort(parents, kind="stable")]
        self.kids = array("q", kids.tobytes())
        self.first_kid = array("q", np.concatenate(([0], np.cumsum(np.bincount(parents, minlength=n)))).tobytes())
        del kids, parents
        self.pending = counts.tolist()
        self.roots = np.flatnonzero(counts == 0).tolist()
        # link id -> (nominal bytes/s, bandwidth by message size): links and host copies measured over sizes
        self.curves: dict[int, tuple[float, SizeCurve]] = dict(self.hosts.copy_curves)
        for i, (_, _, curve) in enumerate(cluster.graph.edges(data="by_size")):
            if curve is not None:
                self.curves[i] = (capacity[i], curve)
        self._weights: dict[tuple[tuple[int, ...], float], tuple[float, ...] | None] = {}
        # ranks on shared host cores are host threads that issue their ops in program order (see _ready)
        self.program: list[list[int]] = [[] for _ in range(schedule.ranks)]
        self.in_order = any(self.hosts.shares(r) for r in range(schedule.ranks))  # any rank issues in order
        if self.in_order:
            for op in schedule.ops:
                if self.hosts.shares(op.rank):
                    self.program[op.rank].append(op.id)
        self.cursor = [0] * schedule.ranks
        self.hold_posted = schedule.program_order  # a transfer's end holds its SMs from its post (else its start)
        self.held = bytearray(len(schedule.ops))  # dependencies met, waiting for its turn in program order
        self.net = _Network(capacity)
        self._durations: dict[tuple[Any, ...], float] = {}
        self.extrapolated: dict[tuple[str, str, str], tuple[str, ...]] = {}
        self._paths: dict[tuple[int, int], tuple[tuple[int, ...], float]] = {}
        sends = list(compress(ops, (self.kind_of == _KIND_INDEX["send"]).tolist()))
        place = self.place
        cluster.prepare_routes({(place[a], place[b]) for a, b in set(zip(map(_RANK, sends), map(_PEER, sends),
                                                                          strict=True))})
        del sends
        self.msg_s, self.comm_s = cluster.message_overhead_s, cluster.comm_overhead_s
        # a compute op's duration is cached by (its device, its cost fields): one key per spec object, or none
        self.spec_key = [id(spec) for spec in self.specs]
        self.one_spec = len(set(self.spec_key)) <= 1
        self.flow_op: dict[int, Op] = {}
        self._contention_columns()
        self.dirty = False
        self.generation = 0
        self.events = 0
        self.simpy_events = 0
        self._calendar: dict[float, list[tuple[Callback, Any]]] = {}

    def _contention_columns(self) -> None:
        """The SMs each end of a point-to-point transfer between two GPUs holds in flight and the most a rank's
        transfers hold (:mod:`simulator.collectives.p2p`), and the per-rank state of its compute stream when they
        do (kernels then run one at a time from a FIFO, at a rate that changes with the SMs held)."""
        ranks = self.sched.ranks
        self.ctas: dict[int, int] = {}
        self.hmax = [0] * ranks
        gpus = [r for r in range(ranks) if (spec := self.specs[r]) is not None and spec.sm_count > 0]
        channels = p2p_channels(self.cluster, [self.place[r] for r in gpus]) if len(gpus) > 1 else None
        if channels is not None:
            mine = set(gpus)
            for op in self.ops:
                peer, match = op.peer, op.match
                if op.kind == "send" and not op.coll and peer is not None and match is not None \
                        and op.rank in mine and peer in mine and self.place[op.rank] != self.place[peer]:
                    self.ctas[op.id] = self.ctas[match] = channels.of(float(op.nbytes))
            for r in gpus:
                spec = self.specs[r]
                assert spec is not None
                self.hmax[r] = min(channels.channels, spec.sm_count - 1)
        self.contend = any(self.ctas.values())
        self.most = min(max(self.hmax, default=0), channels.per_peer if channels is not None else 0)
        self._rates: dict[tuple[Any, ...], np.ndarray] = {}
        if self.contend:  # no kernel that runs slower for the SMs held (decode's are memory-bound): none are held
            on_gpu = set(gpus)
            self.contend = any(op.kind in COMPUTE_KINDS and op.rank in on_gpu
                               and bool((self._rates_of(op.rank, op) < 1.0).any()) for op in self.ops)
        self.sm_held: list[dict[int, int]] = [{} for _ in range(ranks)]  # SMs held -> transfer ends holding them
        self.running: list[Op | None] = [None] * ranks
        self.rleft = [0.0] * ranks
        self.rsince = [0.0] * ranks
        self.rrate = [1.0] * ranks
        self.rend = [0.0] * ranks
        self.queue: list[deque[Op]] = [deque() for _ in range(ranks)]
        self.slowed_ops: set[int] = set()

    # -- contention: transfers holding SMs slow the kernels of their ranks ---------------------------------------
    def _kernel_rate(self, rank: int, op: Op) -> float:
        held = [c for c, k in self.sm_held[rank].items() if k > 0]
        h = min(max(held, default=0), self.hmax[rank])
        if h <= 0:
            return 1.0
        return float(self._rates_of(rank, op)[h])

    def _rates_of(self, rank: int, op: Op) -> np.ndarray:
        key = (self.spec_key[rank], _COST(op))
        rates = self._rates.get(key)
        if rates is None:
            spec = self.specs[rank]
            assert spec is not None
            rates = self._rates[key] = contention_rates(spec, op, self._duration(op), self.most)
        return rates

    def _predict(self, rank: int, op: Op, left: float, rate: float) -> None:
        """The running kernel's end at ``rate`` with ``left`` seconds of work from now (a prediction before goes
        stale)."""
        now = self.now
        self.rleft[rank] = left
        self.rsince[rank] = now
        self.rrate[rank] = rate
        if rate < 1.0:
            self.slowed_ops.add(op.id)
        delay = left / rate
        self.rend[rank] = now + delay
        self._at(delay, self._kernel_end, op)

    def _begin(self, rank: int, op: Op) -> None:
        self.running[rank] = op
        self.start[op.id] = self.now
        self._predict(rank, op, self._duration(op), self._kernel_rate(rank, op))

    def _kernel_ready(self, op: Op) -> None:
        rank = op.rank
        if self.running[rank] is None:
            self._begin(rank, op)
        else:
            self.queue[rank].append(op)

    def _hold(self, rank: int, ctas: int, sign: int) -> None:
        if ctas <= 0:
            return
        counts = self.sm_held[rank]
        counts[ctas] = counts.get(ctas, 0) + sign
        op = self.running[rank]
        if op is None:
            return
        rate = self._kernel_rate(rank, op)
        if rate == self.rrate[rank]:
            return
        left = self.rleft[rank] - (self.now - self.rsince[rank]) * self.rrate[rank]
        self._predict(rank, op, left if left > 0.0 else 0.0, rate)

    def _released(self, send: Op) -> None:
        assert send.match is not None
        self._hold(send.rank, self.ctas.get(send.id, 0), -1)
        self._hold(self.ops[send.match].rank, self.ctas.get(send.match, 0), -1)

    def _kernel_end(self, op: Op) -> None:
        rank = op.rank
        run = self.running[rank]
        if run is None or run.id != op.id or self.now != self.rend[rank]:
            return  # re-timed since
        self.running[rank] = None
        if self.queue[rank]:
            self._begin(rank, self.queue[rank].popleft())
        self._done(op)

    # -- the calendar: every callback due at one time runs from one simpy event ----------------------------------
    def _at(self, delay: float, callback: Callback, arg: Any) -> None:
        """Call ``callback(arg)`` in ``delay`` seconds (after what is already due then)."""
        when = self.now + delay  # the time simpy gives the timeout below: its now + delay
        due = self._calendar.get(when)
        if due is None:
            due = self._calendar[when] = []
            ev = self.env.timeout(delay)
            ev.callbacks.append(partial(self._run_due, when))  # type: ignore[union-attr]
            self.simpy_events += 1
        due.append((callback, arg))

    def _run_due(self, when: float, _event: object = None) -> None:
        """Run every callback due now, then, if flows started or finished, recompute rates once: after everything
        else of this instant (nothing else is queued for it: the calendar has one simpy event per time)."""
        self.now = when
        due = self._calendar[when]
        done = 0
        while True:
            while done < len(due):  # callbacks may add more for this same instant: run those too
                callback, arg = due[done]
                callback(arg)
                done += 1
            if not self.dirty:
                break
            self._reallocate()  # may predict a finish at this same instant: due grows, the loop goes on
        self.events += done
        del self._calendar[when]

    def run(self) -> SimResult:
        ops = self.ops
        for i in self.roots:
            op = ops[i]
            self._at(op.not_before_s, self._ready, op)
        self.env.run()
        start, end = self.start, self.end
        if None in start:
            unfinished = [i for i, t in enumerate(start) if t is None]
            raise RuntimeError(f"schedule deadlocked: ops {unfinished[:10]} never started")
        self.kids, self.first_kid, self.pending = array("q"), array("q"), []  # the results need none of these
        self.ready, self.held = bytearray(), bytearray()
        starts, ends = np.array(start, dtype=float), np.array(end, dtype=float)  # None -> NaN
        self.start, self.end = [], []
        ranks = np.fromiter(map(_RANK, ops), dtype=np.int64, count=len(ops))
        ids = np.flatnonzero(~np.isnan(ends))  # started but never ended: not on the timeline
        last = np.full(self.sched.ranks, -np.inf)
        np.maximum.at(last, ranks[ids], ends[ids])
        end_time = {r: float(last[r]) for r in np.unique(ranks[ids]).tolist()}
        # the timeline's (start, rank, op) order: one sort of arrays rather than of millions of key tuples
        order = ids[np.lexsort((ids, ranks[ids], starts[ids]))]
        slowed = None
        if self.contend:
            dur = np.array([self._duration(op) if op.kind in COMPUTE_KINDS else 0.0 for op in ops])
            mask = np.zeros(len(ops), dtype=bool)
            mask[list(self.slowed_ops)] = True
            slowed = slowed_by_contention(starts, ends, dur, mask)
        return SimResult(ops, starts, ends, order, ranks, self.kind_of, self.events, self.net.allocations,
                         self.sched.ranks, end_time, self.simpy_events, self.link_load, self.extrapolated,
                         None, slowed)

    # -- op life cycle -----------------------------------------------------------------------------------------
    def _duration(self, op: Op) -> float:
        rank = op.rank
        key = _COST(op) if self.one_spec else (self.spec_key[rank], _COST(op))  # the cluster holds its specs
        hit = self._durations.get(key)
        if hit is None:
            hit = self._durations[key] = self._new_duration(self.specs[rank], op)
        return hit

    def _new_duration(self, spec: DeviceSpec | None, op: Op) -> float:
        if spec is None:  # a switch reducing in the network (NVLS), at line rate
            return 0.0
        profiled = None if op.fused else profiled_time(spec, op.fn, op.dtype, op.dims)
        if profiled is None:
            return compute_time(spec, op.flops, op.nbytes, op.dtype, launch=not op.fused, fn=op.fn)
        hit, outside = profiled
        if outside:
            where = (spec.name, op.fn, op.dtype)
            self.extrapolated[where] = tuple(sorted({*self.extrapolated.get(where, ()), *outside}))
        return hit

    def _ready(self, op: Op) -> None:
        now = self.now
        if now < op.not_before_s:
            self._at(op.not_before_s - now, self._ready, op)
            return
        if self.in_order and self.program[op.rank]:
            self._ready_in_order(op)
            return
        kind = op.kind
        if (kind == "compute" or kind == "merge") and self.contend:
            self._kernel_ready(op)
        elif kind == "compute" or kind == "merge":  # COMPUTE_KINDS
            rank = op.rank
            duration = self._duration(op)
            begin = self.stream_free[rank]  # one FIFO compute stream: max(now, when it is free)
            if begin < now:
                begin = now
            end = begin + duration
            self.stream_free[rank] = end
            self.start[op.id] = begin
            self._at(end - now, self._done, op)
        elif kind == "launch":
            self.start[op.id] = now
            self._at(max(self.cluster.collective_start_s, op.floor_s), self._launched, op)
        else:
            self._posted(op)

    def _posted(self, op: Op) -> None:
        """A send or receive is posted (ready): its kernel holds its SMs from now (a program's op order); once both
        ends are posted, the transfer starts."""
        self.ready[op.id] = 1
        if self.contend and self.hold_posted:
            self._hold(op.rank, self.ctas.get(op.id, 0), 1)
        match = op.match
        assert match is not None
        if self.ready[match]:  # both ends ready: the transfer starts
            if op.kind == "send":
                self._start_transfer(op, self.ops[match])
            else:
                self._start_transfer(self.ops[match], op)

    def _ready_in_order(self, op: Op) -> None:
        """An op of a host thread (a rank on shared host cores): it waits for its turn in program order."""
        kind = op.kind
        rank = op.rank
        if self.program[rank][self.cursor[rank]] != op.id:
            self.held[op.id] = 1
            return
        if kind == "send" or kind == "recv":  # posted: the thread goes on to its next op
            self._issued(rank)
            self._posted(op)
            return
        self.ready[op.id] = 1
        if kind in COMPUTE_KINDS:  # its turn in program order: the rank's previous kernel has returned
            self._start_kernel(op)
        else:  # a launch
            self.start[op.id] = self.now
            self._at(max(self.cluster.collective_start_s, op.floor_s), self._launched, op)

    def _launched(self, op: Op) -> None:
        self._done(op)
        if self.program[op.rank]:
            self._issued(op.rank)

    def _issued(self, rank: int) -> None:
        """A host thread is done issuing its current op (a kernel or a launch ran, a transfer was posted): its
        next op in program order may start once its dependencies are met."""
        self.cursor[rank] += 1
        program = self.program[rank]
        if self.cursor[rank] < len(program):
            nxt = program[self.cursor[rank]]
            if self.held[nxt]:
                self.held[nxt] = 0
                self._at(0.0, self._ready, self.ops[nxt])

    def _start_kernel(self, op: Op) -> None:
        """Start a kernel of a rank whose host's cores are shared: work drained as a flow."""
        self.start[op.id] = self.now
        duration = self._duration(op)
        if duration <= 0:
            self._kernel_done(op)
            return
        links, work, weights = self.hosts.kernel(op, duration)
        self.net.add(op.id, links, work, self.now, 0.0, weights)
        self.flow_op[op.id] = op
        self._mark_dirty()

    def _kernel_done(self, op: Op) -> None:
        self._done(op)
        self._issued(op.rank)

    def _path(self, src: int, dst: int) -> tuple[tuple[int, ...], float]:
        """Link ids a transfer between two ranks crosses (route, then host cores its copies use) and its latency."""
        hit = self._paths.get((src, dst))
        if hit is None:
            a, b = self.place[src], self.place[dst]
            route = self.cluster.route(a, b) if a != b else ()
            route_ids = tuple(map(self.links.__getitem__, route))
            links = (*route_ids, *self.hosts.transfer(src, dst)) if route and self.hosts.copies else route_ids
            latency = sum(map(self.latency.__getitem__, route_ids))  # Cluster.route_latency, from a list
            hit = self._paths[(src, dst)] = (links, latency)
        return hit

    def _start_transfer(self, send: Op, recv: Op) -> None:
        now = self.now
        self.start[send.id] = self.start[recv.id] = now
        if self.contend and not self.hold_posted:  # both ends' kernels hold their SMs from now to the transfer's end
            self._hold(send.rank, self.ctas.get(send.id, 0), 1)
            self._hold(recv.rank, self.ctas.get(recv.id, 0), 1)
        hit = self._paths.get((send.rank, recv.rank))
        link_ids, latency = hit if hit is not None else self._path(send.rank, recv.rank)
        delay = self.msg_s + latency
        floor = send.floor_s
        if delay < floor:
            delay = floor
        elif floor < 0.0:  # STREAMED: a later step of a pipeline, its latency hidden behind the steps before it
            delay = 0.0
        if not send.coll:
            delay += self.comm_s
        if not link_ids or send.nbytes == 0:
            self._at(delay, self._finish_transfer, send)
        else:
            self._at(delay, self._inject, (send, link_ids))

    def _inject(self, flow: tuple[Op, tuple[int, ...]]) -> None:
        send, link_ids = flow
        weights = self._weights_of(link_ids, send.nbytes) if self.curves else None
        self.net.add(send.id, link_ids, send.nbytes, self.now, send.rate_cap, weights)
        self.flow_op[send.id] = send
        self.dirty = True  # rates are recomputed once every other callback of this instant has run (_run_due)

    def _weights_of(self, link_ids: tuple[int, ...], nbytes: float) -> tuple[float, ...] | None:
        """A message's weight on each link of its route: nominal / bandwidth at its size where the link (or host
        copy) was measured over sizes, else 1; None where no link of the route was."""
        key = (link_ids, nbytes)
        if key not in self._weights:
            curves = [self.curves.get(link) for link in link_ids]
            self._weights[key] = None if not any(curves) else tuple(
                1.0 if c is None else c[1].weight(c[0], nbytes) for c in curves)
        return self._weights[key]

    def _mark_dirty(self) -> None:
        """Rates are recomputed once every other callback of this instant has run (see _run_due)."""
        self.dirty = True

    def _reallocate(self) -> None:
        self.dirty = False
        self.events += 1
        changed = self.net.allocate(self.now, changed_links=self.record_links)
        if self.record_links:
            for link in sorted(changed):
                if link < len(self.edge_names):  # not a virtual core or memory link
                    u, v = self.edge_names[link]
                    self.link_load.append((self.now, u, v, self.net.load(link)))
        self.generation += 1
        when, due = self.net.next_finish()
        if due:
            self._at(when - self.now, self._drained, (self.generation, due))

    def _drained(self, predicted: tuple[int, list[int]]) -> None:
        gen, due = predicted
        if gen != self.generation:
            return  # rates changed since this finish was predicted
        remove, flow_op, ops, done = self.net.remove, self.flow_op, self.ops, self._done
        end, now, first = self.end, self.now, self.first_kid
        for flow in due:
            remove(flow)
            op = flow_op.pop(flow)
            if op.kind == "send":
                match = op.match
                assert match is not None
                if self.contend:
                    self._released(op)
                # _done of both ends, its end recorded here for one with no dependents (most sends)
                if first[flow] == first[flow + 1]:
                    end[flow] = now
                else:
                    done(op)
                if first[match] == first[match + 1]:
                    end[match] = now
                else:
                    done(ops[match])
            else:  # a kernel on shared host cores
                self._kernel_done(op)
        self.dirty = True

    def _finish_transfer(self, send: Op) -> None:
        assert send.match is not None
        if self.contend:
            self._released(send)
        self._done(send)
        self._done(self.ops[send.match])

    def _done(self, op: Op) -> None:
        """The op has ended: its end is recorded (the timeline is built from them once the run is over) and the
        ops that waited only for it become ready."""
        oid = op.id
        now = self.now
        self.end[oid] = now
        first = self.first_kid
        lo, hi = first[oid], first[oid + 1]
        if lo == hi:
            return
        pending, ops = self.pending, self.ops
        direct = not self.in_order  # no host thread orders its ops: _ready's GPU-rank cases, inlined below
        for child in self.kids[lo:hi]:
            left = pending[child] - 1
            pending[child] = left
            if left:
                continue
            nxt = ops[child]
            kind = nxt.kind
            if direct and now >= nxt.not_before_s and not self.contend:
                if kind == "compute" or kind == "merge":  # _ready's compute case
                    rank = nxt.rank
                    hit = self._durations.get(_COST(nxt) if self.one_spec else (self.spec_key[rank], _COST(nxt)))
                    duration = self._duration(nxt) if hit is None else hit
                    begin = self.stream_free[rank]
                    if begin < now:
                        begin = now
                    end = begin + duration
                    self.stream_free[rank] = end
                    self.start[child] = begin
                    self._at(end - now, self._done, nxt)
                    continue
                if kind == "send" or kind == "recv":  # _ready's transfer case
                    self._posted(nxt)
                    continue
            self._ready(nxt)


def simulate_reference(schedule: Schedule, cluster: Cluster, record_links: bool = False) -> SimResult:
    """:func:`simulator.engine.core.simulate`, one Python callback per event (the tests' reference)."""
    with gc_paused():
        return _Run(schedule, cluster, record_links).run()
