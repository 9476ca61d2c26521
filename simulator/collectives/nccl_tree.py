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

Execution (``src/device/all_reduce.h``, ``runTreeSplit``): a rank's threads are split in two groups that run at once,
each over the channel's steps in order: the reduce group receives step j from the rank's children, adds it to its own
and sends the sum up; the broadcast group receives the final step j from the parent and forwards it to the children; the
root reduces and sends down. Step j goes down while step j + 1 goes up, on the two directions of the full-duplex links.
NCCL's tree step is its chunk (``src/enqueue.cc``, NCCL 2.2x; :func:`tree_step`): a step of the protocol's channel
buffer (512 KiB of payload with Simple, 32 KiB with LL, 576,000 bytes with LL128, which NCCL halves while the message
gives a channel few chunks), so a 16 GiB allreduce on 8 channels runs 4,096 steps a channel. LL and LL128 pass lines on
as they arrive inside a server (cut-through: their steps here are a warp's lines, :func:`.protocols.forward_grain`),
while a connection between servers holds back one NCCL step (its proxy sends a step once all of it is in). As a schedule
(:func:`tree_allreduce`): a tree's steps are cut into at most ``TREE_CHUNKS`` chunks a channel, and a chunk's steps over
a stage (a connection, a rank's reductions) become its first, middle and last ops (:mod:`.steps`): exactly the steps'
pipeline where stages run at their own pace, at a size that does not grow with the message. Per chunk part, a
connection's transfer after the same connection's previous one, a rank's send up after its reductions of the part, its
sends down after it holds the final part. The protocol's per-hop latency is paid by the pipeline's first step only, as
its transfers' own fixed seconds (message overhead, route latency): the later steps stream behind it (``STREAMED``:
NCCL's 8 steps in flight hide a step's latency behind the bytes before it); every transfer's rate is capped at the
channel's cap over twice its trees (:mod:`.caps`: NCCL's tree cap is its graph channel's, which both trees share; half
of a tree's threads push each direction).

Closed form (:func:`pipeline_time_lists`, over arrays :func:`pipeline_time_arrays`): the longest path of the
schedule's ops, one chunk at a time. Per stage and chunk, the first op ends at max(the stage's previous chunk's
end, its predecessors' first ops' ends) plus its seconds, the middle right after it, the last at max(the middle's
end, the predecessors' last ops' ends) plus its seconds (a flow shop over the three ops); a rank's reductions of
a part are one stage after all its children's sends (their seconds the children's count times one reduction). It
is the engine's time exactly where no two stages share a link or a rank's compute stream (one child each).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, TypeVar

import numpy as np

from simulator.collectives.base import CollBuilder, chunk_bounds
from simulator.collectives.fabric import Fabric
from simulator.collectives.protocols import forward_grain, step_payload
from simulator.collectives.steps import chunk_steps, first_steps, grain_steps, parts, step_counts
from simulator.schedule.core import STREAMED, Schedule
from simulator.schedule.op import OpGrid, recv_of, transfer_send
from simulator.schedule.oplist import KIND_INDEX, Indexed

__all__ = ["Tree", "btree_parent", "channel_trees", "dtree_parents", "pipeline_time",
           "pipeline_time_arrays", "pipeline_time_lists", "tree_allreduce", "tree_chunks", "tree_parts", "tree_step"]

_SEND, _RECV, _COMPUTE = KIND_INDEX["send"], KIND_INDEX["recv"], KIND_INDEX["compute"]
_UP_SEND, _UP_RECV, _UP_REDUCE = 0, 1, 2  # the slots of a rank's ops in a part's up phase (an OpGrid of width 3)
TREE_CHUNKS = 16  # a channel's chunks at most (its trees share them): op groups, not NCCL's steps (see .steps)


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
    """The trees channel ``c`` (whose ring is ``ring``) runs: one on one server, NCCL's two across servers (kept
    per fabric: the tuner and the build ask for the same ones)."""
    key = ("channel trees", tuple(ring), c)
    hit = fabric.memo.get(key)
    if hit is None:
        hit = fabric.memo[key] = _channel_trees(fabric, ring, c)
    return list(hit)


def _channel_trees(fabric: Fabric, ring: Sequence[int], c: int) -> tuple[Tree, ...]:
    groups = fabric.groups(ring)
    if len(groups) == 1:
        s = c % len(ring)
        chains = [[*ring[s:], *ring[:s]]]
    else:
        chains = [[g[(s + j) % len(g)] for j in range(len(g))] for g in groups for s in [fabric.entry(c, len(g))]]
    inside = {chain[j + 1]: chain[j] for chain in chains for j in range(len(chain) - 1)}
    if len(chains) == 1:
        return (Tree.of(chains[0][0], inside),)
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
    return tuple(trees)


def tree_step(nbytes: float, channels: int, protocol: str, nodes: int, ranks: int) -> float:
    """Payload bytes of one step of NCCL's tree: its chunk (``src/enqueue.cc``, NCCL 2.2x): a step of the
    protocol's channel buffer (:func:`.protocols.step_payload`); with LL128, halved while the message gives a
    channel fewer than ``nsteps x 64 / ppn`` chunks (down to 128 KiB) and then ``nsteps x 16 / ppn`` (down to 32 KiB),
    ``nsteps = 1 + log2(nodes) + 0.1 ppn`` (``ppn``: ranks per node; integer division on the left, as NCCL's)."""
    chunk = step_payload(protocol)
    if protocol == "LL128":
        ppn = ranks / nodes
        nsteps = 1 + (nodes.bit_length() - 1) + 0.1 * ppn
        while nbytes // (channels * chunk) < nsteps * 64 / ppn and chunk > 131072:
            chunk /= 2
        while nbytes // (channels * chunk) < nsteps * 16 / ppn and chunk > 32768:
            chunk /= 2
    return chunk


def tree_chunks(nbytes: float, step: float, trees: int, grain: float | None = None) -> tuple[int, int, int]:
    """(steps, chunks, head) of one of ``trees`` trees' pipeline of ``nbytes`` in NCCL steps of ``step`` bytes
    passed on every ``grain`` bytes inside a server: at most ``TREE_CHUNKS`` chunks a channel, the steps the grains,
    ``head`` the grains a network connection holds back (:func:`.steps.grain_steps`; each chunk's steps are three
    ops)."""
    return grain_steps(nbytes, step, grain, max(1, TREE_CHUNKS // trees))


def tree_parts(n: int, elem_bytes: int, channels: int, protocol: str, nodes: int, ranks: int) -> int:
    """The parts (ops per rank and stage: a chunk's first, middle and last, :mod:`.steps`) of the first channel's
    trees in an allreduce of ``n`` elements on ``channels`` channels, as :func:`tree_allreduce` cuts them (what the
    size limits count: a rank's ops of a channel are about five a part, :func:`~simulator.support.limits.
    collective_ops`)."""
    trees = 2 if nodes > 1 else 1
    step = tree_step(n * elem_bytes, channels, protocol, nodes, ranks)
    lo, hi = chunk_bounds(n, channels)[0]
    out = 0
    for a, z in chunk_bounds(hi - lo, trees):
        if z > a:
            steps, chunks, _ = tree_chunks((z - a) * elem_bytes, step, trees, forward_grain(protocol))
            out += sum(len(parts(g)) for g in step_counts(steps, chunks))
    return out


def tree_allreduce(b: CollBuilder, trees: Sequence[Tree]) -> None:
    """``b``'s range allreduced over ``trees``, tree i taking the i-th of equal parts (module docstring), in steps
    of ``b.slice_bytes`` (:func:`tree_step`)."""
    if b.n == 0:
        return
    start = {r: b.front[r] for r in trees[0].order}
    ranks, ids = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]  # every tree's last ops, by rank
    for tree, (lo, hi) in zip(trees, chunk_bounds(b.n, len(trees)), strict=True):
        if hi > lo:
            steps, chunks, head = tree_chunks((hi - lo) * b.elem_bytes, b.slice_bytes, len(trees), b.grain)
            tree_ranks, tree_ops = _pipeline(b, tree, lo, hi, start, steps, chunks, len(trees), head)
            ranks.append(tree_ranks)
            ids.append(tree_ops)
    rank, op = np.concatenate(ranks), np.concatenate(ids)
    by_rank = np.argsort(rank, kind="stable")  # a rank's ops: the first tree's, then the next one's...
    rank, flat = rank[by_rank], op[by_rank].tolist()
    keys = np.fromiter(start, dtype=np.int64, count=len(start))
    firsts = np.searchsorted(rank, keys, side="left").tolist()
    lasts = np.searchsorted(rank, keys, side="right").tolist()
    for r, a, z in zip(start, firsts, lasts, strict=True):  # in place: a channel's view shares its builder's frontier
        b.front[r] = tuple(flat[a:z]) or start[r]


def _pipeline(b: CollBuilder, tree: Tree, lo: int, hi: int, start: Mapping[int, tuple[int, ...]],
              steps: int, chunks: int, trees: int, head: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """One of ``trees`` trees' pipeline over elements ``lo:hi`` of ``b``'s range, ``steps`` steps in ``chunks``
    chunks, each chunk's steps as its first, middle and last (:mod:`.steps`); returns every rank's last ops
    (:func:`_last_ops`). A
    connection between servers holds ``head`` steps in its first op of a chunk (LL, LL128: one NCCL step of grains).

    Per part of a chunk, the ops of a chunk as one step would be: a rank's send up after its reductions and its
    previous send up, its parent's reduction after the receive, sends down once the rank holds the part. A first
    part also waits for its connection's previous chunk; a middle part waits only for its own first part (each
    op of it after the same op of the first part); a last part also waits for the same op of the middle (or first)
    part, and carries the chunk's data (buffers, reductions).

    Op order, part after part: up, rank after rank from the bottom (the tree's order reversed), a rank's send to its
    parent, its receive and (not in a middle part) the parent's reduction of it; in a middle part then each rank's
    reductions of all its children's steps, as one op; then down, child after child in the tree's order, the
    parent's send and the child's receive. Built over arrays of the tree's positions (:class:`_Positions`), a part
    at a time, and appended as one block (:meth:`Schedule.add_ops`)."""
    sched, size = b.sched, b.elem_bytes * b.wire
    cap = float(b.cap * b.wire / (2 * trees))  # a direction: half of a tree's threads; the trees share the channel's
    t = _Positions.of(tree, start, b, head > 1)
    n = t.n
    up_last, down_last, got, red_end = (np.full(n, -1, np.int64) for _ in range(4))
    out = _Columns(b.tag, f"{b.tag}.reduce", b.dtype, f"reduce-{b.op}", b.buf, (b.buf,))
    nid = len(sched.ops)
    for k, (a, z, g) in enumerate(chunk_steps(hi - lo, steps, chunks)):
        if z == a:
            continue
        clo, chi = b.offset + lo + a, b.offset + lo + z
        held = parts(g, head)  # a network connection's parts, where it holds back a step
        mine: tuple[np.ndarray, ...] = ()  # the previous part's ops by position: send up, its recv, send down, recv
        for i, part in enumerate(parts(g)):
            share = part.steps / g
            nbytes = float((chi - clo) * size * share)
            net_bytes = float((chi - clo) * size * (held[i].steps / g))
            flops, red_bytes = float((chi - clo) * share), float(3.0 * (chi - clo) * b.elem_bytes * share)
            up_size = np.where(t.cross_up, net_bytes, nbytes) if t.cross_up is not None else nbytes
            down_size = np.where(t.cross_down, net_bytes, nbytes) if t.cross_down is not None else nbytes
            first_hop = k == 0 and part.first
            after = mine if part.last and mine else ()  # a last part after its chunk's earlier one
            if part.middle:
                mine = _middle(t, out, nid, mine, red_end, up_size, down_size, flops, red_bytes, cap, clo, chi)
            else:
                mine = _edge(t, out, nid, after, up_last, down_last, red_end, up_size, down_size, flops, red_bytes,
                             cap, clo, chi, first_hop, part.last)
            nid = out.end
        up_last, down_last, got = mine[0], mine[2], mine[3]
    if out.parts:
        out.append_to(sched)
    return _last_ops(t, up_last, down_last, got)


def _last_ops(t: _Positions, up: np.ndarray, down: np.ndarray, got: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A pipeline's last ops (by position: its last send up, send down from the parent and receive of it; -1:
    none) as (rank, op) arrays, position after position in the tree's order and, at a position, its send up, its
    receive from its parent, then its sends down to its children in their order."""
    p = np.arange(1, t.n)
    has_up, has_down = up[1:] >= 0, down[1:] >= 0
    n_up, n_down = int(has_up.sum()), int(has_down.sum())
    pos = np.concatenate([p[has_up], p[has_down], t.par[1:][has_down]])
    what = np.repeat(np.arange(3), [n_up, n_down, n_down])
    child = np.concatenate([np.zeros(n_up + n_down, np.int64), p[has_down]])
    op = np.concatenate([up[1:][has_up], got[1:][has_down], down[1:][has_down]])
    order = np.lexsort((child, what, pos))
    return t.rank[pos[order]], op[order]


@dataclass(frozen=True)
class _Positions:
    """A tree's ranks by position (its order: top-down, every rank's children next to each other, in its order)."""

    n: int
    rank: np.ndarray  # the rank at each position
    par: np.ndarray  # the parent's position (-1 at the root, position 0)
    kids: np.ndarray  # children at each position
    first_child: np.ndarray  # the first child's position (-1: none)
    start: np.ndarray  # (n, w): each rank's ops to start after, padded with -1
    cross_up: np.ndarray | None  # position p's connection to its parent leaves the server (None: no head held)
    cross_down: np.ndarray | None  # ... from its parent
    hop_up: np.ndarray  # the protocol's per-hop latency to the parent (position 0's: 0)
    hop_down: np.ndarray  # ... from the parent

    @classmethod
    def of(cls, tree: Tree, start: Mapping[int, tuple[int, ...]], b: CollBuilder, held: bool) -> _Positions:
        """``tree``'s positions; ``start``: each rank's ops to start after; ``b.net_of`` says which connections
        leave the server (``b.hop_pair``: their latencies inside and across), and where a connection holds back
        steps (``held``) which carry a step's head."""
        if b.net_of is None:
            raise ValueError("a tree pipeline needs its builder's net_of and hop_pair (channels.build sets them)")
        order = tree.order
        n = len(order)
        pos = {r: i for i, r in enumerate(order)}
        par = np.array([-1, *(pos[tree.parent[r]] for r in order[1:])], dtype=np.int64)
        if n > 2 and (np.diff(par[1:]) < 0).any():
            raise ValueError("a tree's order must list every rank's children together, parents first")
        kids = np.bincount(par[1:], minlength=n)
        first_child = np.where(kids > 0, np.searchsorted(par[1:], np.arange(n), side="left") + 1, -1)
        lens = np.fromiter(map(len, map(start.__getitem__, order)), dtype=np.int64, count=n)
        pad = np.full((n, max(1, int(lens.max()))), -1, dtype=np.int64)
        flat = np.fromiter(chain.from_iterable(map(start.__getitem__, order)), dtype=np.int64, count=int(lens.sum()))
        offsets = np.cumsum(lens) - lens
        pad[np.repeat(np.arange(n), lens), np.arange(len(flat)) - np.repeat(offsets, lens)] = flat
        rank = np.array(order, dtype=np.int64)
        kid, parent = rank[1:], rank[par[1:]]
        net_up = np.concatenate([[False], b.net_of(kid, parent)])
        net_down = np.concatenate([[False], b.net_of(parent, kid)])
        hop_up, hop_down = (np.where(net, b.hop_pair[1], b.hop_pair[0]) for net in (net_up, net_down))
        hop_up[0] = hop_down[0] = 0.0
        return cls(n, rank, par, kids, first_child, pad, net_up if held else None, net_down if held else None,
                   hop_up, hop_down)


class _Columns:
    """A tree pipeline's ops as columns, a part at a time; :meth:`append_to` adds them as one block."""

    def __init__(self, tag: str, red_name: str, dtype: str, red_fn: str, buf: str, data_args: tuple[str, ...]) -> None:
        self.tag, self.red_name, self.dtype, self.red_fn, self.buf = tag, red_name, dtype, red_fn, buf
        self.args_table: list[tuple[str, ...]] = [(), data_args]  # per op an index: 0 none, 1 the buffer, 2.. tmps
        self.parts: list[dict[str, np.ndarray]] = []
        self.deps: list[tuple[np.ndarray, np.ndarray]] = []  # per part: (counts, flat)
        self.end = 0

    def tmps(self, ranks: np.ndarray, clo: int) -> int:
        """Transport buffers of a chunk's data part, one per rank (``tag.tmp<lo>.<rank>``): their first index."""
        first = len(self.args_table)
        self.args_table += [(f"{self.tag}.tmp{clo}.{r}",) for r in ranks.tolist()]
        return first

    def add(self, first: int, deps: np.ndarray, **cols: np.ndarray) -> None:
        """One part's ops from id ``first``: its deps an (m, k) array padded with -1, the columns as ``add_ops``'s
        (``comp``: compute ops, ``data``: ones that carry the chunk's reduction)."""
        given = deps >= 0
        self.deps.append((given.sum(axis=1), deps[given]))
        self.parts.append(cols)
        self.end = first + len(cols["kind"])

    def append_to(self, sched: Schedule) -> None:
        col = {name: np.concatenate([p[name] for p in self.parts]) for name in self.parts[0]}
        counts = np.concatenate([c for c, _ in self.deps])
        starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        comp = col.pop("comp").astype(np.int64)
        data = col.pop("data").astype(np.int64)
        sched.add_ops(col.pop("kind"), col.pop("rank"), (starts, np.concatenate([f for _, f in self.deps])),
                      col.pop("match"), name=Indexed([self.tag, self.red_name], comp),
                      dtype=Indexed(["fp32", self.dtype], comp), fn=Indexed(["", self.red_fn], data),
                      out=Indexed(["", self.buf], data), args=Indexed(self.args_table, col.pop("args")),
                      fused=comp.astype(bool), coll=self.tag, **col)


def _padded(*cols: np.ndarray) -> np.ndarray:
    """Columns of ids (each (m,) or (m, k)) side by side."""
    return np.hstack([c[:, None] if c.ndim == 1 else c for c in cols])


def _interleave(*mats: np.ndarray) -> np.ndarray:
    """Rows of the (m, k_i) matrices interleaved (row 0 of each, then row 1 of each, ...), padded with -1."""
    width = max(m.shape[1] for m in mats)
    full = [np.pad(m, ((0, 0), (0, width - m.shape[1])), constant_values=-1) for m in mats]
    return np.stack(full, axis=1).reshape(-1, width)


def _edge(t: _Positions, out: _Columns, base: int, after: tuple[np.ndarray, ...], up_last: np.ndarray,
          down_last: np.ndarray, red_end: np.ndarray, up_size: Any, down_size: Any, flops: float, red_bytes: float,
          cap: float, clo: int, chi: int, first_hop: bool, data: bool) -> tuple[np.ndarray, ...]:
    """A chunk's first or last part (``data``: its last, which carries the chunk's data; ``after``: the chunk's
    previous part's ops, empty for a first part): up, a send, its recv and the parent's reduction per rank; down, a
    send and a recv per child. Returns the part's ops by position (send up, its recv, send down, its recv)."""
    n, par, kids, m = t.n, t.par, t.kids, t.n - 1
    pos = np.arange(n - 1, 0, -1)  # the up phase's ranks (bottom-up)
    q = par[pos]
    grid = OpGrid(base, 3)  # per rank up (bottom-up): its send up, the parent's recv, the parent's reduction
    send = grid.ids(m, _UP_SEND)
    red_of = grid.id(n - 1 - t.first_child, _UP_REDUCE)  # a rank's last reduction: its first child's (the last up)
    acc = t.start[pos].copy()
    mid = kids[pos] > 0
    acc[mid] = -1
    acc[mid, 0] = red_of[pos[mid]]
    none = np.full(m, -1, np.int64)
    prev = after[0][pos] if after else up_last[pos]
    send_deps = _padded(acc, prev)
    recv_deps = _padded(t.start[q], after[1][pos] if after else none)
    sib = np.zeros(m, dtype=bool)  # the previous rank up is a sibling: the reduction follows its
    sib[1:] = par[pos[1:] + 1] == q[1:]
    red_deps = _padded(t.start[q], red_end[q])
    red_deps[sib] = -1
    red_deps[sib, 0] = grid.id(np.flatnonzero(sib[1:]), _UP_REDUCE)
    red_deps = _padded(recv_of(send), red_deps)
    tmp = np.zeros(m, np.int64) if not data else out.tmps(t.rank[pos], clo) + np.arange(m)
    floor = t.hop_up[pos] if first_hop else np.full(m, STREAMED)
    size = up_size[pos] if isinstance(up_size, np.ndarray) else np.full(m, up_size)
    zeros = np.zeros(m)
    up = {"kind": _cycle((_SEND, _RECV, _COMPUTE), m, np.uint8), "rank": _stack(t.rank[pos], t.rank[q], t.rank[q]),
          "match": _stack(recv_of(send), send, none), "nbytes": _stack(size, size, np.full(m, red_bytes)),
          "flops": _stack(zeros, zeros, np.full(m, flops)), "floor_s": _stack(floor, zeros, zeros),
          "rate_cap": _stack(np.full(m, cap), zeros, zeros), "args": _stack(np.full(m, int(data)), tmp, tmp),
          "into": np.zeros(3 * m, dtype=bool), "comp": _cycle((False, False, True), m, bool),
          "data": _cycle((False, False, data), m, bool), "lo": np.full(3 * m, clo), "hi": np.full(3 * m, chi)}
    out.add(base, _interleave(send_deps, recv_deps, red_deps), **up)
    last_red = np.where(kids > 0, red_of, -1)
    red_end[kids > 0] = last_red[kids > 0]
    sent = np.full(n, -1, np.int64)
    sent[pos] = send
    up_ops = (sent, _by_pos(n, pos, recv_of(send)))
    return (*up_ops, *_down(t, out, grid.after(m), up_ops, after, down_last, down_size, cap, clo, chi, first_hop,
                            data, int(last_red[0])))


def _middle(t: _Positions, out: _Columns, base: int, before: tuple[np.ndarray, ...], red_end: np.ndarray,
            up_size: Any, down_size: Any, flops: float, red_bytes: float, cap: float, clo: int,
            chi: int) -> tuple[np.ndarray, ...]:
    """A chunk's middle part: up, a send and its recv per rank (bottom-up), each after the same op of the first
    part; every rank's reductions of all its children's steps as one op (bottom-up), after its first part's; down,
    a send and a recv per child (``STREAMED``: no fixed seconds). Returns the part's ops by position."""
    n, m = t.n, t.n - 1
    pos = np.arange(n - 1, 0, -1)
    send = transfer_send(base, np.arange(m))
    size = up_size[pos] if isinstance(up_size, np.ndarray) else np.full(m, up_size)
    out.add(base, _interleave(before[0][pos][:, None], before[1][pos][:, None]), **_transfers(
        t.rank[pos], t.rank[t.par[pos]], send, size, np.full(m, STREAMED), cap, 0, False, clo, chi))
    qs = np.flatnonzero(t.kids > 0)[::-1]  # bottom-up
    reds = out.end + np.arange(len(qs))
    kq, r = t.kids[qs], len(qs)
    out.add(out.end, red_end[qs][:, None], kind=np.full(r, _COMPUTE, np.uint8), rank=t.rank[qs],
            match=np.full(r, -1, np.int64), nbytes=red_bytes * kq, flops=flops * kq, floor_s=np.zeros(r),
            rate_cap=np.zeros(r), args=np.zeros(r, np.int64), into=np.zeros(r, dtype=bool),
            comp=np.ones(r, dtype=bool), data=np.zeros(r, dtype=bool), lo=np.full(r, clo), hi=np.full(r, chi))
    red_end[qs] = reds
    up_ops = (_by_pos(n, pos, send), _by_pos(n, pos, recv_of(send)))
    return (*up_ops, *_down(t, out, out.end, up_ops, before, None, down_size, cap, clo, chi, False, False, None))


def _down(t: _Positions, out: _Columns, base: int, up_ops: tuple[np.ndarray, ...], after: tuple[np.ndarray, ...],
          down_last: np.ndarray | None, down_size: Any, cap: float, clo: int, chi: int, first_hop: bool, data: bool,
          have_root: int | None) -> tuple[np.ndarray, np.ndarray]:
    """A part's down phase, child after child in the tree's order: the parent's send once it holds the part (the
    root: its last reduction ``have_root``; another rank: its receive of this part) and the child's receive after
    its own send up. ``have_root`` None: a middle part, each op after the same op of ``after`` (the first part's).
    Returns the part's sends and receives down by position (the child's)."""
    n, m = t.n, t.n - 1
    ch = np.arange(1, n)
    par = t.par[ch]
    send = transfer_send(base, np.arange(m))
    if have_root is None:
        send_deps, recv_deps = after[2][ch][:, None], after[3][ch][:, None]
        floor = np.full(m, STREAMED)
    else:
        have = np.where(par == 0, have_root, recv_of(transfer_send(base, par - 1)))  # the parent's own recv down
        if after:
            send_deps, recv_deps = _padded(have, after[2][ch]), _padded(up_ops[0][ch], after[3][ch])
        else:
            assert down_last is not None
            send_deps, recv_deps = _padded(have, down_last[ch]), up_ops[0][ch][:, None]
        floor = t.hop_down[ch] if first_hop else np.full(m, STREAMED)
    size = down_size[ch] if isinstance(down_size, np.ndarray) else np.full(m, down_size)
    out.add(base, _interleave(send_deps, recv_deps), **_transfers(t.rank[par], t.rank[ch], send, size, floor, cap,
                                                                   int(data), True, clo, chi))
    return _by_pos(n, ch, send), _by_pos(n, ch, recv_of(send))


def _transfers(src: np.ndarray, dst: np.ndarray, send: np.ndarray, size: np.ndarray, floor: np.ndarray, cap: float,
               args: int, into: bool, clo: int, chi: int) -> dict[str, np.ndarray]:
    """Columns of transfers (send, then recv, each), sends from id ``send[k]``, both ends reading / writing the
    buffers of ``args`` (an index into the args table), the recv ``into`` them or not."""
    m = len(src)
    zeros = np.zeros(m)
    return {"kind": _cycle((_SEND, _RECV), m, np.uint8), "rank": _stack(src, dst), "match": _stack(recv_of(send), send),
            "nbytes": _stack(size, size), "flops": np.zeros(2 * m), "floor_s": _stack(floor, zeros),
            "rate_cap": _stack(np.full(m, cap), zeros), "args": np.full(2 * m, args, np.int64),
            "into": _cycle((False, into), m, bool), "comp": np.zeros(2 * m, dtype=bool),
            "data": np.zeros(2 * m, dtype=bool), "lo": np.full(2 * m, clo), "hi": np.full(2 * m, chi)}


def _cycle(values: tuple[Any, ...], m: int, dtype: Any) -> np.ndarray:
    """``values`` repeated ``m`` times, one after the other."""
    return np.tile(np.array(values, dtype=dtype), m)


def _stack(*cols: np.ndarray) -> np.ndarray:
    """1-D columns interleaved (entry 0 of each, then entry 1 of each, ...)."""
    return np.stack(cols, axis=1).reshape(-1)


def _by_pos(n: int, pos: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Ids by tree position (-1 where none)."""
    out = np.full(n, -1, np.int64)
    out[pos] = ids
    return out


_T = TypeVar("_T", float, np.ndarray)
Stage = tuple[float, float]  # a connection's (fixed seconds of the pipeline's first step, a step's bytes' seconds)


def _part(prev: float, pred_first: float, pred_last: float, first: float, middle: float, last: float,
          g: int) -> tuple[float, float]:
    """(end of its first op, end of its last op) of a stage's chunk of ``g`` steps (:mod:`.steps`): the first op
    after the stage's previous chunk (``prev``) and its predecessors' first ops; the middle right after it; the last
    after the middle and the predecessors' last ops. ``first``, ``middle``, ``last``: the three ops' seconds."""
    f = max(prev, pred_first) + first
    if g == 1:
        return f, f
    return f, max(f + middle if g > 2 else f, pred_last) + last


def _costs(stage: tuple[_T, _T], first_chunk: bool, inner: float, held: Any = 1) -> tuple[_T, _T, _T]:
    """A connection's first, middle and last ops' seconds in a chunk of ``inner + 2`` steps, its first op
    ``held`` of them (:func:`.steps.parts`; an int or an array): their steps' bytes, and the pipeline's very first
    step its fixed seconds (its latency; the later steps stream behind it)."""
    first, step = stage
    if isinstance(held, int) and held == 1:
        return (first + step if first_chunk else step), inner * step, step
    head = held * step
    return (first + head if first_chunk else head), (inner + 1 - held) * step, step


def pipeline_time_lists(parent: Sequence[int], chunks: Sequence[int], up: Sequence[Stage], down: Sequence[Stage],
                        reduce: Sequence[float], kids: Sequence[bool], heads: Sequence[int] | None = None) -> float:
    """Seconds from the launch until the last chunk has reached every rank: the longest path of the schedule's ops
    (module docstring), one chunk at a time. Positions index the tree's ranks top-down (0: the root, ``parent[p]``
    p's parent's position); ``chunks``: each chunk's steps; ``up[p]`` / ``down[p]``: the connection to / from p's
    parent (position 0's ignored); ``reduce[p]``: seconds of p's reductions of one step (all its children's);
    ``kids[p]``: p has children (it reduces, a stage of its own, even of no time); ``heads[p]``: the steps the
    connections between p and its parent hold back (:func:`.steps.parts`; ``None``: one each)."""
    n = len(parent)
    prev_up, prev_red, prev_down = [0.0] * n, [0.0] * n, [0.0] * n
    have = [0.0] * n
    for k, g in enumerate(chunks):
        inner = g - 2.0
        acc_first, acc_last = [0.0] * n, [0.0] * n  # the latest of a rank's children's sends up
        root = (0.0, 0.0)
        for p in range(n - 1, -1, -1):  # children before parents
            ready = (0.0, 0.0)  # a leaf holds its part from the start
            if kids[p]:
                r = reduce[p]
                ready = _part(prev_red[p], acc_first[p], acc_last[p], r, inner * r, r, g)
                prev_red[p] = ready[1]
            if p == 0:
                root = ready
                break
            held = 1 if heads is None else first_steps(g, heads[p])
            f, m, last = _costs(up[p], k == 0, inner, held)
            out = _part(prev_up[p], ready[0], ready[1], f, m, last, g)
            prev_up[p] = out[1]
            q = parent[p]
            acc_first[q] = max(acc_first[q], out[0])
            acc_last[q] = max(acc_last[q], out[1])
        firsts = [root[0]] + [0.0] * (n - 1)
        have[0] = root[1]
        for p in range(1, n):
            held = 1 if heads is None else first_steps(g, heads[p])
            f, m, last = _costs(down[p], k == 0, inner, held)
            q = parent[p]
            firsts[p], have[p] = _part(prev_down[p], firsts[q], have[q], f, m, last, g)
            prev_down[p] = have[p]
    return max(have)


def pipeline_time(tree: Tree, chunks: Sequence[int], up: Mapping[int, Stage], down: Mapping[int, Stage],
                  reduce: Mapping[int, float], heads: Mapping[int, int] | None = None) -> float:
    """:func:`pipeline_time_lists` by rank: ``up[r]``, ``down[r]`` the connections to and from r's parent,
    ``reduce[r]`` the seconds of r's reductions of one step (absent: none), ``heads[r]`` the steps they hold back
    (absent: one)."""
    order = list(tree.order)
    pos = {r: i for i, r in enumerate(order)}
    zero = (0.0, 0.0)
    return pipeline_time_lists([-1] + [pos[tree.parent[r]] for r in order[1:]], chunks,
                               [zero] + [up[r] for r in order[1:]], [zero] + [down[r] for r in order[1:]],
                               [reduce.get(r, 0.0) for r in order], [bool(tree.children[r]) for r in order],
                               None if heads is None else [heads.get(r, 1) for r in order])


Stages = tuple[np.ndarray, np.ndarray]  # per position: the first step's fixed seconds, a step's bytes' seconds


def _part_arrays(prev: np.ndarray, pred_first: np.ndarray, pred_last: np.ndarray, first: np.ndarray,
                 middle: np.ndarray, last: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_part` over arrays."""
    f = np.maximum(prev, pred_first) + first
    if g == 1:
        return f, f
    return f, np.maximum(f + middle if g > 2 else f, pred_last) + last


def _held_arrays(heads: np.ndarray | None, idx: np.ndarray, g: int) -> Any:
    """:func:`.steps.first_steps` of the positions ``idx`` in a chunk of ``g`` steps (1 where no heads)."""
    if heads is None or g <= 2:
        return 1
    return np.clip(heads[idx], 1, max(1, g - 2))


def pipeline_time_arrays(parent: np.ndarray, levels: Sequence[np.ndarray], chunks: Sequence[int], up: Stages,
                         down: Stages, reduce: np.ndarray, kids: np.ndarray, heads: np.ndarray | None = None) -> float:
    """:func:`pipeline_time_lists` over arrays, one tree level at a time (the same operations on the same numbers).

    ``levels[d]``: the positions at depth d; ``up`` / ``down``: arrays of :data:`Stage`'s two numbers per position
    (position 0's ignored); ``kids``: a boolean array; ``heads``: an integer array (``None``: one each).
    """
    n = len(parent)
    prev_up, prev_red, prev_down = np.zeros(n), np.zeros(n), np.zeros(n)
    have = np.zeros(n)
    for k, g in enumerate(chunks):
        inner = g - 2.0
        acc_first, acc_last = np.zeros(n), np.zeros(n)
        for depth in range(len(levels) - 1, -1, -1):
            idx = levels[depth]
            ready_first, ready_last = np.zeros(len(idx)), np.zeros(len(idx))
            red = kids[idx]
            if red.any():
                at = idx[red]
                r = reduce[at]
                rf, rl = _part_arrays(prev_red[at], acc_first[at], acc_last[at], r, inner * r, r, g)
                prev_red[at] = rl
                ready_first[red], ready_last[red] = rf, rl
            if depth == 0:
                root = (ready_first, ready_last)
                break
            held = _held_arrays(heads, idx, g)
            f, m, last = _costs((up[0][idx], up[1][idx]), k == 0, inner, held)
            of, ol = _part_arrays(prev_up[idx], ready_first, ready_last, f, m, last, g)
            prev_up[idx] = ol
            np.maximum.at(acc_first, parent[idx], of)
            np.maximum.at(acc_last, parent[idx], ol)
        firsts = np.zeros(n)
        firsts[0], have[0] = root[0][0], root[1][0]
        for depth in range(1, len(levels)):
            idx = levels[depth]
            par = parent[idx]
            held = _held_arrays(heads, idx, g)
            f, m, last = _costs((down[0][idx], down[1][idx]), k == 0, inner, held)
            df, dl = _part_arrays(prev_down[idx], firsts[par], have[par], f, m, last, g)
            firsts[idx], have[idx] = df, dl
            prev_down[idx] = dl
    return float(have.max())
