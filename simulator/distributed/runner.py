"""Execute one rank of a schedule for real: compute ops call the merge core on torch tensors, transfers become
``isend``/``irecv`` and, with ``collectives="native"``, each collective becomes one ``dist.all_reduce`` (MAX then
SUM for ``tree``, as in the Tree Attention paper's reference code).

:class:`RankRunner` runs decode schedules (on the numeric :class:`~simulator.numeric.decode.Executor`'s buffers),
:class:`PrefillRankRunner` prefill and training schedules (on the
:class:`~simulator.numeric.prefill.PrefillExecutor`'s row blocks); both are the same transfer logic
(:class:`_RealTransfers`) over the executor of their kind, and messages are sized and unpacked from the payload
rules (:mod:`simulator.kernels.payload`), never by executing anything twice. Prefill schedules run their collectives
(all-gather of pieces, reduce-scatter, all-to-all) as the schedule's own sends (``collectives="decomposed"``).

The rank walks its own ops in program order. Sends and receives are posted without blocking; a receive is waited
for (and unpacked) when an op that depends on it runs, a send when an op depends on its buffer being free, and
everything at the end. With the schedule's ``p2p`` ``"batched"`` (the default) the ends a rank issues back to back
are posted together, one ``dist.batch_isend_irecv`` (on NCCL one group, one kernel on the process group's stream),
the same groups the engine orders (:func:`simulator.schedule.colpass.p2p_batches`); with ``"per-peer"`` each end
is its own ``isend`` or ``irecv`` (on NCCL a communicator, and a stream, per pair of ranks). Gloo runs both as
separate sends and receives. Messages are tagged with the send's op id, so that several in flight between one pair of
ranks cannot be confused. This cannot deadlock: op ids give every rank the same global order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from simulator.kernels.decode import Descriptor, KVShard
from simulator.kernels.payload import Shape, component_shapes, message_elements
from simulator.kernels.prefill import Rows, StateRows
from simulator.merge import PartialState
from simulator.numeric.decode import Executor, Inputs
from simulator.numeric.prefill import PrefillExecutor, PrefillInputs
from simulator.schedule.colpass import p2p_batches
from simulator.schedule.core import Op, Schedule
from simulator.schedule.oplist import OpList
from simulator.workloads.layouts import positions
from simulator.workloads.shape import DecodeShape

__all__ = ["PrefillRankRunner", "RankRunner"]

_REDUCE = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def _pack(values: tuple[Any, ...]) -> torch.Tensor:
    """One flat message; a packed KV shard or a contiguous array goes as it is (no copy)."""
    if len(values) == 1:
        (value,) = values
        if isinstance(value, KVShard) and value.packed is not None and value.packed.is_contiguous():
            return value.packed.reshape(-1)
        if isinstance(value, torch.Tensor) and value.is_contiguous():
            return value.reshape(-1)
    parts: list[Any] = []
    for value in values:
        if isinstance(value, PartialState):
            parts += [value.o, value.l, value.m]
        elif isinstance(value, KVShard):
            parts += [value.k, value.v]
        elif isinstance(value, Rows):
            parts += list(value.arrays)
        elif isinstance(value, StateRows):
            parts += [value.state.o, value.state.l, value.state.m]
        else:
            parts.append(value)
    return torch.cat([p.reshape(-1) for p in parts]) if parts else torch.empty(0)


def _unpack(flat: torch.Tensor, descs: list[Descriptor], shape: Shape) -> tuple[Any, ...]:
    out: list[Any] = []
    at = 0
    for desc in descs:
        arrays = []
        for s in component_shapes(desc, shape):
            n = math.prod(s)
            arrays.append(flat[at:at + n].reshape(s))
            at += n
        if desc[0] == "state":
            out.append(PartialState(*arrays))
        elif desc[0] == "kv":
            n = arrays[0].numel()
            packed = flat[at - 2 * n:at].reshape(2, *arrays[0].shape)
            out.append(KVShard.from_packed(packed, desc[1], desc[2]))
        elif desc[0] == "rows":
            out.append(Rows(tuple(arrays), positions(desc[5]), desc[4]))
        elif desc[0] == "state-rows":
            out.append(StateRows(PartialState(*arrays), positions(desc[4]), desc[3]))
        else:
            out.append(arrays[0])
    return tuple(out)


def _tag(op: Op) -> int:
    """A transfer's tag, on both ends: its send's op id."""
    tag = op.id if op.kind == "send" else op.match
    assert tag is not None
    return tag


class _RealTransfers:
    """The real half of a rank runner: transfers as ``isend``/``irecv``, native collectives, the walk of a rank's
    ops. Mixed into an executor, which holds the buffers and runs the compute ops (:meth:`execute`)."""

    # the executor's (declared only: the executor after this class in the MRO defines them)
    buf: list[dict[str, Any]]
    inp: Any
    execute: Callable[[Op], None]
    payload: Callable[[Op], tuple[Any, ...]]
    store: Callable[[Op, tuple[Any, ...]], None]

    def _setup(self, sched: Schedule, rank: int, shape: Shape, layouts: dict[int, list[Descriptor]],
               collectives: str, device: torch.device | None, pool: dict[Any, torch.Tensor] | None,
               peers: Sequence[int] | None = None) -> None:
        if collectives not in ("native", "decomposed"):
            raise ValueError(f"collectives must be native or decomposed, got {collectives!r}")
        self.pool = {} if pool is None else pool
        self.sched = sched
        self.rank = rank
        self.shape = shape
        self.layouts = layouts
        self.native = collectives == "native"
        # the process group's rank of each schedule rank (a schedule over a subgroup, e.g. a training step's CP
        # group); None: schedule rank r is process rank r
        self.peers = None if peers is None else tuple(peers)
        self.device = device or self.inp.q.device
        # op id -> (the works to wait for, buffer, op) of posted transfers not yet waited for
        self.pending: dict[int, tuple[list[Any], torch.Tensor, Op]] = {}
        self.coll_ranks: dict[str, set[int]] = {}  # collective tag -> the ranks that take part
        for o in sched.ops:
            if o.kind == "launch" and o.coll:
                self.coll_ranks.setdefault(o.coll, set()).add(o.rank)
        # each op's point-to-point batch (-1: none): its rank's ends issued back to back, posted as one
        if sched.p2p == "batched":
            cols = (sched.ops if isinstance(sched.ops, OpList) else OpList(sched.ops)).columns()
            self.batch = p2p_batches(cols.dep_count, cols.parents, cols.kind, cols.rank, cols.match, cols.coll)
        else:
            self.batch = np.full(len(sched.ops), -1)
        self.batched: list[tuple[Op, torch.Tensor]] = []  # the open batch's ends, posted when it closes
        self.batches_posted: list[int] = []  # how many ends each batch this rank posted held (in order)

    def _wait(self, op_id: int) -> None:
        entry = self.pending.pop(op_id, None)
        if entry is None:
            return
        works, flat, op = entry
        for work in works:
            work.wait()
        if op.kind == "recv":
            self.store(op, _unpack(flat, self.layouts[_tag(op)], self.shape))

    def _peer(self, rank: int | None) -> int | None:
        return rank if self.peers is None or rank is None else self.peers[rank]

    def _post(self, op: Op, flat: torch.Tensor) -> None:
        if self.batch[op.id] >= 0:
            self.batched.append((op, flat))
        elif op.kind == "send":
            self.pending[op.id] = ([dist.isend(flat, dst=self._peer(op.peer), tag=op.id)], flat, op)
        else:
            self.pending[op.id] = ([dist.irecv(flat, src=self._peer(op.peer), tag=_tag(op))], flat, op)

    def _flush(self) -> None:
        """Post the open batch: one ``batch_isend_irecv``; each end waits for its own work where the backend
        returns one per end (gloo), else for the batch's (NCCL: the group's)."""
        if not self.batched:
            return
        p2p = [dist.P2POp(dist.isend if op.kind == "send" else dist.irecv, flat, self._peer(op.peer), tag=_tag(op))
               for op, flat in self.batched]
        works = [w for w in dist.batch_isend_irecv(p2p) if w is not None]
        own = len(works) == len(self.batched)
        for i, (op, flat) in enumerate(self.batched):
            self.pending[op.id] = ([works[i]] if own else works, flat, op)
        self.batches_posted.append(len(self.batched))
        self.batched = []

    def send(self, op: Op) -> None:
        self._post(op, _pack(self.payload(op)).contiguous())

    def recv(self, op: Op) -> None:
        assert op.match is not None
        n = message_elements(self.layouts[op.match], self.shape)
        key = (op.id,) if op.into else (op.args, n)
        flat = self.pool.get(key)
        if flat is None:
            flat = self.pool[key] = torch.empty(n, dtype=self.inp.q.dtype, device=self.device)
        self._post(op, flat)

    def collective(self, op: Op) -> None:
        """A collective's launch op: run it natively on the whole buffer (the decomposed ops are skipped)."""
        members = self.coll_ranks[op.coll]
        if len(members) != dist.get_world_size():
            raise ValueError(f"collective {op.coll!r} spans ranks {sorted(members)}, not the whole group: run it "
                             "with collectives=decomposed")
        buf = self.buf[self.rank][op.out]
        if op.fn == "allreduce":
            dist.all_reduce(buf, op=_REDUCE[op.redop])
        elif op.fn == "reduce":
            dist.reduce(buf, dst=op.root, op=_REDUCE[op.redop])
        elif op.fn == "broadcast":
            dist.broadcast(buf, src=op.root)
        else:
            raise ValueError(f"op #{op.id}: no native collective {op.fn!r}")

    def run_rank(self) -> dict[str, Any]:
        """Execute this rank's ops; returns its buffers (none on a rank the schedule does not use, e.g. ``single``
        on several processes)."""
        if self.rank >= self.sched.ranks:
            return {}
        batch = -1  # the open batch (its ends' deps are not in it: p2p_batches)
        for op in self.sched.ops:
            if op.rank != self.rank:
                continue
            if self.batch[op.id] != batch:
                self._flush()
                batch = self.batch[op.id]
            for dep in op.deps:
                self._wait(dep)
            if self.native and op.coll:
                if op.kind == "launch":
                    self.collective(op)
                continue  # the collective's steps ran inside dist.all_reduce
            self.execute(op)
        self._flush()
        for op_id in list(self.pending):
            self._wait(op_id)
        return self.buf[self.rank]


class RankRunner(_RealTransfers, Executor):
    """One rank's real execution of a decode schedule (the process group must be initialised)."""

    def __init__(self, sched: Schedule, inp: Inputs, rank: int, shape: DecodeShape,
                 layouts: dict[int, list[Descriptor]], collectives: str = "native",
                 device: torch.device | None = None, pool: dict[Any, torch.Tensor] | None = None) -> None:
        Executor.__init__(self, sched, inp)
        # ``pool`` keeps allocations across iterations (decode steps), as a real implementation does: this
        # rank's KV cache, one contiguous block that is only ever read; and receive buffers. A recv that replaces
        # a buffer reuses the one of the same name and size (the schedule's dependencies guarantee its previous
        # contents were consumed); a recv into a slice of a buffer gets its own.
        self._setup(sched, rank, shape, layouts, collectives, device, pool)
        for name, value in list(self.buf[rank].items()):
            if isinstance(value, KVShard):
                key = ("kv-cache", name, value.lo, value.hi)
                if key not in self.pool:
                    self.pool[key] = torch.stack([value.k, value.v])
                self.buf[rank][name] = KVShard.from_packed(self.pool[key], value.lo, value.hi)


class _OwnRows:
    """A rank's own rows of a (b, heads, n, d) input standing in for the whole sequence's tensor (its ``shape``,
    ``dtype``, ``device``): indexing it with the rank's positions, all that the executor reads of an input of its
    rank (``only``), gives the rows back; any other index raises, so that no other row can be asked for."""

    def __init__(self, rows: torch.Tensor, pos: np.ndarray, n: int) -> None:
        self.rows, self.pos = rows, pos
        self.shape = (*rows.shape[:2], n, *rows.shape[3:])
        self.dtype, self.device = rows.dtype, rows.device

    def __getitem__(self, index: Any) -> torch.Tensor:
        whole = slice(None)
        if not (isinstance(index, tuple) and len(index) == 3 and index[0] == whole and index[1] == whole
                and np.array_equal(np.asarray(index[2]), self.pos)):
            raise IndexError("a rank's own rows are read at its positions only")
        return self.rows.contiguous()


class PrefillRankRunner(_RealTransfers, PrefillExecutor):
    """One rank's real execution of a prefill (or training) schedule: ``inp`` holds torch tensors of the whole
    sequence, of which the rank takes its own rows; with ``own_rows``, only those rows, in the order of the rank's
    positions (``sched.meta["runs"][rank]``; no cached prefix): no whole-sequence tensor is made. ``pool`` keeps
    receive buffers across iterations. ``peers``: the process rank of each schedule rank, where the schedule runs on
    a subgroup (default: the same numbers)."""

    def __init__(self, sched: Schedule, inp: PrefillInputs, rank: int, layouts: dict[int, list[Descriptor]],
                 device: torch.device | None = None, pool: dict[Any, torch.Tensor] | None = None,
                 peers: Sequence[int] | None = None, own_rows: bool = False) -> None:
        if own_rows:
            if "kv_runs" in sched.meta:
                raise ValueError("own_rows: a cached prefix's keys are not the rank's query rows")
            runs = sched.meta["runs"]
            pos, n = positions(runs[rank] if rank < len(runs) else ()), sched.meta["shape"].sequence
            inp = PrefillInputs(_OwnRows(inp.q, pos, n), _OwnRows(inp.k, pos, n), _OwnRows(inp.v, pos, n),
                                _OwnRows(inp.dout, pos, n), inp.scale, inp.causal)
        PrefillExecutor.__init__(self, sched, inp, only=rank)
        self._setup(sched, rank, sched.meta["shape"], layouts, "decomposed", device, pool, peers)
