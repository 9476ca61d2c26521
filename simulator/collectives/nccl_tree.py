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
from typing import Any, TypeVar

import numpy as np

from simulator.collectives.base import CollBuilder, chunk_bounds
from simulator.collectives.fabric import Fabric
from simulator.collectives.protocols import step_payload
from simulator.collectives.steps import chunk_steps, first_steps, grain_steps, parts
from simulator.schedule import STREAMED, Op, compute_op, transfer_ops

__all__ = ["Tree", "btree_parent", "channel_trees", "dtree_parents", "pipeline_time",
           "pipeline_time_arrays", "pipeline_time_lists", "tree_allreduce", "tree_chunks", "tree_step"]

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


def tree_allreduce(b: CollBuilder, trees: Sequence[Tree]) -> None:
    """``b``'s range allreduced over ``trees``, tree i taking the i-th of equal parts (module docstring), in steps
    of ``b.slice_bytes`` (:func:`tree_step`)."""
    if b.n == 0:
        return
    start = {r: b.front[r] for r in trees[0].order}
    ends: dict[int, list[int]] = {r: [] for r in start}
    for tree, (lo, hi) in zip(trees, chunk_bounds(b.n, len(trees)), strict=True):
        if hi > lo:
            steps, chunks, head = tree_chunks((hi - lo) * b.elem_bytes, b.slice_bytes, len(trees), b.grain)
            for r, ops in _pipeline(b, tree, lo, hi, start, steps, chunks, len(trees), head).items():
                ends[r] += ops
    for r in start:  # in place: a channel's view shares its builder's frontier
        b.front[r] = tuple(dict.fromkeys(ends[r])) or start[r]


def _pipeline(b: CollBuilder, tree: Tree, lo: int, hi: int, start: Mapping[int, tuple[int, ...]],
              steps: int, chunks: int, trees: int, head: int = 1) -> dict[int, list[int]]:
    """One of ``trees`` trees' pipeline over elements ``lo:hi`` of ``b``'s range, ``steps`` steps in ``chunks``
    chunks, each chunk's steps as its first, middle and last (:mod:`.steps`); returns every rank's last ops. A
    connection between servers holds ``head`` steps in its first op of a chunk (LL, LL128: one NCCL step of grains).

    Per part of a chunk, the ops of a chunk as one step would be: a rank's send up after its reductions and its
    previous send up, its parent's reduction after the receive, sends down once the rank holds the part. A first
    part also waits for its connection's previous chunk; a middle part waits only for its own first part (each
    op of it after the same op of the first part); a last part also waits for the same op of the middle (or first)
    part, and carries the chunk's data (buffers, reductions). Built whole and appended at once
    (:meth:`Schedule.extend`)."""
    sched, size = b.sched, b.elem_bytes * b.wire
    cap = float(b.cap * b.wire / (2 * trees))  # a direction: half of a tree's threads; the trees share the channel's
    up_last: dict[int, int] = {}  # rank -> its last send up (the previous chunk's)
    down_last: dict[int, int] = {}  # child -> its parent's last send to it
    got: dict[int, int] = {}  # rank -> its receive of the final chunk
    red_end: dict[int, tuple[int, ...]] = {}  # rank -> the end of its reductions of the previous part
    bottom_up = tree.order[::-1]
    parent, children, hop_s, tag, args = tree.parent, tree.children, b.hop_s, b.tag, (b.buf,)
    crosses = b.crosses if head > 1 else None  # a network connection's first op holds ``head`` steps
    red_name, red_fn, dtype, buf, elem = f"{b.tag}.reduce", f"reduce-{b.op}", b.dtype, b.buf, b.elem_bytes
    ops: list[Op] = []
    add = ops.append
    nid = len(sched.ops)
    for k, (a, z, g) in enumerate(chunk_steps(hi - lo, steps, chunks)):
        if z == a:
            continue
        clo, chi = b.offset + lo + a, b.offset + lo + z
        before: dict[tuple[str, int], int] = {}  # the previous part's op per stage: (what, rank) -> op id
        held = parts(g, head)  # a network connection's parts, where it holds back a step
        for i, part in enumerate(parts(g)):
            share = part.steps / g
            nbytes = float((chi - clo) * size * share)
            net_bytes = float((chi - clo) * size * (held[i].steps / g))
            flops, red_bytes = float((chi - clo) * share), float(3.0 * (chi - clo) * elem * share)
            data, middle = part.last, part.middle
            sargs: tuple[str, ...] = args if data else ()
            rfn, rout = (red_fn, buf) if data else ("", "")
            mine: dict[tuple[str, int], int] = {}
            acc: dict[int, tuple[int, ...]] = {}  # rank -> ops after which it holds its subtree's sum of the part
            sent: dict[int, int] = {}
            part_got: dict[int, int] = {}
            for r in bottom_up:
                q = parent.get(r)
                if q is None:
                    continue
                if middle:
                    send_deps: tuple[int, ...] = (before["up", r],)
                    recv_deps: tuple[int, ...] = (before["upr", r],)
                    floor = STREAMED
                else:
                    prev = (before["up", r],) if part.last and before else ((up_last[r],) if r in up_last else ())
                    send_deps, recv_deps = (*acc.get(r, start[r]), *prev), start[q]
                    if part.last and before:
                        recv_deps = (*recv_deps, before["upr", r])
                    floor = (hop_s(r, q) if hop_s is not None else 0.0) if k == 0 and part.first else STREAMED
                tmp = (f"{tag}.tmp{clo}.{r}",) if data else ()
                size_rq = net_bytes if crosses is not None and crosses(r, q) else nbytes
                send, recv = transfer_ops(nid, r, q, size_rq, tag, send_deps, recv_deps, sargs, tmp, clo, chi, tag,
                                          False, floor, cap)
                add(send)
                add(recv)
                mine["up", r], mine["upr", r] = nid, nid + 1
                sent[r] = nid
                nid += 2
                if not middle:  # q's reductions of the part, one child after the other, after its previous part's
                    deps = acc.get(q) or (*start[q], *red_end.get(q, ()))
                    add(compute_op(nid, q, red_name, flops, red_bytes, dtype, (nid - 1, *deps), rfn, rout, tmp, clo,
                                   chi, tag, fused=True))
                    acc[q] = (nid,)
                    nid += 1
            if middle:  # a rank's reductions of the middle steps, all its children's, as one op after its first's
                for q in bottom_up:
                    kids = len(children[q])
                    if kids:
                        add(compute_op(nid, q, red_name, flops * kids, red_bytes * kids, dtype, red_end[q], "", "", (),
                                       clo, chi, tag, fused=True))
                        red_end[q] = (nid,)
                        nid += 1
            else:
                red_end.update(acc)
            for r in tree.order:
                have = () if middle else acc[tree.root] if r == tree.root else (part_got[r],)
                for ch in children[r]:
                    if middle:
                        send_deps, recv_deps = (before["down", ch],), (before["downr", ch],)
                        floor = STREAMED
                    else:
                        if part.last and before:
                            send_deps = (*have, before["down", ch])
                            recv_deps = (sent[ch], before["downr", ch])
                        else:
                            send_deps = (*have, down_last[ch]) if ch in down_last else have
                            recv_deps = (sent[ch],)
                        floor = (hop_s(r, ch) if hop_s is not None else 0.0) if k == 0 and part.first else STREAMED
                    size_rc = net_bytes if crosses is not None and crosses(r, ch) else nbytes
                    send, recv = transfer_ops(nid, r, ch, size_rc, tag, send_deps, recv_deps, sargs, sargs, clo, chi,
                                              tag, True, floor, cap)
                    add(send)
                    add(recv)
                    mine["down", ch], mine["downr", ch] = nid, nid + 1
                    part_got[ch] = nid + 1
                    nid += 2
            before = mine
        for key, oid in before.items():  # the chunk's last part
            if key[0] == "up":
                up_last[key[1]] = oid
            elif key[0] == "down":
                down_last[key[1]] = oid
            elif key[0] == "downr":
                got[key[1]] = oid
    sched.extend(ops)
    last: dict[int, list[int]] = {r: [] for r in tree.order}
    for r, snd in up_last.items():
        last[r].append(snd)
    for ch, snd in down_last.items():
        last[tree.parent[ch]].append(snd)
        last[ch].append(got[ch])
    return last


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
