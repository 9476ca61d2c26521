"""Schedules as plain data: per-rank ops with explicit dependencies, sizes and buffers.

An algorithm builds a :class:`Schedule`; executors (the engine, the numeric executor, the real
``torch.distributed`` runner) run it. No simpy here: a schedule can be printed, tested and exported on its own.
``Schedule.ops`` reads as a list of :class:`Op`; the many ops of one step appended at once
(:meth:`Schedule.add_transfers`, :meth:`Schedule.add_computes`, :meth:`Schedule.add_kernel_step`) are held as one
block of columns (:mod:`simulator.schedule.oplist`), their tuples made when read, so that a ring of a thousand
ranks costs tens of bytes an op and the engine reads its columns directly.

Op kinds:

* ``compute`` / ``merge``: a kernel on the rank's device (roofline time from ``flops`` and ``nbytes``; no launch
  overhead when ``fused``, i.e. a reduction done inside a communication kernel, as NCCL does);
* ``launch``: the start of a communication operation (one NCCL kernel) on a rank: takes the cluster's
  ``comm_overhead``, off the compute stream. Collectives begin with one per rank; a transfer outside any
  collective is a communication operation of its own and pays ``comm_overhead`` itself;
* ``send`` / ``recv``: the two ends of one point-to-point transfer of ``nbytes`` (``peer`` is the other rank,
  ``match`` the id of the other end). A transfer starts when both ends are ready (rendezvous, as NCCL send/recv)
  and completes both ends when the last byte arrives.

An op becomes ready when all of its ``deps`` (op ids) are done and the clock has reached ``not_before_s``. Compute
ops of one rank run one at a time in the order they become ready (one compute stream); transfers run
concurrently with compute, which is how overlap is expressed. Deps may only name earlier ops, so every schedule
is a DAG by construction, and op-id order is a valid serial execution order.

Data semantics, for the numeric executor and real runners: a compute op applies the kernel ``fn`` (one table,
:mod:`simulator.kernels.table`) to the rank's buffers ``args`` and writes buffer ``out``; a send reads buffers ``args``
(the element slice ``lo:hi`` of flat buffers when ``hi >= 0``) and its recv writes them under the recv's ``args``
names (into slice ``lo:hi`` of the buffers it already holds when ``into``). A launch's ``fn``, ``redop`` and
``root`` name its collective; ``coll`` tags every op of one collective. Every field has one meaning: ``peer`` is
a transfer's other end, nothing else. Memory: ``alloc`` (name, bytes) pairs are allocated when the op starts and
``free`` names released when it ends; ``Schedule.initial`` lists each rank's buffers at t = 0.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from simulator.schedule.op import (
    COMPUTE_KINDS,
    OP_KINDS,
    STREAMED,
    Op,
    compute_op,
    launch_op,
    recv_of,
    recv_op,
    send_op,
)
from simulator.schedule.oplist import ComputeBlock, Indexed, OpBlock, OpList, TransferBlock, csr, indexed

__all__ = ["COMPUTE_KINDS", "OP_KINDS", "STREAMED", "Op", "Schedule", "fused_reduce_op", "transfer_ops"]

_ID, _RANK, _DEPS = operator.attrgetter("id"), operator.attrgetter("rank"), operator.attrgetter("deps")


def _tuple(items: Iterable[Any]) -> tuple[Any, ...]:
    return items if type(items) is tuple else tuple(items)


def _earlier(deps: Sequence[tuple[int, ...]], n: int) -> bool:
    """Whether every id in ``deps`` names one of the ``n`` ops already there (min and max in C, for large steps)."""
    named = [d for d in deps if d]
    return not named or (min(map(min, named)) >= 0 and max(map(max, named)) < n)


def _indexes(which: Sequence[int] | np.ndarray, n: int, what: str) -> np.ndarray:
    """Indexes into a table of ``n`` (integers in 0..n-1), as an array."""
    idx = np.asarray(which)
    if len(idx) and (idx.dtype.kind not in "iu" or idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"{what} index outside the table of {n}")
    return idx.astype(np.int64, copy=False)


def _earlier_flat(ids: np.ndarray, n: int) -> bool:
    """Whether every id in ``ids`` names one of the ``n`` ops already there."""
    return not len(ids) or (int(ids.min()) >= 0 and int(ids.max()) < n)


def transfer_ops(sid: int, src: int, dst: int, size: float, name: str, send_deps: tuple[int, ...],
                 recv_deps: tuple[int, ...], args: tuple[str, ...], dst_args: tuple[str, ...], lo: int, hi: int,
                 coll: str, into: bool, floor_s: float, rate_cap: float, not_before_s: float = 0.0,
                 free_src: tuple[str, ...] = (), alloc: tuple[tuple[str, float], ...] = ()) -> tuple[Op, Op]:
    """The send (id ``sid``) and recv (:func:`~simulator.schedule.op.recv_of` ``sid``) of one transfer (``size`` and
    ``rate_cap`` floats), unchecked: what :meth:`Schedule.add_transfer` appends once it has checked its arguments,
    and what a builder that hands a whole collective to :meth:`Schedule.extend` builds."""
    rid = recv_of(sid)
    return (send_op(sid, src, name, send_deps, size, dst, args, lo, hi, free_src, coll, floor_s, rate_cap,
                    not_before_s),
            recv_op(rid, dst, name, recv_deps, size, src, dst_args, lo, hi, alloc, coll, into, not_before_s))


def fused_reduce_op(oid: int, rank: int, name: str, flops: float, nbytes: float, dtype: str, deps: tuple[int, ...],
                    fn: str, out: str, args: tuple[str, ...], lo: int, hi: int, coll: str) -> Op:
    """The op :meth:`Schedule.add_compute` appends for a fused reduction (``fused=True``), unchecked."""
    return compute_op(oid, rank, name, deps, flops, nbytes, dtype, fn, out, args, lo, hi, fused=True, coll=coll)


@dataclass
class Schedule:
    """Per-rank ops. ``placement[r]`` names the cluster node of rank ``r`` (default: the cluster's ranks).

    ``initial[r]`` maps buffer name -> bytes held by rank ``r`` at t = 0; ``meta`` carries what executors need
    to give buffers values (e.g. ``shards``: the (start, end) context positions of each rank's KV shard).

    ``program_order``: each rank's ops, in op order, are the order its program issues them, so a GPU rank posts its
    point-to-point ends and launches its collectives in stream order (:mod:`simulator.engine.core`); ``False`` for a
    schedule whose op order is not a program (a timeline standing for a timing that posts every receive ahead: the
    training pipeline's). ``p2p``: how such a rank's sends and receives outside collectives map to NCCL kernels and
    streams (:data:`simulator.schedule.op.P2P_STREAMS`): ``"batched"``, the ends it issues back to back are one
    kernel and a rank's kernels run one after another on one stream; ``"per-peer"``, each end is a kernel on the
    stream of its pair of ranks.
    """

    ranks: int
    ops: OpList = field(default_factory=OpList)
    placement: tuple[str, ...] | None = None
    name: str = ""
    initial: dict[int, dict[str, float]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    program_order: bool = True
    p2p: str = "batched"
    # kernel tables given to add_kernel_step, by id: (the table, its entries as (str, float, float, tuple)), so that
    # the steps of a lockstep schedule share one (and the engine looks its costs up once)
    _tables: dict[int, tuple[Sequence[Any], list[Any]]] = field(default_factory=dict, init=False, repr=False,
                                                                 compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.ops, OpList):  # ops given as tuples
            self.ops = OpList(self.ops)

    def _check(self, rank: int, deps: Iterable[int]) -> tuple[int, ...]:
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} out of range 0..{self.ranks - 1}")
        deps_t = deps if type(deps) is tuple else tuple(deps)
        n = len(self.ops)
        for d in deps_t:
            if not 0 <= d < n:
                raise ValueError(f"dependency {d} does not name an earlier op")
        return deps_t

    def add_compute(self, rank: int, name: str, *, flops: float = 0.0, nbytes: float = 0.0,
                    dtype: str = "fp32", deps: Iterable[int] = (), kind: str = "compute",
                    not_before_s: float = 0.0, fn: str = "", out: str = "", args: Sequence[str] = (),
                    lo: int = 0, hi: int = -1, alloc: Sequence[tuple[str, float]] = (), free: Sequence[str] = (),
                    fused: bool = False, coll: str = "", dims: tuple[float, ...] = ()) -> int:
        """Append a compute (or ``merge``) op on ``rank``; returns its id. ``dims``: the kernel's shape on its
        profile's axes, for devices whose kernels were profiled (:mod:`simulator.kernels.profiles`)."""
        if kind not in COMPUTE_KINDS:
            raise ValueError(f"kind must be one of {sorted(COMPUTE_KINDS)}, got {kind!r}")
        oid = len(self.ops)
        self.ops.append(compute_op(oid, rank, name, self._check(rank, deps), float(flops), float(nbytes), dtype, fn,
                                   out, _tuple(args), lo, hi, _tuple(alloc), _tuple(free), fused, coll, kind,
                                   not_before_s, dims))
        return oid

    def add_launch(self, rank: int, name: str, *, deps: Iterable[int] = (), coll: str = "", fn: str = "",
                   out: str = "", root: int | None = None, redop: str = "", floor_s: float = 0.0) -> int:
        """Append the start of a communication operation on ``rank`` (takes the cluster's ``comm_overhead``).

        For a collective, ``fn`` names it (``allreduce``, ``reduce``, ``broadcast``...), ``redop`` its reduction
        (``sum``, ``max``), ``out`` its buffer and ``root`` the root of a reduce or broadcast, so that a real runner
        can issue it as one native collective. ``floor_s``: the launch takes at least this long (a protocol's base
        latency).
        """
        oid = len(self.ops)
        self.ops.append(launch_op(oid, rank, name, self._check(rank, deps), fn, out, coll, root, redop, floor_s))
        return oid

    def add_transfer(self, src: int, dst: int, nbytes: float, name: str, *, send_deps: Iterable[int] = (),
                     recv_deps: Iterable[int] = (), not_before_s: float = 0.0, args: Sequence[str] = (),
                     dst_args: Sequence[str] | None = None, lo: int = 0, hi: int = -1,
                     alloc: Sequence[tuple[str, float]] = (), free_src: Sequence[str] = (),
                     coll: str = "", into: bool = False, floor_s: float = 0.0,
                     rate_cap: float = 0.0) -> tuple[int, int]:
        """Append a matched send (on ``src``) and recv (on ``dst``); returns ``(send_id, recv_id)``.

        The send reads buffers ``args`` (slice ``lo:hi``); the recv writes them as ``dst_args`` (default: the same
        names; ``into=True`` writes into slice ``lo:hi`` of existing flat buffers) and allocates ``alloc`` on
        ``dst``; ``free_src`` buffers are released on ``src`` once sent. ``floor_s``: the transfer's fixed latency
        (message overhead + route latency) is at least this (a protocol's per-hop latency); :data:`STREAMED`: it
        has none (a pipeline step after its connection's first: NCCL keeps 8 steps in flight); ``rate_cap``: the
        transfer's bytes never flow faster than this (bytes/s; 0: only the links limit it).
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must not be negative, got {nbytes}")
        if src == dst:
            raise ValueError(f"a transfer needs two different ranks, got {src} twice")
        sd, rd = self._check(src, send_deps), self._check(dst, recv_deps)
        sargs = _tuple(args)
        dargs = sargs if dst_args is None else _tuple(dst_args)
        if len(dargs) != len(sargs):
            raise ValueError("dst_args must name as many buffers as args")
        sid = len(self.ops)
        self.ops.extend(transfer_ops(sid, src, dst, float(nbytes), name, sd, rd, sargs, dargs, lo, hi, coll, into,
                                     floor_s, float(rate_cap), not_before_s, _tuple(free_src), _tuple(alloc)))
        return sid, recv_of(sid)

    def add_transfers(self, src: Sequence[int] | np.ndarray, dst: Sequence[int] | np.ndarray,
                      nbytes: Sequence[float] | np.ndarray, name: Sequence[str] | Indexed,
                      send_deps: Sequence[tuple[int, ...]] | np.ndarray,
                      recv_deps: Sequence[tuple[int, ...]] | np.ndarray, *, args: tuple[str, ...] = (),
                      dst_args: tuple[str, ...] | None = None, alloc: tuple[tuple[str, float], ...] = (),
                      coll: str = "") -> int:
        """Many transfers at once (one step of a collective or a ring), the k-th from ``src[k]`` to ``dst[k]``:
        the same ops as :meth:`add_transfer` called for each k in order, with the options shared; returns the
        first send's id (transfer k's send is ``first + 2k``, its recv ``first + 2k + 1``).

        Held as one block of columns (:mod:`simulator.schedule.oplist`): ranks and sizes may be arrays, ``name`` an
        :class:`~simulator.schedule.oplist.Indexed` table, each end's deps an (m, k) array padded with -1."""
        m = len(src)
        if not len(dst) == len(nbytes) == len(name.which if isinstance(name, Indexed) else name) == len(
                send_deps) == len(recv_deps) == m:
            raise ValueError("add_transfers needs one dst, size, name and deps of each end per transfer")
        first = len(self.ops)
        dargs = args if dst_args is None else dst_args
        if len(dargs) != len(args):
            raise ValueError("dst_args must name as many buffers as args")
        s, d = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        size = np.asarray(nbytes, dtype=float)
        (ss, sf), (rs, rf) = csr(send_deps), csr(recv_deps)
        if m and (min(s.min(), d.min()) < 0 or max(s.max(), d.max()) >= self.ranks or size.min() < 0
                  or (s == d).any() or not _earlier_flat(sf, first) or not _earlier_flat(rf, first)):
            for k in range(m):  # the first bad one raises add_transfer's error (nothing is added)
                if size[k] < 0:
                    raise ValueError(f"nbytes must not be negative, got {nbytes[k]}")
                if s[k] == d[k]:
                    raise ValueError(f"a transfer needs two different ranks, got {src[k]} twice")
                self._check(int(s[k]), sf[ss[k]:ss[k + 1]].tolist())
                self._check(int(d[k]), rf[rs[k]:rs[k + 1]].tolist())
        names = indexed(name)
        picks = _indexes(names.which, len(names.table), "a name")
        self.ops.add_block(TransferBlock(first, s, d, size, names.table, picks, ss, sf, rs, rf, args, dargs, alloc,
                                         coll))
        return first

    def add_computes(self, rank: Sequence[int], name: Sequence[str], flops: Sequence[float],
                     nbytes: Sequence[float], dims: Sequence[tuple[float, ...]], deps: Sequence[tuple[int, ...]], *,
                     dtype: str = "fp32", fn: str = "", out: str = "", args: tuple[str, ...] = (),
                     alloc: tuple[tuple[str, float], ...] = (), fused: bool = False) -> int:
        """Many compute ops at once, the k-th on ``rank[k]``: the same ops as :meth:`add_compute` called for each k
        in order, with the options shared; returns the first one's id (the k-th is ``first + k``)."""
        m = len(rank)
        if not len(name) == len(flops) == len(nbytes) == len(dims) == len(deps) == m:
            raise ValueError("add_computes needs one name, cost, dims and deps per op")
        table = list(zip(name, map(float, flops), map(float, nbytes), dims, strict=True))  # each op's, as given
        return self._compute_block("add_computes", rank, table, np.arange(m), deps, dtype, fn, out, args, alloc,
                                   fused)

    def add_kernel_step(self, rank: Sequence[int] | np.ndarray, kernels: Indexed,
                        deps: Sequence[tuple[int, ...]] | np.ndarray, *, dtype: str = "fp32", fn: str = "",
                        out: str = "", args: tuple[str, ...] = (),
                        alloc: tuple[tuple[str, float], ...] | Indexed = (), fused: bool = False) -> int:
        """:meth:`add_computes` with each op's kernel given as an index into a table of (name, FLOPs, bytes, dims)
        (a step of a lockstep schedule: few distinct kernels), its deps as tuples or an (m, k) array padded with -1
        and its allocations shared or, as an :class:`~simulator.schedule.oplist.Indexed`, one of a table; returns the
        first
        op's id. A kernel table is read once per schedule (its entries as str, float, float, tuple) and may only
        grow, appended to, between steps."""
        known = self._tables.get(id(kernels.table))
        if known is None or known[0] is not kernels.table:  # a table read once, then its new entries
            known = self._tables[id(kernels.table)] = (kernels.table, [])
        table = known[1]
        if len(kernels.table) < len(table):
            raise ValueError("a kernel table given to an earlier step may only grow")
        table += [(str(k[0]), float(k[1]), float(k[2]), tuple(k[3])) for k in kernels.table[len(table):]]
        return self._compute_block("add_kernel_step", rank, table, kernels.which, deps, dtype, fn, out, args, alloc,
                                   fused)

    def _compute_block(self, caller: str, rank: Sequence[int] | np.ndarray, table: list[Any], which: np.ndarray,
                       deps: Sequence[tuple[int, ...]] | np.ndarray, dtype: str, fn: str, out: str,
                       args: tuple[str, ...], alloc: tuple[tuple[str, float], ...] | Indexed, fused: bool) -> int:
        """Append compute ops ``table[which[k]]`` on ``rank[k]`` as one block, once every argument is checked."""
        r = np.asarray(rank, dtype=np.int64)
        m = len(r)
        if len(which) != m or len(deps) != m or (isinstance(alloc, Indexed) and len(alloc.which) != m):
            raise ValueError(f"{caller} needs one kernel, deps and allocation per op")
        first = len(self.ops)
        starts, flat = csr(deps)
        if m and (r.min() < 0 or r.max() >= self.ranks or not _earlier_flat(flat, first)):
            for k in range(m):  # find the first bad one: _check raises its error
                self._check(int(r[k]), flat[starts[k]:starts[k + 1]].tolist())
        picks = _indexes(which, len(table), "a kernel")
        allocs, alloc_which = ((alloc.table, _indexes(alloc.which, len(alloc.table), "an allocation"))
                               if isinstance(alloc, Indexed) else ((alloc,), None))
        self.ops.add_block(ComputeBlock(first, r, picks, table, starts, flat, dtype, fn, out, args, allocs, fused,
                                        alloc_which))
        return first

    def add_ops(self, kind: np.ndarray, rank: np.ndarray,
                deps: tuple[np.ndarray, np.ndarray] | Sequence[tuple[int, ...]] | np.ndarray, match: np.ndarray,
                **fields: Any) -> int:
        """Many ops of any kinds at once, in the order given (a step whose kinds interleave: a tree's send up, its
        receive, the parent's reduction, rank after rank); returns the first op's id (the k-th is ``first + k``).

        ``kind``: indexes into :data:`OP_KINDS`; ``deps``: CSR ``(starts, flat)`` (two arrays), one tuple per op, or
        an (m, k) array padded with -1, each naming earlier ops (of this call too); ``match``: a send's or recv's
        other end (an op of this call), -1 on the other kinds. Every other :class:`Op` field by keyword: one value
        for all (a tuple for a tuple field), an array (one per op) or an :class:`~simulator.schedule.oplist.Indexed`
        (one of
        a table per op); the rest keep their defaults. Held as one block of columns
        (:class:`~simulator.schedule.oplist.OpBlock`), checked before it is appended."""
        if isinstance(deps, tuple) and len(deps) == 2 and all(isinstance(x, np.ndarray) for x in deps):
            starts, flat = deps[0], deps[1]  # CSR
        else:  # one tuple per op (a tuple of tuples is that, not CSR) or a padded array
            starts, flat = csr(cast("Sequence[tuple[int, ...]] | np.ndarray", deps))
        columns = {"kind": np.asarray(kind), "rank": np.asarray(rank), "deps": np.asarray(flat),
                   "deps' starts": np.asarray(starts), "match": np.asarray(match)}
        for what, col in columns.items():
            if len(col) and col.dtype.kind not in "iu":
                raise ValueError(f"add_ops: {what} must be integers, not {col.dtype}")
        if len(columns["kind"]) and (columns["kind"].min() < 0 or columns["kind"].max() >= len(OP_KINDS)):
            raise ValueError(f"add_ops: a kind outside 0..{len(OP_KINDS) - 1} (indexes into {OP_KINDS})")
        block = OpBlock(len(self.ops), columns["kind"].astype(np.uint8), columns["rank"].astype(np.int64),
                        columns["deps' starts"].astype(np.int64), columns["deps"].astype(np.int64),
                        columns["match"].astype(np.int64), fields)
        r = block.rank
        if len(r) and (r.min() < 0 or r.max() >= self.ranks):
            raise ValueError(f"rank {int(r[(r < 0) | (r >= self.ranks)][0])} out of range 0..{self.ranks - 1}")
        self.ops.add_block(block)  # checks the rest (OpBlock.check)
        return block.first

    def extend(self, ops: Sequence[Op]) -> None:
        """Append ops built whole (:func:`transfer_ops`, :func:`fused_reduce_op`): their ids must follow on, their
        ranks and peers exist and their deps name ops before the last of them (checked in bulk: a dep on a later op
        of the same batch is the builder's to avoid)."""
        if not ops:
            return
        first = len(self.ops)
        if list(map(_ID, ops)) != list(range(first, first + len(ops))):
            raise ValueError(f"ops must have the ids {first}.. in order")
        ranks = list(map(_RANK, ops))  # a transfer's peer is its other end's rank
        if min(ranks) < 0 or max(ranks) >= self.ranks:
            raise ValueError(f"a rank out of range 0..{self.ranks - 1}")
        if not _earlier(list(map(_DEPS, ops)), first + len(ops)):
            raise ValueError("a dependency does not name an op of the schedule")
        self.ops.extend(ops)

    @staticmethod
    def combine(parts: Sequence[tuple[Schedule, Sequence[str]]], name: str = "") -> Schedule:
        """Schedules on disjoint ranks side by side, as one (each part's ranks placed on the given nodes; their
        ``p2p`` the same)."""
        p2p = {s.p2p for s, _ in parts}
        if len(p2p) > 1:
            raise ValueError(f"parts with different p2p streams ({', '.join(sorted(p2p))}) cannot be combined")
        out = Schedule(sum(s.ranks for s, _ in parts), name=name, placement=tuple(n for _, pl in parts for n in pl),
                       p2p=p2p.pop() if p2p else "batched")
        rank_off = id_off = 0
        outputs = []
        for sched, place in parts:
            if len(place) != sched.ranks:
                raise ValueError(f"placement of {len(place)} nodes for a schedule of {sched.ranks} ranks")
            out.ops.append_shifted(sched.ops, id_off, rank_off)  # ids, deps, matches, ranks, peers, roots moved
            for r, bufs in sched.initial.items():
                out.initial[r + rank_off] = dict(bufs)
            outputs += [(r + rank_off, b) for r, b in sched.meta.get("outputs", [])]
            rank_off += sched.ranks
            id_off += len(sched.ops)
        out.meta["outputs"] = outputs
        return out

    def rank_ops(self, rank: int) -> list[Op]:
        """The ops of ``rank`` in program order."""
        return [op for op in self.ops if op.rank == rank]

    def placement_on(self, cluster_ranks: Sequence[str]) -> tuple[str, ...]:
        """Node name of every rank on a cluster whose GPUs are ``cluster_ranks``."""
        if self.placement is not None:
            return self.placement
        if self.ranks > len(cluster_ranks):
            raise ValueError(f"schedule needs {self.ranks} ranks; the cluster has {len(cluster_ranks)} GPUs")
        return tuple(cluster_ranks[: self.ranks])

    def __str__(self) -> str:
        lines = [f"Schedule {self.name or ''} ({self.ranks} ranks, {len(self.ops)} ops)".replace("  ", " ")]
        for r in range(self.ranks):
            lines.append(f"rank {r}:")
            for op in self.rank_ops(r):
                size = f"{op.flops:.4g} flop " if op.flops else ""
                size += f"{op.nbytes:.4g} B" if op.nbytes or op.kind in ("send", "recv") else ""
                peer = f" {'->' if op.kind == 'send' else '<-'} {op.peer}" if op.peer is not None else ""
                deps = f" after {list(op.deps)}" if op.deps else ""
                lines.append(f"  #{op.id} {op.kind} {op.name}{peer} {size}{deps}".rstrip())
        return "\n".join(lines)
