"""Tree collectives: binomial reduce/broadcast, double binary tree and recursive-doubling allreduce.

* Binomial tree (recursive halving/doubling around a root): reduce and broadcast in ceil(log2 P) rounds, no rank
  receiving twice in one round.
* Double binary tree (NCCL, Sanders et al. 2009): the buffer is split in two halves; each half is reduced up one
  binary tree and broadcast back down it. Tree A is a heap over the ranks in order, tree B a heap over them in
  reverse, so that most ranks are a leaf in one tree and interior in the other.
* Recursive doubling: log2 P rounds of pairwise exchange of the whole buffer; with P not a power of two the extra
  ranks first fold into a partner and get the result back at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.collectives.base import CollBuilder, rotated_to

__all__ = ["binomial_broadcast", "binomial_reduce", "double_binary_tree_allreduce", "recursive_doubling_allreduce"]


def binomial_reduce(b: CollBuilder, ranks: Sequence[int], root: int) -> None:
    order = rotated_to(ranks, root)
    p, mask = len(order), 1
    while mask < p:
        b.step([(order[v], order[v - mask], 0, b.n) for v in range(mask, p, 2 * mask)], reduce=True)
        mask *= 2


def binomial_broadcast(b: CollBuilder, ranks: Sequence[int], root: int) -> None:
    order = rotated_to(ranks, root)
    p = len(order)
    mask = 1
    while mask * 2 < p:
        mask *= 2
    while mask >= 1 and p > 1:
        b.step([(order[v], order[v + mask], 0, b.n) for v in range(0, p, 2 * mask) if v + mask < p], reduce=False)
        mask //= 2


def _heap_allreduce(b: CollBuilder, order: Sequence[int], lo: int, hi: int) -> None:
    p = len(order)
    depth_of = [0] * p
    for pos in range(1, p):
        depth_of[pos] = depth_of[(pos - 1) // 2] + 1
    depth = max(depth_of)
    for level in range(depth, 0, -1):  # reduce up: all edges of one level are concurrent
        b.step([(order[pos], order[(pos - 1) // 2], lo, hi) for pos in range(p) if depth_of[pos] == level],
               reduce=True)
    for level in range(1, depth + 1):  # broadcast down
        b.step([(order[(pos - 1) // 2], order[pos], lo, hi) for pos in range(p) if depth_of[pos] == level],
               reduce=False)


def double_binary_tree_allreduce(b: CollBuilder, ranks: Sequence[int]) -> None:
    if len(ranks) < 2 or b.n == 0:
        return
    half = b.n // 2
    start = dict(b.front)
    ends: dict[int, tuple[int, ...]] = {r: () for r in ranks}
    for order, (lo, hi) in ((list(ranks), (0, half)), (list(ranks)[::-1], (half, b.n))):
        if hi == lo:
            continue
        b.front = dict(start)  # the two halves are independent: each tree starts from the same frontier
        _heap_allreduce(b, order, lo, hi)
        for r in ranks:
            ends[r] = tuple(dict.fromkeys((*ends[r], *b.front[r])))
    b.front = {**start, **ends}


def recursive_doubling_allreduce(b: CollBuilder, ranks: Sequence[int]) -> None:
    p = len(ranks)
    if p < 2 or b.n == 0:
        return
    pow2 = 1
    while pow2 * 2 <= p:
        pow2 *= 2
    extra = list(range(pow2, p))
    if extra:
        b.step([(ranks[v], ranks[v - pow2], 0, b.n) for v in extra], reduce=True)
    mask = 1
    while mask < pow2:
        b.step([(ranks[v], ranks[v ^ mask], 0, b.n) for v in range(pow2)], reduce=True)
        mask *= 2
    if extra:
        b.step([(ranks[v - pow2], ranks[v], 0, b.n) for v in extra], reduce=False)
