"""All-to-all by pairwise exchange: every rank sends a distinct piece of its buffer to every other rank.

P - 1 rounds; in round k (1 <= k < P), rank ``order[i]`` sends to ``order[(i + k) mod P]`` and receives from
``order[(i - k) mod P]``; a rank starts round k once its transfers of round k - 1 are done (MPI's pairwise
exchange algorithm, which keeps every link busy with one flow per direction). Its own piece is a local slice.
With even pieces of B/P bytes out of a buffer of B, each rank sends (P - 1) B / P bytes.

:func:`hierarchical_alltoall` is the two-level variant for multi-node groups (inside each node, then across nodes
rail to rail); :data:`ALLTOALL` names both.

The pieces are slices of ``buf`` along one axis (``mode``: ``heads`` or ``rows``): ``piece(src, dst)`` gives the
slice [lo, hi) of src's buffer that dst gets and its bytes. Each rank first cuts its buffer into its pieces
(``slice-heads`` / ``slice-rows`` kernels: views, free); a piece lands in dst's ``name(src)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from simulator.schedule.core import Schedule

__all__ = ["ALLTOALL", "hierarchical_alltoall", "pairwise_alltoall"]


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
        cuts = []
        for dst in order:  # views of buf (free); the own piece lands in the output buffer
            lo, hi, nbytes = piece(r, dst)
            own = dst == r
            cuts.append(sched.add_compute(r, f"{tag}.cut", deps=start, fn=f"slice-{mode}",
                                          out=name(r) if own else _cut(tag, r, dst), args=(buf,), lo=lo, hi=hi,
                                          fused=True, coll=tag, alloc=[(name(r), nbytes)] if own else ()))
        prev[r], front[r] = cuts, [cuts[order.index(r)]]
    for k in range(1, p):
        done: dict[int, list[int]] = {r: [] for r in order}
        for i, src in enumerate(order):
            dst = order[(i + k) % p]
            nbytes = piece(src, dst)[2]
            snd, recv = sched.add_transfer(src, dst, nbytes, tag, send_deps=prev[src], recv_deps=prev[dst],
                                           args=(_cut(tag, src, dst),), dst_args=(name(src),), coll=tag,
                                           alloc=[(name(src), nbytes)])
            done[src].append(snd)
            done[dst].append(recv)
            front[dst].append(recv)
        prev = done
    return {r: tuple(ids) for r, ids in front.items()}


def _cut(tag: str, src: int, dst: int) -> str:
    return f"{tag}.{src}>{dst}"

def hierarchical_alltoall(sched: Schedule, groups: Sequence[Sequence[int]], buf: str, name: Callable[[int], str],
                          piece: Callable[[int, int], tuple[int, int, float]], *, mode: str, tag: str,
                          deps: Mapping[int, Iterable[int]]) -> dict[int, tuple[int, ...]]:
    """Two-level all-to-all over ``groups`` (the ranks of each node, equal sizes g, local index i = position).

    Each rank first cuts its buffer into its P pieces (local, free). Step 1, inside each node: rank (n, i) sends
    rank (n, j) one message with the N pieces meant for local index j on every node. Step 2, across nodes (rail to
    rail): rank (n, j) sends rank (m, j) one message with the g pieces meant for it from node n. Every piece
    crosses the node boundary once, in N - 1 messages per rank of g pieces each, instead of (N - 1) g messages.
    """
    if mode not in ("heads", "rows"):
        raise ValueError(f"mode must be heads or rows, got {mode!r}")
    g = len(groups[0])
    if any(len(grp) != g for grp in groups):
        raise ValueError("a hierarchical all-to-all needs the same number of ranks on every node")
    ranks = [r for grp in groups for r in grp]
    node = {r: n for n, grp in enumerate(groups) for r in grp}
    local = {r: i for grp in groups for i, r in enumerate(grp)}

    def cut(src: int, dst: int) -> str:
        return _cut(tag, src, dst)

    front: dict[int, list[int]] = {}
    ready: dict[int, list[int]] = {}
    for r in ranks:
        start = list(deps.get(r, ()))
        if len(ranks) > 1:
            start = [sched.add_launch(r, f"{tag}.launch", deps=start, coll=tag, fn="alltoall", out=buf)]
        ops = []
        for dst in ranks:
            lo, hi, nbytes = piece(r, dst)
            out = name(r) if dst == r else cut(r, dst)
            ops.append(sched.add_compute(r, f"{tag}.cut", deps=start, fn=f"slice-{mode}", out=out, args=(buf,),
                                         lo=lo, hi=hi, fused=True, coll=tag, alloc=[(out, nbytes)]))
        ready[r] = ops
        front[r] = [ops[ranks.index(r)]]

    def step(pairs: dict[tuple[int, int], list[tuple[int, int]]]) -> dict[int, list[int]]:
        """Send each (src, via) the pieces (origin, dst) it holds; the receiver keeps or forwards them."""
        got: dict[int, list[int]] = {r: [] for r in ranks}
        for (src, dst), items in pairs.items():
            if not items:
                continue
            names = [cut(o, d) for o, d in items]
            keep = [name(o) if d == dst else cut(o, d) for o, d in items]
            nbytes = sum(piece(o, d)[2] for o, d in items)
            snd, recv = sched.add_transfer(src, dst, nbytes, tag, send_deps=ready[src], recv_deps=ready[dst],
                                           args=names, dst_args=keep, coll=tag, free_src=names,
                                           alloc=[(k, piece(o, d)[2]) for k, (o, d) in zip(keep, items, strict=True)])
            got[dst].append(recv)
            got[src].append(snd)
            if any(d == dst for _, d in items):
                front[dst].append(recv)
        return got

    # step 1: inside each node, to the rank of the destination's local index
    first: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for r in ranks:
        for dst in ranks:
            via = groups[node[r]][local[dst]]
            if via != r:
                first.setdefault((r, via), []).append((r, dst))
    got = step(first)
    ready = {r: ready[r] + got[r] for r in ranks}
    # step 2: across nodes, rail to rail: every piece held for another node goes to its destination
    second: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for grp in groups:
        for via in grp:
            for origin in grp:
                for dst in ranks:
                    if local[dst] == local[via] and node[dst] != node[via]:
                        second.setdefault((via, dst), []).append((origin, dst))
    step(second)
    return {r: tuple(ids) for r, ids in front.items()}


ALLTOALL = ("pairwise", "hierarchical")
