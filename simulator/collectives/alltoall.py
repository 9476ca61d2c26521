"""All-to-all by pairwise exchange: every rank sends a distinct piece of its buffer to every other rank.

P - 1 rounds; in round k (1 <= k < P), rank ``order[i]`` sends to ``order[(i + k) mod P]`` and receives from
``order[(i - k) mod P]``; a rank starts round k once its transfers of round k - 1 are done (MPI's pairwise
exchange algorithm, which keeps every link busy with one flow per direction). Its own piece is a local slice.
With even pieces of B/P bytes out of a buffer of B, each rank sends (P - 1) B / P bytes.

The pieces are slices of ``buf`` along one axis (``mode``: ``heads`` or ``rows``, the send's ``fn``): ``piece(src,
dst)`` gives the slice [lo, hi) of src's buffer that dst gets and its bytes; it lands in dst's ``name(src)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from simulator.schedule import Schedule

__all__ = ["pairwise_alltoall"]


def pairwise_alltoall(sched: Schedule, order: Sequence[int], buf: str, name: Callable[[int], str],
                      piece: Callable[[int, int], tuple[int, int, float]], *, mode: str, tag: str,
                      deps: Mapping[int, Iterable[int]]) -> dict[int, tuple[int, ...]]:
    """Returns, per rank, the op ids after which it holds every piece meant for it."""
    if mode not in ("heads", "rows"):
        raise ValueError(f"mode must be heads or rows, got {mode!r}")
    p = len(order)
    prev: dict[int, list[int]] = {}
    front: dict[int, list[int]] = {}
    for r in order:
        start = list(deps.get(r, ()))
        if p > 1:
            start = [sched.add_launch(r, f"{tag}.launch", deps=start, coll=tag, fn="alltoall", out=buf)]
        lo, hi, nbytes = piece(r, r)
        own = sched.add_compute(r, f"{tag}.local", deps=start, fn=f"slice-{mode}", out=name(r), args=(buf,), lo=lo,
                                hi=hi, fused=True, coll=tag, alloc=[(name(r), nbytes)])
        prev[r], front[r] = start, [own]
    for k in range(1, p):
        done: dict[int, list[int]] = {r: [] for r in order}
        for i, src in enumerate(order):
            dst = order[(i + k) % p]
            lo, hi, nbytes = piece(src, dst)
            snd, recv = sched.add_transfer(src, dst, nbytes, tag, send_deps=prev[src], recv_deps=prev[dst],
                                           args=(buf,), dst_args=(name(src),), lo=lo, hi=hi, coll=tag,
                                           alloc=[(name(src), nbytes)])
            sched.ops[snd] = sched.ops[snd]._replace(fn=mode)
            done[src].append(snd)
            done[dst].append(recv)
            front[dst].append(recv)
        prev = done
    return {r: tuple(ids) for r, ids in front.items()}
