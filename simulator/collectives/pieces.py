"""Ring all-gather and reduce-scatter of *pieces*: one named buffer per owner rank (e.g. each rank's K/V shard),
of any sizes (uneven shards), rather than slices of one flat buffer.

With ranks ``order[0..P-1]`` around the ring, piece c belonging to ``order[c]``:

* all-gather: P - 1 steps; at step k, position i sends piece (i - k) mod P to position i + 1. Every rank sends
  every piece but its successor's once: (P - 1) x (sum of the pieces) bytes in all.
* reduce-scatter: P - 1 steps; at step k, position i sends its partial sum of piece (i - k - 1) mod P (at step 0:
  those rows of its own buffer, cut as a view) to position i + 1, which adds its own contribution (a reduction
  inside the communication kernel, as NCCL's). The owner ends with the sum over all ranks. Same volume as the
  all-gather.

Each function appends one launch per rank (a collective), the transfers and reductions; it returns, per rank, the
op ids after which the rank holds its result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from simulator.schedule.core import Schedule
from simulator.schedule.oplist import KIND_INDEX, Indexed

__all__ = ["ring_allgather_pieces", "ring_reduce_scatter_pieces"]

Frontier = dict[int, tuple[int, ...]]
_SEND, _RECV, _COMPUTE = KIND_INDEX["send"], KIND_INDEX["recv"], KIND_INDEX["compute"]
# an op's columns in ring_reduce_scatter_pieces' block, where a move's op does not give them: indexes into its
# tables (name, dtype, fn, out, args, alloc, free: the first entry, the empty or default one) and the Op defaults
_ROW: dict[str, int | float | bool] = {"match": -1, "name": 0, "nbytes": 0.0, "flops": 0.0, "dtype": 0, "fn": 0,
                                       "out": 0, "args": 0, "lo": 0, "hi": -1, "alloc": 0, "free": 0, "fused": False}


def _moves(p: int, deps: np.ndarray, **given: np.ndarray | int | float | bool
           ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One op per ring position: its columns (``given``, else :data:`_ROW`'s), each ``p`` long, and its deps."""
    return {n: np.broadcast_to(np.asarray(v), (p,)) for n, v in {**_ROW, **given}.items()}, deps


def _launch(sched: Schedule, order: Sequence[int], tag: str, fn: str, buf: str,
            deps: Mapping[int, Iterable[int]]) -> dict[int, list[int]]:
    if len(order) < 2:
        return {r: list(deps.get(r, ())) for r in order}
    return {r: [sched.add_launch(r, f"{tag}.launch", deps=deps.get(r, ()), coll=tag, fn=fn, out=buf)] for r in order}


def ring_allgather_pieces(sched: Schedule, order: Sequence[int], name: Callable[[int], str],
                          nbytes: Callable[[int], float], *, tag: str, deps: Mapping[int, Iterable[int]]) -> Frontier:
    """Every rank ends with every piece ``name(owner)`` (``nbytes(owner)`` bytes, allocated on receipt).

    The P - 1 steps' transfers are appended as one block of columns (:meth:`Schedule.add_ops`): step after step,
    position after position, a send then its receive, the ops (ids, fields, deps) that :meth:`Schedule.add_transfer`
    called once per move would append (``tests/test_pieces.py`` compares the two). A send at step k waits for
    the piece it forwards (its receive at step k - 1) and its own send of step k - 1; a receive for the receiver's
    receive of step k - 1; at step 0 both for their rank's launch."""
    p = len(order)
    front = _launch(sched, order, tag, "allgather", name(order[0]), deps)
    if p < 2:
        return {r: tuple(ids) for r, ids in front.items()}
    steps = p - 1
    i = np.arange(p)
    k = np.arange(steps)[:, None]
    base = len(sched.ops) + 2 * (k * p + i[None, :])  # (step, position): the send's id; its receive's is next
    dep = np.full((steps, p, 2, 2), -1, np.int64)  # (step, position, send/recv, dep)
    launch = np.array([front[r][0] for r in order], dtype=np.int64)
    dep[0, :, 0, 0] = launch  # a send after its rank's launch
    dep[0, :, 1, 0] = np.roll(launch, -1)  # a receive after its receiver's (position i + 1)
    dep[1:, :, 0, 0] = np.roll(base[:-1] + 1, 1, axis=1)  # the piece it forwards: position i - 1's at step k - 1
    dep[1:, :, 0, 1] = base[:-1]  # its own send of step k - 1
    dep[1:, :, 1, 0] = base[:-1] + 1  # the receiver's receive of step k - 1 (position i's transfer)
    owner = (i[None, :] - k) % p  # (step, position): the position of the piece's owner
    pieces = [name(r) for r in order]
    sizes = [nbytes(r) for r in order]
    ends = np.stack([owner, owner], axis=2).reshape(-1)
    kinds = np.tile(np.array([_SEND, _RECV], np.uint8), steps * p)
    ranks = np.stack([np.broadcast_to(np.asarray(order, dtype=np.int64), (steps, p)),
                      np.broadcast_to(np.roll(np.asarray(order, dtype=np.int64), -1), (steps, p))], axis=2)
    match = np.stack([base + 1, base], axis=2).reshape(-1)
    recv = kinds == _RECV
    sched.add_ops(kinds, ranks.reshape(-1), dep.reshape(-1, 2), match, name=tag, coll=tag,
                  nbytes=np.array([float(x) for x in sizes])[ends], args=Indexed([(x,) for x in pieces], ends),
                  alloc=Indexed([(), *(((x, size),) for x, size in zip(pieces, sizes, strict=True))],
                                np.where(recv, ends + 1, 0)))
    for j, r in enumerate(order):  # its launch, then the piece it received at each step (from position j - 1)
        front[r].extend((base[:, (j - 1) % p] + 1).tolist())
    return {r: tuple(ids) for r, ids in front.items()}


def ring_reduce_scatter_pieces(sched: Schedule, order: Sequence[int], full: str,
                               rows: Callable[[int], tuple[int, int]], nbytes: Callable[[int], float],
                               elems: Callable[[int], float], *, out: Callable[[int], str], tag: str,
                               dtype: str, elem_bytes: int, deps: Mapping[int, Iterable[int]]) -> Frontier:
    """Rank ``order[c]`` ends with ``out(owner)`` = the sum over all ranks of rows ``rows(owner)`` of ``full``.

    At step 0 a rank sends the rows of its own ``full`` (cut as a view); later it sends the partial sums it received
    and added to. The P - 1 steps are appended as one block of columns (:meth:`Schedule.add_ops`): per step and
    position, (at step 0 the cut,) the send, its receive and the receiver's reduction, the ops (ids, fields, deps)
    that :meth:`Schedule.add_compute` and :meth:`Schedule.add_transfer` called once per move would append
    (``tests/test_pieces.py`` compares the two). A rank's ops of step k wait for what it held after step k - 1: its
    send and the reduction of what it received (the first position: in the other order), at step 0 its launch.
    """
    p = len(order)
    front = _launch(sched, order, tag, "reduce-scatter", full, deps)
    if p < 2:
        return {r: tuple(ids) for r, ids in front.items()}
    steps = p - 1
    i = np.arange(p)
    ranks_of = np.asarray(order, dtype=np.int64)
    # per step and position its ops: (cut at step 0,) send, recv, reduction; their ids
    width = np.where(np.arange(steps) == 0, 4, 3)
    first = len(sched.ops) + np.concatenate([[0], np.cumsum(width * p)[:-1]])  # each step's first op
    per = width[:, None]
    at = first[:, None] + per * i[None, :]  # (step, position): its first op
    send = at + (per - 3)  # after the cut at step 0
    recv, red = send + 1, send + 2
    # what each position's rank held after each step: (its send, the reduction into it) in append order
    held = np.empty((steps, p, 2), np.int64)
    held[:, 1:, 0], held[:, 1:, 1] = red[:, :-1], send[:, 1:]  # the reduction from position i - 1 came first
    held[:, 0, 0], held[:, 0, 1] = send[:, 0], red[:, -1]  # position 0 sent before position p - 1 reduced into it
    launch = np.array([front[r][0] for r in order], dtype=np.int64)
    owner = (i[None, :] - np.arange(steps)[:, None] - 1) % p  # (step, position): the piece's owner's position
    bounds = [rows(r) for r in order]
    lo_of, hi_of = np.array([b[0] for b in bounds], np.int64), np.array([b[1] for b in bounds], np.int64)
    parts = [f"{tag}.part{r}" for r in order]
    size_of = [nbytes(r) for r in order]
    elem_of = np.array([float(elems(r)) for r in order])
    cols: dict[str, list[np.ndarray]] = {n: [] for n in ("kind", "rank", *_ROW)}
    dep_rows: list[np.ndarray] = []
    names = [tag, f"{tag}.cut", f"{tag}.reduce"]
    outs = ["", *parts, *(out(r) for r in order)]  # "", a part, an owner's result
    args_table: list[tuple[str, ...]] = [(full,), *((x,) for x in parts), *((f"{tag}.tmp{k}",) for k in range(steps)),
                                         *((f"{tag}.tmp{k}", full) for k in range(steps))]
    allocs: list[tuple[tuple[str, float], ...]] = [(), *(((x, z),) for x, z in zip(parts, size_of, strict=True)),
                                                   *(((out(r), z),) for r, z in zip(order, size_of, strict=True))]
    frees: list[tuple[str, ...]] = [(), *((x,) for x in parts)]
    dst = np.roll(i, -1)  # the receiver's position
    for k in range(steps):
        o = owner[k]
        target = (1 + p + o) if k == p - 2 else (1 + o)  # into the owner's result at the last step, else a part
        before = np.stack([launch, np.full(p, -1)], axis=1) if k == 0 else held[k - 1]
        sizes = np.array([float(size_of[c]) for c in o.tolist()])
        ops: list[tuple[dict[str, np.ndarray], np.ndarray]] = []
        if k == 0:  # the rows of its own contribution (a view, free)
            ops.append(_moves(p, before, kind=_COMPUTE, rank=ranks_of, name=1, fn=1, out=1 + o, lo=lo_of[o],
                              hi=hi_of[o], fused=True))
        ops.append(_moves(p, np.stack([at[0], np.full(p, -1)], axis=1) if k == 0 else before, kind=_SEND,
                          rank=ranks_of, match=recv[k], nbytes=sizes, args=1 + o, free=0 if k == 0 else 1 + o))
        ops.append(_moves(p, before[dst], kind=_RECV, rank=ranks_of[dst], match=send[k], nbytes=sizes,
                          args=1 + p + k))
        ops.append(_moves(p, np.concatenate([recv[k][:, None], before[dst]], axis=1), kind=_COMPUTE,
                          rank=ranks_of[dst], name=2, nbytes=3 * elem_of[o] * elem_bytes, flops=elem_of[o], dtype=1,
                          fn=2, out=target, args=1 + p + steps + k, lo=lo_of[o], hi=hi_of[o], alloc=target,
                          fused=True))
        for n in cols:  # position after position, its ops in order
            cols[n].append(np.stack([columns[n] for columns, _ in ops], axis=1).reshape(-1))
        d = np.full((p, len(ops), 3), -1, np.int64)
        for j, (_, deps_j) in enumerate(ops):
            d[:, j, : deps_j.shape[1]] = deps_j
        dep_rows.append(d.reshape(-1, 3))
    col = {n: np.concatenate(v) for n, v in cols.items()}
    sched.add_ops(col["kind"].astype(np.uint8), col["rank"], np.concatenate(dep_rows), col["match"],
                  name=Indexed(names, col["name"]), nbytes=col["nbytes"], flops=col["flops"],
                  dtype=Indexed(["fp32", dtype], col["dtype"]), fn=Indexed(["", "slice-rows", "add"], col["fn"]),
                  out=Indexed(outs, col["out"]), args=Indexed(args_table, col["args"]), lo=col["lo"], hi=col["hi"],
                  alloc=Indexed(allocs, col["alloc"]), free=Indexed(frees, col["free"]), fused=col["fused"],
                  coll=tag)
    return {r: tuple(held[-1, j].tolist()) for j, r in enumerate(order)}
