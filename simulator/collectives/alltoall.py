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

import numpy as np

from simulator.schedule.core import Schedule
from simulator.schedule.oplist import KIND_INDEX, Indexed

__all__ = ["ALLTOALL", "hierarchical_alltoall", "pairwise_alltoall"]

_SEND, _RECV, _COMPUTE, _LAUNCH = KIND_INDEX["send"], KIND_INDEX["recv"], KIND_INDEX["compute"], KIND_INDEX["launch"]


def pairwise_alltoall(sched: Schedule, order: Sequence[int], buf: str, name: Callable[[int], str],
                      piece: Callable[[int, int], tuple[int, int, float]], *, mode: str, tag: str,
                      deps: Mapping[int, Iterable[int]]) -> dict[int, tuple[int, ...]]:
    """Returns, per rank, the op ids after which it holds every piece meant for it.

    Appended as blocks of columns (:meth:`Schedule.add_ops`): per rank its launch and its P cuts, then the P - 1
    rounds' transfers, round after round, position after position, a send then its receive: the ops (ids, fields,
    deps) that :meth:`Schedule.add_compute` and :meth:`Schedule.add_transfer` called once per piece would append
    (``tests/test_pieces.py`` compares the two). A round's send waits for what its rank held after the round before
    (its send and its receive, in the order they were appended; in round 1 its P cuts), its receive likewise for
    the receiver's."""
    if mode not in ("heads", "rows"):
        raise ValueError(f"mode must be heads or rows, got {mode!r}")
    p = len(order)
    # per rank, its launch (where P > 1) and its P cuts, one block: views of buf (free); the own piece lands in the
    # output buffer
    launch = 1 if p > 1 else 0
    span = launch + p  # ops per rank
    first = len(sched.ops)
    sizes = np.empty((p, p), dtype=float)  # (src position, dst position): the piece's bytes
    lo = np.zeros((p, span), np.int64)
    hi = np.full((p, span), -1, np.int64)
    names: list[str] = []  # (src position, dst position): the piece's cut, then (src position): where it lands
    given = [tuple(deps.get(r, ())) for r in order]
    for j, r in enumerate(order):
        cuts = [piece(r, dst) for dst in order]
        sizes[j] = [nbytes for _, _, nbytes in cuts]
        lo[j, launch:] = [x for x, _, _ in cuts]
        hi[j, launch:] = [x for _, x, _ in cuts]
        names += [_cut(tag, r, dst) for dst in order]
    names += [name(r) for r in order]
    i = np.arange(p)
    head = first + span * i  # each rank's first op: its launch, or its first cut
    cut_ids = head[:, None] + launch + i[None, :]  # (position, dst position)
    # deps (CSR): a launch after its rank's given deps, its cuts after the launch (one rank: its cut after them)
    per_op = np.ones((p, span), np.int64)
    per_op[:, 0] = [len(g) for g in given]
    on = np.concatenate([np.asarray(g + (int(head[j]),) * (p if launch else 0), np.int64)
                         for j, g in enumerate(given)])
    kind = np.tile(np.concatenate([np.full(launch, _LAUNCH, np.uint8), np.full(p, _COMPUTE, np.uint8)]), p)
    own = np.zeros((p, span), bool)
    own[i, launch + i] = True
    is_launch = np.zeros((p, span), bool)
    is_launch[:, :launch] = True
    which = is_launch.reshape(-1).astype(np.int64)  # 1 for a launch, 0 for a cut: indexes the two-entry tables
    out_at = np.where(is_launch, len(names),
                      np.where(own, p * p + i[:, None], i[:, None] * p + np.arange(span)[None, :] - launch))
    sched.add_ops(kind, np.repeat(np.asarray(order, np.int64), span),
                  (np.concatenate([[0], np.cumsum(per_op)]), on), np.full(p * span, -1, np.int64),
                  name=Indexed([f"{tag}.cut", f"{tag}.launch"], which),
                  fn=Indexed([f"slice-{mode}", "alltoall"], which),
                  out=Indexed([*names, buf], out_at.reshape(-1)),
                  args=Indexed([(buf,), ()], which),
                  lo=lo.reshape(-1), hi=hi.reshape(-1), fused=~is_launch.reshape(-1), coll=tag,
                  alloc=Indexed([(), *(((name(r), sizes[j, j]),) for j, r in enumerate(order))],
                                np.where(own, i[:, None] + 1, 0).reshape(-1)))
    front: dict[int, list[int]] = {r: [int(cut_ids[j, j])] for j, r in enumerate(order)}
    if p < 2:
        return {r: tuple(ids) for r, ids in front.items()}
    rounds = p - 1
    base = len(sched.ops)
    k = np.arange(1, p)[:, None]  # (round, position): position i sends to position i + k
    dst = (i[None, :] + k) % p
    send_id = base + 2 * ((k - 1) * p + i[None, :])
    # each end's deps (CSR): in round 1 its rank's P cuts; later its rank's send and receive of the round before, as
    # they were appended (the receive first where the rank's sender, position j - k + 1, comes before it)
    flat = [np.stack([cut_ids, cut_ids[dst[0]]], axis=1).reshape(-1)]  # round 1: (position, send/recv, P)
    if rounds > 1:
        kk = np.arange(2, p)[:, None]  # the rounds after the first
        own_send = base + 2 * ((kk - 2) * p + i[None, :])
        own_recv = base + 2 * ((kk - 2) * p + (i[None, :] - (kk - 1)) % p) + 1
        recv_first = i[None, :] >= kk - 1
        held = np.stack([np.where(recv_first, own_recv, own_send), np.where(recv_first, own_send, own_recv)], axis=2)
        flat.append(np.stack([held, held[np.arange(rounds - 1)[:, None], dst[1:]]], axis=2).reshape(-1))
    counts = np.concatenate([np.full(2 * p, p, np.int64), np.full(2 * p * (rounds - 1), 2, np.int64)])
    starts = np.concatenate([[0], np.cumsum(counts)])
    src_of = np.broadcast_to(np.asarray(order, np.int64), (rounds, p))
    ranks = np.stack([src_of, np.asarray(order, np.int64)[dst]], axis=2).reshape(-1)
    kinds = np.tile(np.array([_SEND, _RECV], np.uint8), rounds * p)
    match = np.stack([send_id + 1, send_id], axis=2).reshape(-1)
    pair = (i[None, :] * p + dst).repeat(2, axis=1).reshape(-1)  # each end's (src position, dst position)
    # what a receive allocates: (the piece's buffer, its bytes), one table entry per distinct (src, bytes)
    lands, land_of = np.unique(np.stack([np.repeat(i, p).astype(float), sizes.reshape(-1)]), axis=1,
                               return_inverse=True)
    land_of = land_of.reshape(-1)
    recv = kinds == _RECV
    sched.add_ops(kinds, ranks, (starts, np.concatenate(flat)), match, name=tag, coll=tag,
                  nbytes=sizes.reshape(-1)[pair], args=Indexed([(x,) for x in names],
                                                               np.where(recv, p * p + pair // p, pair)),
                  alloc=Indexed([(), *(((name(order[int(j)]), float(x)),) for j, x in lands.T)],
                                np.where(recv, land_of[pair] + 1, 0)))
    for j, r in enumerate(order):  # its own piece, then the piece each round brought (from position j - k)
        front[r].extend((send_id[np.arange(rounds), (j - np.arange(1, p)) % p] + 1).tolist())
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
