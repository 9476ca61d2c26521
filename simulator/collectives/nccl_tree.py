"""NCCL's tree allreduce as NCCL runs it: one pipeline of chunks that goes up and down the tree at once.

Shape (NCCL ``src/graph/connect.cc``, ``src/graph/trees.cc``): per channel, inside every server a chain that
starts at the GPU of the channel's NIC (the server's head) and runs through the server's other GPUs; across
servers the heads form NCCL's binary tree (``ncclGetBtree``: node 0 the root, interior nodes and leaves
alternating) and, for NCCL's second tree, its mirror (an even server count) or its shift by one (odd)
(``ncclGetDtree``). NCCL runs the two trees as two channels over the same chains and NICs (channels c and
c + nChannels); one of our channels stands for both: the first half of its share goes over tree 0, the second
over tree 1. On one server both trees are the chain: one tree (the channel's ring, rotated to start at its
c-th rank, less its closing hop). A server's edges to other servers all join at its head (NCCL's tree pattern;
its balanced and split patterns move one child to the chain's second GPU: not modelled).

Execution (``src/device/all_reduce.h``, ``runTreeSplit``): a rank's threads are split in two groups that run at
once, each over the channel's chunks in order (NCCL's tree chunk: one step of the channel buffer, 512 KiB for
Simple): the reduce group receives chunk k from the rank's children, adds it to its own and sends the sum up;
the broadcast group receives the final chunk k from the parent and forwards it to the children; the root reduces
and sends down. Chunk k goes down while chunk k + 1 goes up, on the two directions of the full-duplex links. As
a schedule (:func:`tree_allreduce`): per connection (a tree edge in one direction) one transfer per chunk, each
after the connection's previous one; a rank's send up of chunk k after its reductions of chunk k, its sends down
after it holds the final chunk k. The protocol's per-hop latency is paid by the first chunk only (the fill, as
:mod:`.ring`'s pipelines); every transfer's rate is capped at the channel's cap over twice its trees (:mod:`.caps`:
NCCL's tree cap is its graph channel's, which both trees share; half of a tree's threads push each direction).

Closed form (:func:`pipeline_time`): the connections (and each rank's reductions of a chunk) are stages; chunk
k leaves stage v once it has left all of v's predecessors and chunk k - 1 has left v, d_v(k) later (a
deterministic flow shop): C(k, v) = max(C(k - 1, v), max_u C(k, u)) + d_v(k). With chunk 0's time f_v (it pays
the latency floor) and every later chunk's d_v, the last chunk leaves the last stage at the longest path of
(chunk, stage) cells: up a path P of stages with chunk 0 to some stage i, there to chunk 1, on to a stage j, there
to chunk K - 1 (f_v >= d_v: i = j, sum_P d + (K - 1) d_j + the floors up to j). Three numbers per stage (the
longest path ending there with chunk 0, 1 and K - 1) give it in one pass over the stages. It is the engine's time
exactly when no two stages share a link and reductions take no time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from simulator.collectives.base import CollBuilder, chunk_bounds
from simulator.collectives.fabric import Fabric
from simulator.collectives.ring import MAX_SLICES, PIPELINE_SLICE_BYTES
from simulator.schedule import Op, fused_reduce_op, transfer_ops

__all__ = ["Tree", "btree_parent", "channel_trees", "dtree_parents", "pipeline_time",
           "pipeline_time_arrays", "tree_allreduce", "tree_chunks"]


@dataclass(frozen=True)
class Tree:
    """One tree over ranks: ``parent[r]`` (the root has none), ``children[r]``, ``order`` top-down."""

    root: int
    parent: Mapping[int, int]
    children: Mapping[int, tuple[int, ...]]
    order: tuple[int, ...]

    @classmethod
    def of(cls, root: int, parent: Mapping[int, int]) -> Tree:
        children: dict[int, list[int]] = {root: []}
        for r in parent:
            children.setdefault(r, [])
        for r, q in parent.items():
            children.setdefault(q, []).append(r)
        order, i = [root], 0
        while i < len(order):
            order += children[order[i]]
            i += 1
        if len(order) != len(children):
            raise ValueError("not a tree: some ranks do not reach the root")
        return cls(root, dict(parent), {r: tuple(c) for r, c in children.items()}, tuple(order))


def btree_parent(n: int, rank: int) -> int:
    """The parent of node ``rank`` in NCCL's binary tree over ``n`` nodes (-1 for the root, node 0).

    >>> [btree_parent(4, r) for r in range(4)]
    [-1, 2, 0, 2]
    """
    if rank == 0:
        return -1
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return rank ^ bit if up >= n else up


def dtree_parents(n: int, which: int) -> list[int]:
    """Every node's parent in NCCL's tree ``which`` (0 or 1) of its double binary tree over ``n`` nodes."""
    if which == 0:
        return [btree_parent(n, r) for r in range(n)]
    out = []
    for r in range(n):
        if n % 2:  # shift by one
            u = btree_parent(n, (r - 1) % n)
            out.append(-1 if u < 0 else (u + 1) % n)
        else:  # mirror
            u = btree_parent(n, n - 1 - r)
            out.append(-1 if u < 0 else n - 1 - u)
    return out


def channel_trees(fabric: Fabric, ring: Sequence[int], c: int) -> list[Tree]:
    """The trees channel ``c`` (whose ring is ``ring``) runs: one on one server, NCCL's two across servers."""
    groups = fabric.groups(ring)
    if len(groups) == 1:
        s = c % len(ring)
        chains = [[*ring[s:], *ring[:s]]]
    else:
        chains = [[g[(s + j) % len(g)] for j in range(len(g))] for g in groups for s in [fabric.entry(c, len(g))]]
    inside = {chain[j + 1]: chain[j] for chain in chains for j in range(len(chain) - 1)}
    if len(chains) == 1:
        return [Tree.of(chains[0][0], inside)]
    trees = []
    for which in (0, 1):
        parent = dict(inside)
        root = chains[0][0]
        for i, p in enumerate(dtree_parents(len(chains), which)):
            if p < 0:
                root = chains[i][0]
            else:
                parent[chains[i][0]] = chains[p][0]
        trees.append(Tree.of(root, parent))
    return trees


def tree_chunks(nbytes: float, trees: int) -> int:
    """Chunks a tree of ``trees`` pipelines ``nbytes`` of payload in: NCCL's 512 KiB, at most 64 per channel."""
    return min(max(1, MAX_SLICES // trees), max(1, math.ceil(nbytes / PIPELINE_SLICE_BYTES)))


def tree_allreduce(b: CollBuilder, trees: Sequence[Tree]) -> None:
    """``b``'s range allreduced over ``trees``, tree i taking the i-th of equal parts (module docstring)."""
    if b.n == 0:
        return
    start = {r: b.front[r] for r in trees[0].order}
    ends: dict[int, list[int]] = {r: [] for r in start}
    for tree, (lo, hi) in zip(trees, chunk_bounds(b.n, len(trees)), strict=True):
        if hi > lo:
            chunks = tree_chunks((hi - lo) * b.elem_bytes, len(trees))
            for r, ops in _pipeline(b, tree, lo, hi, start, chunks, len(trees)).items():
                ends[r] += ops
    for r in start:  # in place: a channel's view shares its builder's frontier
        b.front[r] = tuple(dict.fromkeys(ends[r])) or start[r]


def _pipeline(b: CollBuilder, tree: Tree, lo: int, hi: int, start: Mapping[int, tuple[int, ...]],
              chunks: int, trees: int) -> dict[int, list[int]]:
    """One of ``trees`` trees' pipeline over elements ``lo:hi`` of ``b``'s range; returns every rank's last ops.

    The ops are built whole and appended at once (:meth:`Schedule.extend`): the same ops, ids and order as one
    ``add_transfer`` / ``add_compute`` per connection and chunk."""
    sched, size = b.sched, b.elem_bytes * b.wire
    cap = float(b.cap * b.wire / (2 * trees))  # a direction: half of a tree's threads; the trees share the channel's
    up_last: dict[int, int] = {}  # rank -> its last send up
    down_last: dict[int, int] = {}  # child -> its parent's last send to it
    got: dict[int, int] = {}  # rank -> its receive of the final chunk
    bottom_up = tree.order[::-1]
    parent, children, hop_s, tag, args = tree.parent, tree.children, b.hop_s, b.tag, (b.buf,)
    red_name, red_fn, dtype, buf, elem = f"{b.tag}.reduce", f"reduce-{b.op}", b.dtype, b.buf, b.elem_bytes
    ops: list[Op] = []
    add = ops.append
    nid = len(sched.ops)
    for k, (a, z) in enumerate(chunk_bounds(hi - lo, chunks)):
        if z == a:
            continue
        clo, chi = b.offset + lo + a, b.offset + lo + z
        nbytes = float((chi - clo) * size)
        flops, red_bytes = float(chi - clo), float(3.0 * (chi - clo) * elem)
        first = k == 0 and hop_s is not None
        acc: dict[int, tuple[int, ...]] = {}  # rank -> ops after which it holds its subtree's sum of the chunk
        sent: dict[int, int] = {}
        for r in bottom_up:
            q = parent.get(r)
            if q is None:
                continue
            deps = acc.get(r, start[r])
            snd, rcv = nid, nid + 1
            send, recv = transfer_ops(
                snd, r, q, nbytes, tag, (*deps, up_last[r]) if r in up_last else deps, start[q], args,
                (f"{tag}.tmp{clo}.{r}",), clo, chi, tag, False, hop_s(r, q) if first else 0.0, cap)  # type: ignore[misc]
            add(send)
            add(recv)
            up_last[r] = sent[r] = snd
            add(fused_reduce_op(nid + 2, q, red_name, flops, red_bytes, dtype, (rcv, *acc.get(q, start[q])),
                                red_fn, buf, recv.args, clo, chi, tag))
            acc[q] = (nid + 2,)
            nid += 3
        for r in tree.order:
            have = acc[tree.root] if r == tree.root else (got[r],)
            for ch in children[r]:
                deps = (*have, down_last[ch]) if ch in down_last else have
                send, recv = transfer_ops(
                    nid, r, ch, nbytes, tag, deps, (sent[ch],), args, args, clo, chi, tag, True,
                    hop_s(r, ch) if first else 0.0, cap)  # type: ignore[misc]
                add(send)
                add(recv)
                down_last[ch], got[ch] = nid, nid + 1
                nid += 2
    sched.extend(ops)
    last: dict[int, list[int]] = {r: [] for r in tree.order}
    for r, snd in up_last.items():
        last[r].append(snd)
    for ch, snd in down_last.items():
        last[tree.parent[ch]].append(snd)
        last[ch].append(got[ch])
    return last


Stage = tuple[float, float]  # (seconds of chunk 0, seconds of every later chunk)


def pipeline_time(tree: Tree, chunks: int, up: Mapping[int, Stage], down: Mapping[int, Stage],
                  reduce: Mapping[int, float]) -> float:
    """Seconds from the launch until the last chunk has reached every rank (module docstring's closed form).

    ``up[r]``: the stage of r's connection to its parent; ``down[r]``: of its parent's connection to r;
    ``reduce[r]``: seconds r's reductions of one chunk take (a stage of its own between its children's sends
    and its own; absent: none).
    """
    k2 = chunks - 2

    def stage(pred: tuple[float, float, float], first: float, later: float) -> tuple[float, float, float]:
        # the latest a path of (chunk, stage) cells reaches the end of this stage with chunk 0, 1 and K - 1
        a = pred[0] + first
        b1 = max(pred[1], a) + later
        return a, b1, max(pred[2] + later, b1 + k2 * later)

    zero = (0.0, 0.0, 0.0)
    ends: dict[int, tuple[float, float, float]] = {}  # rank -> once its sum of a chunk is complete
    for r in reversed(tree.order):
        kids = tree.children[r]
        pred = zero
        if kids:
            pred = (max(ends[c][0] for c in kids), max(ends[c][1] for c in kids), max(ends[c][2] for c in kids))
            if reduce.get(r, 0.0) > 0.0:
                pred = stage(pred, reduce[r], reduce[r])
        ends[r] = stage(pred, *up[r]) if r in tree.parent else pred
    have = {tree.root: ends[tree.root]}
    for r in tree.order[1:]:
        have[r] = stage(have[tree.parent[r]], *down[r])
    return max(v[0] if chunks == 1 else v[2] for v in have.values())


Stages = tuple[np.ndarray, np.ndarray]  # per position: seconds of chunk 0, of every later chunk


def pipeline_time_arrays(parent: np.ndarray, levels: Sequence[np.ndarray], chunks: int, up: Stages, down: Stages,
                         reduce: np.ndarray) -> float:
    """:func:`pipeline_time` over arrays, one tree level at a time (the same operations on the same numbers).

    Positions index the tree's ranks top-down (0: the root); ``parent[p]``: p's parent's position; ``levels[d]``:
    the positions at depth d; ``up`` / ``down``: the stages of the connections to / from each position's parent
    (position 0's ignored); ``reduce[p]``: seconds of p's reductions of one chunk (0: none).
    """
    k2 = chunks - 2

    def stage(pred: tuple[np.ndarray, np.ndarray, np.ndarray], first: np.ndarray,
              later: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a = pred[0] + first
        b1 = np.maximum(pred[1], a) + later
        return a, b1, np.maximum(pred[2] + later, b1 + k2 * later)

    n = len(parent)
    ends = (np.zeros(n), np.zeros(n), np.zeros(n))  # a rank's children's latest (all ends are >= 0)
    for depth in range(len(levels) - 1, 0, -1):
        idx = levels[depth]
        pred = _reduced((ends[0][idx], ends[1][idx], ends[2][idx]), reduce[idx], stage)
        out = stage(pred, up[0][idx], up[1][idx])
        for acc, v in zip(ends, out, strict=True):
            np.maximum.at(acc, parent[idx], v)
    root = _reduced((ends[0][:1], ends[1][:1], ends[2][:1]), reduce[:1], stage)
    have = (np.empty(n), np.empty(n), np.empty(n))
    for h, v in zip(have, root, strict=True):
        h[0] = v[0]
    for depth in range(1, len(levels)):
        idx = levels[depth]
        par = parent[idx]
        out = stage((have[0][par], have[1][par], have[2][par]), down[0][idx], down[1][idx])
        for h, v in zip(have, out, strict=True):
            h[idx] = v
    return float(have[0].max() if chunks == 1 else have[2].max())


def _reduced(pred: tuple[np.ndarray, np.ndarray, np.ndarray], reduce: np.ndarray,
             stage: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``pred`` after the reductions' stage where a rank reduces (``reduce > 0``), as it is elsewhere."""
    mask = reduce > 0.0
    if not mask.any():
        return pred
    out = stage(pred, reduce, reduce)
    return np.where(mask, out[0], pred[0]), np.where(mask, out[1], pred[1]), np.where(mask, out[2], pred[2])
