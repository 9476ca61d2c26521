"""The event engine: runs a :class:`Schedule` on a :class:`Cluster`, records a timeline.

* Compute ops: roofline time on the rank's device (:func:`simulator.cluster.devices.compute_time`); one compute stream
  per rank, FIFO in the order ops become ready. Where several ranks share a host's CPU cores (``host_cores`` in the
  topology: CPU ranks, as in real runs on a small machine), a kernel is work of that many core-seconds that
  drains at up to one core, the host's cores shared max-min fairly among the kernels running on it: the same
  progressive filling as the network, over virtual links (:mod:`simulator.engine.host`): the host's cores, its
  memory bandwidth (``host_mem_bw``), and, with ``host_copy_bw``, the CPU time transfers spend copying.
  Such a rank is also one host thread that issues its ops in program order (the order of the schedule): an op
  starts once its dependencies are met *and* the op before it was issued: a kernel or a collective's launch
  when it returns, a send or receive as soon as it is posted. (A GPU's host thread only enqueues kernels, so
  GPU ranks run ops as soon as their dependencies allow.)
* Stream order: a GPU rank (a device with SMs, not a host thread) posts a send or receive outside a collective, or
  launches a collective, once its dependencies are met *and* the last kernel (``compute`` or ``merge``) before it in
  its rank's op order has ended: PyTorch's ``ProcessGroupNCCL`` makes NCCL's stream wait for the current stream before
  it enqueues a communication kernel, so that kernel starts only after the work queued before it. A schedule's op
  order per rank is its program: to overlap a transfer with a kernel, it issues the transfer first (``ring`` posts the
  next shard, then attends). A rank's point-to-point kernels run one after another on their stream: with the schedule's
  ``p2p`` ``"batched"`` (the ends it issues back to back one kernel, one ``batch_isend_irecv``; an end that depends on
  one of them starts the next) each end waits for every end of the rank's group before it; with ``"per-peer"`` for its
  rank's end before it with the same peer (a stream per pair of ranks). One compiled pass adds these dependencies
  (:func:`simulator.schedule.colpass.stream_ordered`), for this loop and the reference alike; none where a schedule
  says its op order is not a program (``Schedule.program_order``).
* Launch ops (the start of a collective on a rank) take ``collective_overhead`` (default: ``comm_overhead``), or
  the op's ``floor_s`` (a protocol's base latency) when that is longer, off the compute stream.
* Transfers: when both ends are ready, the flow waits ``message_overhead + sum(link latency)`` of its route (plus
  ``comm_overhead`` for a transfer that is not part of a collective: it is a communication operation of its own;
  ``message_overhead + latency`` is raised to the send's ``floor_s``, a protocol's per-hop latency, if lower;
  none for a later step of a pipeline, ``floor_s`` = ``STREAMED``: NCCL keeps 8 steps in flight per connection),
  then drains over every directed link of the route at its max-min fair rate (:mod:`simulator.engine.network`). Rates
  are recomputed once per simulated instant at which flows start or finish, after every other callback of that
  instant has run. A link measured by message size (``bandwidth_by_size``, and the host copies'
  ``host_copy_bw_by_size``: :mod:`simulator.cluster.size_curve`) is loaded by a message of B bytes as if its
  bandwidth were the one measured at B.

* Contention: a point-to-point transfer between two NVIDIA GPUs (a send not part of a collective) runs on NCCL's P2P
  kernel, whose CTAs each take an SM that no compute kernel shares; each end holds its channels' SMs
  (:mod:`simulator.collectives.p2p`: NCCL's channel count for the message's size) from its post (its kernel is
  launched then, in stream order, and spins on its SMs while it waits for its peer) to the transfer's end; where the
  schedule's op order is not a program (``Schedule.program_order`` false), from the transfer's start (both ends
  posted) to its end. A GPU holds ``h``: the most any of its transfer ends in flight holds (a grouped send and receive
  are one kernel on the larger channel count, and a communicator runs one kernel at a time), at most its
  communicator's P2P channels. A kernel then runs at its duration alone over its duration on the ``S - h`` SMs left
  (:func:`contention_rates`, :func:`simulator.cluster.devices.duration_with_sms_held`: an attention block by its tiles
  on ``S - h`` SMs, its waves re-quantized; a roofline kernel ``launch + max(t_flops S / (S - h), t_mem)``). So a
  roofline kernel with no launch or memory side, overlapped by a transfer for ``t``, ends ``t h / S`` late; a
  memory-bound one not at all; an attention block of exactly one wave takes two. Kernels then run one at a time from a
  FIFO per rank, each re-timed whenever the SMs held change; the time contention adds to a kernel is
  :attr:`SimResult.slowed` (rows count it as communication). Transfers inside collectives hold no SMs here (their
  kernels are not modelled yet), nor does a transfer take HBM bandwidth from a memory-bound kernel.

Uncontended, a transfer of B bytes takes exactly ``overhead + sum(latency) + B / min(bandwidth)`` (each link's
bandwidth at B where it was measured by size), where
``overhead = message_overhead (+ comm_overhead outside a collective)`` (a ``STREAMED`` one: ``B / min(bandwidth)``).

Everything due at one instant runs together: a calendar of callbacks ordered by (time, order of scheduling), and
rates recomputed once at the end of the instant's callbacks. The loop is compiled (:mod:`.eventcore`, numba, over
the flow network of :mod:`.netstate`): this module turns the schedule into columns (an array per op field, a
kernel's duration computed once per distinct cost, a route once per pair of ranks) and runs them, a budget of
callbacks per compiled call (an interrupt lands between calls), so that a lockstep schedule costs about a
microsecond per op. :mod:`.reference` is the same model with one Python callback per event on a simpy calendar;
the tests hold the compiled loop to its floats exactly. The run keeps each op's start and end by op id; the result
holds them as arrays, with the ops' (start, rank, op) order, and builds the timeline (one :class:`Record` per op)
only when a caller asks for it: rows, reports and traces read the arrays, so what they cost grows with what they
show.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter
from typing import Any, NamedTuple, NoReturn

import numpy as np

from simulator.cluster.devices import DeviceSpec, compute_time, duration_with_sms_held, profiled_time
from simulator.cluster.links import link_table
from simulator.cluster.size_curve import SizeCurve
from simulator.cluster.topology import Cluster
from simulator.collectives.p2p import p2p_channels
from simulator.engine import eventcore
from simulator.engine.host import HostResources
from simulator.schedule.colpass import (
    dependents,
    distinct_codes,
    first_of,
    group_max,
    ordered_sum,
    spans,
    stream_ordered,
    timeline_order,
)
from simulator.schedule.core import COMPUTE_KINDS, Op, Schedule
from simulator.schedule.oplist import COST as _COST
from simulator.schedule.oplist import KIND_INDEX as _KIND_INDEX
from simulator.schedule.oplist import Columns, OpList
from simulator.support.gcpause import gc_paused

__all__ = ["Record", "SimResult", "simulate"]

_new = tuple.__new__  # a Record from its fields in order, without Record.__new__'s Python-level call
_NBYTES = itemgetter(6)  # Op.nbytes
_SENDS = frozenset({"send"})
_COLUMNS = ("match", "path", "wrow", "hrow", "coll", "pending", "dur", "not_before", "floor", "nbytes", "rate_cap",
            "kids", "first_kid", "prog", "roots", "ctas", "srow")  # per-op columns only the compiled loop reads
CALLBACKS_PER_CALL = 200_000  # the compiled loop returns to Python this often (tens of milliseconds)


class Record(NamedTuple):
    """One timeline entry: an op of a rank, its start and end in seconds, its size."""

    rank: int
    op: int
    kind: str
    name: str
    start: float
    end: float
    nbytes: float
    flops: float


@dataclass(eq=False)  # compared by identity: its fields are arrays
class SimResult:
    """What a simulation returns: each op's start and end (columns by op id), the ops in timeline order, counters.

    ``start[i]`` / ``end[i]``: op ``i``'s times in seconds (NaN: it never started / ended); ``order``: the ids of the
    ops that ended, in (start, rank, op) order (the timeline's); ``rank_of[i]``: op ``i``'s rank, ``kind_of[i]`` its
    kind's index in :data:`~simulator.schedule.core.OP_KINDS`. Results are read off these arrays; :attr:`timeline` (one
    :class:`Record` per op) is built only when asked for: millions of tuples for a large run, which nothing on the
    way to a row or a report needs.

    ``events`` counts the engine's callbacks (op completions and readiness, flow injections and finishes, rate
    recomputations); ``simpy_events`` the instants they ran at (one simpy event each in the reference engine).
    """

    ops: OpList
    start: np.ndarray
    end: np.ndarray
    order: np.ndarray
    rank_of: np.ndarray
    kind_of: np.ndarray
    events: int
    allocations: int
    ranks: int
    end_time: dict[int, float] = field(default_factory=dict)
    simpy_events: int = 0
    link_load: list[tuple[float, str, str, float]] = field(default_factory=list)  # (time, u, v, bytes/s)
    # kernels timed from a device profile outside its measured range: (device, kernel, dtype) -> axes
    extrapolated: dict[tuple[str, str, str], tuple[str, ...]] = field(default_factory=dict)
    # bytes of each send by op id (0 elsewhere), the engine's column kept: None, read off the ops
    send_bytes: np.ndarray | None = None
    # seconds each kernel ran longer than its duration because its rank's transfers held SMs (contention), by op
    # id; None: no transfer held any
    slowed: np.ndarray | None = None

    @property
    def makespan(self) -> float:
        return max(self.end_time.values(), default=0.0)  # each rank's last end: the timeline's latest end, at once

    @cached_property
    def timeline(self) -> list[Record]:
        """One :class:`Record` per op that ended, in (start, rank, op) order (built on first use, then kept)."""
        ops, start, end = self.ops, self.start, self.end
        out: list[Record] = []
        for lo in range(0, len(self.order), 1 << 16):  # op ids as Python ints a slice at a time, not all at once
            ids = self.order[lo:lo + (1 << 16)]
            out += [_new(Record, (op.rank, i, op.kind, op.name, a, b, op.nbytes, op.flops))
                    for i, a, b, op in zip(ids.tolist(), start[ids].tolist(), end[ids].tolist(), ops.take(ids),
                                           strict=True)]
        return out

    def ended(self, kinds: frozenset[str] | None = None, ranks: Collection[int] | None = None) -> np.ndarray:
        """Ids of the ops that ended, in timeline order: of ``kinds`` only, of ``ranks`` only, when given."""
        keep = None  # by op id: tables of the ranks and kinds wanted, read per op (np.isin would compare each op
        if ranks is not None:  # to each rank)
            wanted = np.zeros(self.ranks, dtype=bool)
            wanted[[r for r in ranks if 0 <= r < self.ranks]] = True
            keep = wanted[self.rank_of]
        if kinds is not None:
            kind = np.zeros(len(_KIND_INDEX), dtype=bool)
            kind[[_KIND_INDEX[k] for k in kinds]] = True
            keep = kind[self.kind_of] if keep is None else keep & kind[self.kind_of]
        return self.order if keep is None else self.order[keep[self.order]]

    def critical_rank(self) -> int:
        """The rank that finishes last (the lowest such rank on a tie); 0 when nothing ran."""
        if not self.end_time:
            return 0
        return max(self.end_time, key=lambda r: (self.end_time[r], -r))

    def op_ends(self) -> dict[int, float]:
        """End time of every op that ended, by op id."""
        return dict(zip(self.order.tolist(), self.end[self.order].tolist(), strict=True))

    def critical_split(self) -> tuple[float, float]:
        """(compute_s, comm_s) of the critical rank: its kernel time, and the rest of its latency (time waiting on
        transfers and other ranks that its compute did not hide)."""
        if not self.end_time:
            return 0.0, 0.0
        rank = self.critical_rank()
        ids = self.ended(COMPUTE_KINDS, (rank,))
        spans = self.end[ids] - self.start[ids]
        if self.slowed is not None:  # what contention added is time the transfers cost, not compute
            spans = spans - self.slowed[ids]
        compute = sum(spans.tolist())  # added in timeline order, as records were
        return compute, self.end_time[rank] - compute

    def bytes_sent(self) -> float:
        """Every byte every send moved."""
        ids = self.ended(_SENDS)
        if self.send_bytes is not None:  # the same floats, added in the same order, without a pass over the ops
            return ordered_sum(self.send_bytes[ids]) if len(ids) else 0  # (sum's 0 of no bytes)
        return sum(map(_NBYTES, map(self.ops.__getitem__, ids.tolist())))  # in timeline order


class _Run:
    """A schedule's columns for the compiled loop (:mod:`simulator.engine.eventcore`): what each op needs, computed
    once per distinct value (a kernel's duration per cost, a route per pair of ranks, weights per route and size)."""

    def __init__(self, schedule: Schedule, cluster: Cluster, record_links: bool = False) -> None:
        self.record_links = record_links
        self.sched = schedule
        # the ops as an OpList (a schedule whose ops were set to a plain list of tuples is read as one)
        self.ops = ops = schedule.ops if isinstance(schedule.ops, OpList) else OpList(schedule.ops)
        self.cluster = cluster
        self.place = schedule.placement_on(cluster.ranks)
        n = len(ops)
        if n >= 2**31 - 1:
            raise ValueError(f"a schedule of {n} ops: the engine takes fewer than 2^31")
        cols = ops.columns()
        self.specs = [cluster.specs.get(node) for node in self.place]  # rank -> device (shared by ranks of one kind)
        edges = link_table(cluster)
        self.edge_names = edges.names
        capacity = list(edges.capacity)  # the host resources add their own links
        self.hosts = HostResources(cluster, self.place, capacity)  # shared CPU cores and memory, if any
        self.capacity = np.array(capacity, dtype=float)
        # link id -> (nominal bytes/s, bandwidth by message size): links and host copies measured over sizes
        self.curves: dict[int, tuple[float, SizeCurve]] = dict(self.hosts.copy_curves)
        self.curves.update(edges.curves)
        self.extrapolated: dict[tuple[str, str, str], tuple[str, ...]] = {}
        self.kind_of = cols.kind  # each op's kind as an index into OP_KINDS (the result keeps it)
        self.ranks = cols.rank
        # ranks on shared host cores are host threads that issue their ops in program order
        threads = np.array([self.hosts.shares(r) for r in range(schedule.ranks)], dtype=bool)
        # a GPU posts its point-to-point ends and launches in stream order (after the kernels it issued before them);
        # dependents as a CSR array (op d's children are kids[first_kid[d]:first_kid[d + 1]], in op-id order, as they
        # were appended): a counting sort of the edges (simulator.schedule.colpass)
        counts, parents, _ = stream_ordered(cols.dep_count, cols.parents, cols.kind, cols.rank, cols.match, cols.coll,
                                            stream_ranks(schedule, self.specs, threads), schedule.p2p)
        self.kids, self.first_kid = dependents(counts, parents)
        self.pending = counts  # int32, counted down by the loop
        self.roots = np.flatnonzero(self.pending == 0)
        self.in_order = bool(threads.any())
        mine = np.flatnonzero(threads[self.ranks]) if self.in_order else np.zeros(0, np.int64)
        self.prog = mine[np.argsort(self.ranks[mine], kind="stable")]
        self.prog_start = np.concatenate(([0], np.cumsum(np.bincount(self.ranks[mine], minlength=schedule.ranks))
                                          )).astype(np.int64)
        self._durations(cols)
        launches = np.flatnonzero(self.kind_of == _KIND_INDEX["launch"])
        self.dur[launches] = np.fmax(cluster.collective_start_s, cols.floor[launches])  # max(), as floats
        self._transfers(cols)
        self._host_kernels(mine)

    def _durations(self, cols: Columns) -> None:
        """Each kernel's duration on its rank's device (roofline or profile), computed once per distinct cost (and
        kind of device), for the first op of each, in op order."""
        code, k = cols.cost, max(1, len(cols.cost_keys))  # a kernel's cost id; -1 on the other ops
        kinds: dict[int, int] = {}
        for spec in self.specs:
            kinds.setdefault(id(spec), len(kinds))
        if len(kinds) > 1:  # the cost on each kind of device
            spec_of = np.array([kinds[id(spec)] for spec in self.specs], dtype=np.int64)
            code = np.where(code >= 0, spec_of[self.ranks] * k + code, -1)
            k *= len(kinds)
        first = first_of(code, k)
        present = np.flatnonzero(first >= 0)
        seconds = np.zeros(k + 1)  # the last: the other ops' (code -1)
        for j in present[np.argsort(first[present])].tolist():
            op = self.ops[int(first[j])]
            seconds[j] = self._new_duration(self.specs[op.rank], op)
        wrong = present[~np.isfinite(seconds[present]) | (seconds[present] < 0)]
        if len(wrong):  # the first op of a bad cost
            j = int(wrong[np.argmin(first[wrong])])
            self._bad(self.ops[int(first[j])], f"lasts {seconds[j]} s on its device")
        self.dur = seconds[code]
        self.costs = (code, first, seconds)  # each op's cost id, its first op, its seconds: contention's rates

    @staticmethod
    def _bad(op: Op, what: str) -> NoReturn:
        raise ValueError(f"op {op.id} ({op.kind} {op.name!r} of rank {op.rank}) {what}")

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

    def _transfers(self, cols: Columns) -> None:
        """Each send's route (link ids, then the host cores its copies use), latency and weights per link."""
        ops, n = self.ops, len(self.ops)
        sends = np.flatnonzero(self.kind_of == _KIND_INDEX["send"])
        if cols.no_match >= 0:  # each end names the other (a schedule handed whole to extend is not checked)
            self._bad(ops[cols.no_match], "names no matching op")
        # the ends given as tuples name ends that name them back (a block's do by construction)
        loose = np.concatenate([np.zeros(0, np.int64), *cols.loose])
        loose_kind = self.kind_of[loose]
        loose_ends = [loose[loose_kind == _KIND_INDEX["send"]], loose[loose_kind == _KIND_INDEX["recv"]]]
        for ends in loose_ends:
            ids = cols.match[ends]
            if len(ids) and (ids.min() < 0 or ids.max() >= n):
                self._bad(ops[int(ends[np.argmax((ids < 0) | (ids >= n))])], "names a match outside the schedule")
        self.match = cols.match
        for ends, other in zip(loose_ends, ("recv", "send"), strict=True):
            mate = self.match[ends].astype(np.int64)
            wrong = (self.kind_of[mate] != _KIND_INDEX[other]) | (self.match[mate] != ends)
            if wrong.any():
                self._bad(ops[int(ends[np.argmax(wrong)])], "and its match do not name each other as send and recv")
        matches = self.match[sends].astype(np.int64)
        # the distinct (sender, receiver) pairs: one route each
        pair = self.ranks[sends].astype(np.int64) * self.sched.ranks + self.ranks[matches]
        p = self.sched.ranks
        if p * p <= max(1 << 22, 4 * len(pair)):  # few enough pairs of ranks to count them all
            codes, _, route_of = distinct_codes(pair, p * p)
        else:
            codes, route_of = np.unique(pair, return_inverse=True)
        del pair, matches
        distinct = [divmod(c, self.sched.ranks) for c in codes.tolist()]
        place = self.place
        starts, ids, latency = self.cluster.paths([(place[a], place[b]) for a, b in distinct])
        counts = np.diff(starts)
        if self.hosts.copies:  # a transfer's copies cross its hosts' cores after its route
            extra = [self.hosts.transfer(a, b) if k else () for (a, b), k in zip(distinct, counts.tolist(),
                                                                                  strict=True)]
            flat = [list(ids[lo:hi]) + list(more) for lo, hi, more in zip(starts[:-1].tolist(), starts[1:].tolist(),
                                                                            extra, strict=True)]
            counts = np.array([len(f) for f in flat], dtype=np.int64)
            ids = np.array([i for f in flat for i in f], dtype=np.int64)
        self.plinks = np.zeros((max(1, len(distinct)), max(1, int(counts.max(initial=0)))), dtype=np.int64)
        self.plinks[np.repeat(np.arange(len(distinct)), counts), spans(np.zeros_like(counts), counts)] = ids
        self.plen = np.zeros(max(1, len(distinct)), dtype=np.int64)
        self.plen[:len(distinct)] = counts
        self.plat = np.zeros(max(1, len(distinct)))
        self.plat[:len(distinct)] = latency
        self.path = np.full(n, -1, dtype=np.int32)
        self.path[sends] = route_of.reshape(-1)
        # a send's fields, 0 on every other op (a launch's floor, read for its duration, is cleared)
        self.nbytes, self.floor, self.rate_cap = cols.nbytes, cols.floor, cols.rate_cap
        self.floor[self.kind_of == _KIND_INDEX["launch"]] = 0.0
        self.coll = cols.coll.view(np.uint8)
        self.not_before = cols.not_before
        wrong = ~np.isfinite(self.not_before) | (self.not_before < 0)
        if wrong.any():
            op = ops[int(np.argmax(wrong))]
            self._bad(op, f"may not start before {op.not_before_s} s (a time >= 0)")
        # weights: a message's weight on each link of its route, where a link (or host copy) was measured by size
        self.wrow = np.full(n, -1, dtype=np.int32)
        rows: dict[tuple[int, float], int] = {}
        table: list[tuple[float, ...]] = []
        if self.curves:
            for i, size, r in zip(sends.tolist(), self.nbytes[sends].tolist(), route_of.reshape(-1).tolist(),
                                  strict=True):
                if size == 0:  # never injected: it ends after its latency
                    continue
                key = (r, size)
                if key not in rows:
                    weights = self._weights_of(tuple(self.plinks[r, :self.plen[r]].tolist()), size)
                    if weights is not None and not all(0.0 < w < math.inf for w in weights):
                        self._bad(ops[i], f"loads its route by {weights} (each must be finite and > 0)")
                    rows[key] = -1 if weights is None else len(table)
                    if weights is not None:
                        table.append(weights)
                self.wrow[i] = rows[key]
        self.wtab = np.ones((max(1, len(table)), self.plinks.shape[1]))
        for i, weights in enumerate(table):
            self.wtab[i, :len(weights)] = weights
        self._contention(sends, matches_of=self.match[sends].astype(np.int64))

    def _contention(self, sends: np.ndarray, matches_of: np.ndarray) -> None:
        """The SMs each end of a point-to-point transfer between two GPUs holds while in flight (NCCL's channels
        for its size on the communicator of the schedule's GPUs: :mod:`simulator.collectives.p2p`), the most a
        GPU rank's transfers hold at once (the communicator's P2P channels), and each kernel cost's rate with ``h``
        SMs held (its duration alone over its duration on the SMs left: :func:`contention_rates`). Transfers of a
        collective hold none here."""
        n, ranks = len(self.ops), self.sched.ranks
        code, first, seconds = self.costs
        del self.costs
        self.ctas = np.zeros(0, dtype=np.int32)  # (no transfer holds SMs: none of these are read)
        self.hmax = np.zeros(ranks, dtype=np.int64)
        self.srate = np.ones((len(seconds), 1))
        self.srow = np.zeros(0, dtype=np.int32)
        gpus = [r for r in range(ranks) if (spec := self.specs[r]) is not None and spec.sm_count > 0]
        if len(gpus) < 2:
            return
        gpu = np.zeros(ranks, dtype=bool)
        gpu[gpus] = True
        src, dst = self.ranks[sends], self.ranks[matches_of]
        node = {name: i for i, name in enumerate(dict.fromkeys(self.place))}
        where = np.array([node[name] for name in self.place], dtype=np.int64)  # each rank's device, as a number
        p2p = (self.coll[sends] == 0) & gpu[src] & gpu[dst] & (where[src] != where[dst])
        ids = sends[p2p]
        channels = p2p_channels(self.cluster, [self.place[r] for r in gpus]) if len(ids) else None
        if channels is None:  # (no point-to-point transfer between GPUs: no fabric worked out for nothing)
            return
        for r in gpus:
            self.hmax[r] = min(channels.channels, self.specs[r].sm_count - 1)  # type: ignore[union-attr]
        most = int(min(self.hmax.max(), channels.per_peer))  # the most SMs a GPU's transfers may hold
        rates = np.ones((len(seconds), most + 1))
        on_gpu = np.flatnonzero((first >= 0) & gpu[self.ranks[np.maximum(first, 0)]])
        for j in on_gpu.tolist():
            op = self.ops[int(first[j])]
            rates[j] = contention_rates(self.specs[op.rank], op, float(seconds[j]), most)  # type: ignore[arg-type]
        if (rates == 1.0).all():  # no kernel would run slower for SMs held (decode's are memory-bound): none held
            return
        held = channels.of_many(self.nbytes[ids]).astype(np.int32)
        self.ctas = np.zeros(n, dtype=np.int32)
        self.ctas[ids] = held
        self.ctas[matches_of[p2p]] = held
        self.srow = np.where(code >= 0, code, len(seconds) - 1).astype(np.int32)
        self.srate = rates

    def _weights_of(self, link_ids: tuple[int, ...], nbytes: float) -> tuple[float, ...] | None:
        """A message's weight on each link of its route: nominal / bandwidth at its size where the link (or host
        copy) was measured over sizes, else 1; None where no link of the route was."""
        curves = [self.curves.get(link) for link in link_ids]
        if not any(curves):
            return None
        return tuple(1.0 if c is None else c[1].weight(c[0], nbytes) for c in curves)

    def _host_kernels(self, mine: np.ndarray) -> None:
        """Kernels of host threads: the links each crosses (its rank's core, its host's cores, memory...), its size
        and weights, once per distinct (rank, cost)."""
        n, ops = len(self.ops), self.ops
        self.hrow = np.full(n, -1, dtype=np.int32)
        ids = [i for i in mine.tolist() if self.kind_of[i] <= _KIND_INDEX["merge"] and self.dur[i] > 0.0]
        rows: dict[tuple[Any, ...], int] = {}
        kernels: list[tuple[tuple[int, ...], float, tuple[float, ...] | None]] = []
        for i in ids:
            op = ops[i]
            key = (op.rank, _COST(op), float(self.dur[i]))
            if key not in rows:
                rows[key] = len(kernels)
                links, work, weights = self.hosts.kernel(op, float(self.dur[i]))
                if weights is not None and not all(0.0 < w < math.inf for w in weights):
                    self._bad(op, f"loads its host links by {weights} (each must be finite and > 0)")
                kernels.append((links, work, weights))
            self.hrow[i] = rows[key]
        width = max([1, *(len(links) for links, _, _ in kernels)])
        m = max(1, len(kernels))
        self.hlinks = np.zeros((m, width), dtype=np.int64)
        self.hlen = np.zeros(m, dtype=np.int64)
        self.hwork = np.zeros(m)
        self.hwts = np.ones((m, width))
        self.hweighted = np.zeros(m, dtype=np.uint8)
        for i, (links, work, weights) in enumerate(kernels):
            self.hlinks[i, :len(links)] = links
            self.hlen[i] = len(links)
            self.hwork[i] = work
            if weights is not None:
                self.hwts[i, :len(weights)] = weights
                self.hweighted[i] = 1

    def state(self, dur: np.ndarray | None = None, nbytes: np.ndarray | None = None,
              pending: np.ndarray | None = None) -> Any:
        """A compiled loop's state over these columns (``dur``, ``nbytes``, ``pending``: others in their place, of
        the same shapes and types: a trial with varied durations, :mod:`simulator.engine.trials`; the loop counts
        ``pending`` down), seeded with the roots."""
        state = eventcore.new_state(
            self.kind_of, self.ranks, self.match, self.path, self.wrow, self.hrow, self.coll,
            self.pending if pending is None else pending, self.dur if dur is None else dur, self.not_before,
            self.floor, self.nbytes if nbytes is None else nbytes, self.rate_cap, self.kids, self.first_kid,
            self.ctas, self.srow, self.srate, self.hmax, self.prog, self.prog_start, self.plinks, self.plen, self.plat,
            self.wtab, self.hlinks, self.hlen, self.hwork, self.hwts, self.hweighted, self.capacity,
            self.cluster.message_overhead_s, self.cluster.comm_overhead_s, self.in_order,
            bool(self.sched.program_order), self.record_links,
            len(self.edge_names))
        eventcore.seed(state, self.roots)
        return state

    def run(self) -> SimResult:
        ops = self.ops
        state = self.state()
        send_bytes = self.nbytes  # kept by the result (bytes_sent)
        dur = self.dur if len(self.ctas) else None  # with contention: what each kernel would have taken alone
        for name in _COLUMNS:  # held by the state now: freed with it, before the results' arrays are made
            delattr(self, name)
        while not eventcore.run(state, CALLBACKS_PER_CALL):  # back in Python between calls: an interrupt lands
            pass
        starts, ends, events, instants, allocations, nrec, flags = eventcore.results(state)
        link_load: list[tuple[float, str, str, float]] = []
        if nrec:
            times, links, loads = eventcore.records(state)
            names = self.edge_names
            link_load = [(t, *names[link], v) for t, link, v in zip(times.tolist(), links.tolist(), loads.tolist(),
                                                                    strict=True)]
        del state
        if np.isnan(starts).any():
            unfinished = np.flatnonzero(np.isnan(starts))[:10].tolist()
            raise RuntimeError(f"schedule deadlocked: ops {unfinished} never started")
        ranks = self.ranks
        ids = np.flatnonzero(~np.isnan(ends))  # started but never ended: not on the timeline
        last, seen = group_max(ranks[ids], ends[ids], self.sched.ranks)
        end_time = {r: float(last[r]) for r in np.flatnonzero(seen).tolist()}
        order = timeline_order(starts, ranks, ids, self.sched.ranks)  # the timeline's (start, rank, op) order
        return SimResult(ops, starts, ends, order, ranks.astype(np.int64), self.kind_of, int(events), int(allocations),
                         self.sched.ranks, end_time, int(instants), link_load, self.extrapolated, send_bytes,
                         None if dur is None else slowed_by_contention(starts, ends, dur,
                                                                       (flags & eventcore.F_SLOWED) != 0))


def stream_ranks(schedule: Schedule, specs: list[DeviceSpec | None], threads: np.ndarray) -> np.ndarray:
    """Which ranks post their point-to-point ends and launch their collectives in stream order: the GPUs (a device
    with SMs) that are not host threads (those issue every op in program order already), where the schedule's op
    order is a program."""
    gpu = np.array([spec is not None and spec.sm_count > 0 for spec in specs], dtype=bool)
    return gpu & ~threads & schedule.program_order


def contention_rates(spec: DeviceSpec, op: Op, seconds: float, most: int) -> np.ndarray:
    """A kernel's rate (its duration alone over its duration with ``h`` of its GPU's SMs held:
    :func:`simulator.cluster.devices.duration_with_sms_held`) for ``h`` = 0 .. ``most``, never above 1; 1 where it
    takes no time. Beyond its GPU's SMs but one (more than its rank ever holds: ``hmax``) the last rate repeats."""
    rates = np.ones(most + 1)
    top = min(most, spec.sm_count - 1)
    if seconds > 0:
        for h in range(1, top + 1):
            rates[h] = seconds / duration_with_sms_held(spec, h, op.flops, op.nbytes, op.dtype, op.fn, op.dims,
                                                        op.fused)
    if 0 <= top < most:
        rates[top + 1:] = rates[top]
    return np.minimum(rates, 1.0)


def slowed_by_contention(start: np.ndarray, end: np.ndarray, dur: np.ndarray, slowed: np.ndarray) -> np.ndarray:
    """Seconds each kernel that ran slower than alone for a while (``slowed``) ran past its duration (0 on the
    other ops): the time transfers holding its rank's SMs added (:attr:`SimResult.slowed`)."""
    out = np.zeros(len(start))
    out[slowed] = np.maximum(end[slowed] - start[slowed] - dur[slowed], 0.0)
    return out


def simulate(schedule: Schedule, cluster: Cluster, record_links: bool = False) -> SimResult:
    """Run ``schedule`` on ``cluster`` in simulated time; returns the timeline and event counts.

    ``record_links`` also records each link's load (bytes/s) whenever it changes (for traces).
    """
    with gc_paused():
        return _Run(schedule, cluster, record_links).run()
