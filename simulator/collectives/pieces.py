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

from simulator.schedule.core import Schedule

__all__ = ["ring_allgather_pieces", "ring_reduce_scatter_pieces"]

Frontier = dict[int, tuple[int, ...]]


def _launch(sched: Schedule, order: Sequence[int], tag: str, fn: str, buf: str,
            deps: Mapping[int, Iterable[int]]) -> dict[int, list[int]]:
    if len(order) < 2:
        return {r: list(deps.get(r, ())) for r in order}
    return {r: [sched.add_launch(r, f"{tag}.launch", deps=deps.get(r, ()), coll=tag, fn=fn, out=buf)] for r in order}


def ring_allgather_pieces(sched: Schedule, order: Sequence[int], name: Callable[[int], str],
                          nbytes: Callable[[int], float], *, tag: str, deps: Mapping[int, Iterable[int]]) -> Frontier:
    """Every rank ends with every piece ``name(owner)`` (``nbytes(owner)`` bytes, allocated on receipt)."""
    p = len(order)
    front = _launch(sched, order, tag, "allgather", name(order[0]), deps)
    held = {r: list(front[r]) for r in order}
    last_send: dict[int, list[int]] = {r: [] for r in order}
    for k in range(p - 1):
        moves = []
        for i, r in enumerate(order):
            owner = order[(i - k) % p]
            dst = order[(i + 1) % p]
            moves.append((r, dst, owner))
        new_recv: dict[int, int] = {}
        new_send: dict[int, list[int]] = {}
        for r, dst, owner in moves:
            snd, recv = sched.add_transfer(r, dst, nbytes(owner), tag, send_deps=held[r] + last_send[r],
                                           recv_deps=held[dst], args=(name(owner),), alloc=[(name(owner),
                                                                                             nbytes(owner))],
                                           coll=tag)
            new_recv[dst], new_send[r] = recv, [snd]
        for r in order:
            held[r] = [new_recv[r]]
            last_send[r] = new_send[r]
            front[r].append(new_recv[r])
    return {r: tuple(ids) for r, ids in front.items()}


def ring_reduce_scatter_pieces(sched: Schedule, order: Sequence[int], full: str,
                               rows: Callable[[int], tuple[int, int]], nbytes: Callable[[int], float],
                               elems: Callable[[int], float], *, out: Callable[[int], str], tag: str,
                               dtype: str, elem_bytes: int, deps: Mapping[int, Iterable[int]]) -> Frontier:
    """Rank ``order[c]`` ends with ``out(owner)`` = the sum over all ranks of rows ``rows(owner)`` of ``full``.

    At step 0 a rank sends the rows of its own ``full``; later it sends the partial sums it received and added to.
    """
    p = len(order)
    front = _launch(sched, order, tag, "reduce-scatter", full, deps)
    if p < 2:
        return {r: tuple(ids) for r, ids in front.items()}
    held = {r: list(front[r]) for r in order}
    for k in range(p - 1):
        new_held: dict[int, list[int]] = {}
        for i, r in enumerate(order):
            owner = order[(i - k - 1) % p]
            dst = order[(i + 1) % p]
            lo, hi = rows(owner)
            src_buf = f"{tag}.part{owner}"
            send_deps = held[r]
            if k == 0:  # the rows of its own contribution (a view, free)
                send_deps = [sched.add_compute(r, f"{tag}.cut", deps=held[r], fn="slice-rows", out=src_buf,
                                               args=(full,), lo=lo, hi=hi, fused=True, coll=tag)]
            tmp = f"{tag}.tmp{k}"
            snd, recv = sched.add_transfer(r, dst, nbytes(owner), tag, send_deps=send_deps, recv_deps=held[dst],
                                           args=(src_buf,), dst_args=(tmp,), coll=tag,
                                           free_src=() if k == 0 else (src_buf,))
            target = out(owner) if k == p - 2 else f"{tag}.part{owner}"
            red = sched.add_compute(dst, f"{tag}.reduce", flops=elems(owner), nbytes=3 * elems(owner) * elem_bytes,
                                    dtype=dtype, deps=(recv, *held[dst]), fn="add", out=target, args=(tmp, full),
                                    lo=lo, hi=hi, fused=True, coll=tag, alloc=[(target, nbytes(owner))])
            new_held.setdefault(dst, []).append(red)
            new_held.setdefault(r, []).append(snd)
        held = new_held
    return {r: tuple(ids) for r, ids in held.items()}
