"""Ring Attention over a whole sequence (Liu, Zaharia & Abbeel, arXiv:2310.01889; ring-flash-attention's
``ring_flash_attn_forward``/``backward``), any layout.

Forward: P steps; at step s each rank attends its queries to the K/V shard it holds (its own at step 0), merging
into its running state, and passes the shard on to the next rank of the ring. A block runs the flash-attention
launch the layout's reference code makes (:mod:`simulator.kernels.launches`: its unmasked pairs, and the tiles
they fall into), then merges it into the running state; a fully masked block is skipped (the shard is still passed
on). Each rank keeps its own K/V (the layer's
cache) and receives into two buffers that alternate.

* ``overlap: true``: the next shard's transfer is posted before the step's attention (double buffering), so the
  transfer hides behind the compute; a receive waits until its buffer's previous shard was attended to and sent.
* ``overlap: false``: attend, then pass the shard on (the transfer waits for the block).

Backward (``backward: true``, after the forward): the K/V shards go round again; dQ accumulates locally while each
shard's dK, dV travel with it (sent after the block that adds to them) and, after the last step, one hop more
brings them back to their owner: P - 1 K/V transfers and P dK/dV transfers per rank.

On a cached prefix (``shape.cached``, forward only) each rank's K/V shard is its cached then its new positions
(:func:`simulator.workloads.layouts.prefix_runs`) and goes round whole: each rank sends (P - 1) shards, (P - 1)
times the cache and the new tokens' K and V over the group; a block's launches are
:func:`simulator.kernels.launches.prefix_launch_matrix`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from simulator.algorithms.base import Layout
from simulator.algorithms.prefill.base import (
    add_delta,
    add_final,
    attention_dims,
    kv_runs,
    kv_tokens,
    new_prefill_schedule,
    tokens,
)
from simulator.kernels.launches import launch_matrix, prefix_launch_matrix
from simulator.kernels.tiles import Launch
from simulator.schedule.core import Schedule
from simulator.schedule.op import recv_of, transfer_send
from simulator.schedule.oplist import Indexed
from simulator.workloads.layouts import pair_matrix
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["build_prefill_ring"]


class _Ring:
    """Ring geometry: each rank's next rank, and which shard every rank holds at a step (arrays over the ranks)."""

    def __init__(self, layout: Layout) -> None:
        self.p = layout.ranks
        self.order = np.array(layout.ring_order(), dtype=np.int64)
        self.pos = np.empty(self.p, dtype=np.int64)
        self.pos[self.order] = np.arange(self.p)
        self.next = self.order[(self.pos + 1) % self.p]

    def shards_at(self, step: int) -> np.ndarray:
        return self.order[(self.pos - step) % self.p]


def _kv_buf(step: int) -> str:
    return "kv" if step == 0 else f"kvr{step % 2}"


class _Blocks:
    """The attention blocks' kernels (one table for a schedule: name, FLOPs, bytes, dims), by (pass, buffer, queries,
    keys, unmasked pairs, launch).

    Each block (rank, shard) makes one flash-attention launch (:func:`simulator.kernels.launches.launch_matrix`:
    the layout's reference kernels). The distinct (queries, keys, pairs, launch) of every (rank, shard) are
    numbered once (``code``); a step's blocks read their kernels off a map from that number to the table (per pass
    and buffer: the first step, on the rank's own K/V, starts the running state and the gradient accumulators; the
    others merge into them), and the sizes not seen before are added in their lexicographic order: the table and
    every block's kernel as numbering each step's distinct sizes in that order would give."""

    def __init__(self, shape: PrefillShape, tok: np.ndarray, pairs: np.ndarray,
                 launches: tuple[np.ndarray, ...], ktok: np.ndarray | None = None) -> None:
        self.shape = shape
        self.table: list[tuple[str, float, float, tuple[float, ...]]] = []
        self.index: dict[tuple[Any, ...], int] = {}
        self.tok, self.pairs, self.launches = tok, pairs, launches
        self.ktok = tok if ktok is None else ktok  # keys of each shard (a cached prefix's too)
        p = len(tok)
        columns = [np.broadcast_to(tok[:, None], (p, p)), np.broadcast_to(self.ktok[None, :], (p, p)), pairs,
                   *launches]
        code = np.zeros(p * p, dtype=np.int64)
        for col in columns:  # one number per distinct tuple, folded a column at a time (hashing: no sort)
            values, _ = pd.factorize(np.ascontiguousarray(col).reshape(-1))
            code, _ = pd.factorize(code * (int(values.max()) + 1 if len(values) else 1) + values)
        self.code = code.reshape(pairs.shape)
        self.kernel: dict[tuple[bool, str], np.ndarray] = {}  # (pass, buffer) -> number -> table index (-1: none)
        self.distinct = int(code.max()) + 1 if len(code) else 0

    def which(self, backward: bool, buf: str, ranks: np.ndarray, shards: np.ndarray) -> np.ndarray:
        """The kernel of each block of ``ranks[k]`` on shard ``shards[k]``, an index into :attr:`table` (its cost
        computed once per distinct size)."""
        code = self.code[ranks, shards]
        known = self.kernel.setdefault((backward, buf), np.full(self.distinct, -1, dtype=np.int64))
        ids = known[code]
        if (ids < 0).any():
            new: dict[tuple[int, int, int, tuple[Launch, ...]], int] = {}
            for c in np.unique(code[ids < 0]).tolist():
                k = int(np.argmax(code == c))  # a block of that size
                r, j = int(ranks[k]), int(shards[k])
                new[(int(self.tok[r]), int(self.ktok[j]), int(self.pairs[r, j]), self._launches(r, j))] = c
            for (q, kv, n, launches), c in sorted(new.items()):
                key = (backward, buf, q, kv, n, *(x for launch in launches for x in launch))
                if key not in self.index:
                    self.index[key] = len(self.table)
                    self.table.append(self._kernel(backward, buf, q, kv, n, launches))
                known[c] = self.index[key]
            ids = known[code]
        return ids

    def _launches(self, r: int, j: int) -> tuple[Launch, ...]:
        """The launches of block (r, j): the first, then any other whose queries are not none (a cached prefix)."""
        arrays = self.launches
        launches = [Launch(*(int(a[r, j]) for a in arrays[i:i + 3])) for i in range(0, len(arrays), 3)]
        return (launches[0], *(x for x in launches[1:] if x.nq > 0))

    def _kernel(self, backward: bool, buf: str, q: int, kv: int, n: int, launches: tuple[Launch, ...]
                ) -> tuple[str, float, float, tuple[float, ...]]:
        shape, first = self.shape, buf == _kv_buf(0)
        cost = shape.backward_cost(q, kv, n) if backward else shape.forward_cost(q, kv, n)
        launch = launches[0]
        extra = shape.accumulate_extra(launch.nq, launch.nk, first) if backward else \
            shape.merge_extra(launch.nq, first)
        for more in launches[1:]:  # a cached prefix's second launch (forward only), merged after the first
            b, k = shape.merge_extra(more.nq, False)
            extra = (extra[0] + b, extra[1] + k)
        name = f"attn-bwd[{buf}]" if backward else f"attn-fwd[{buf}]"
        return (name, *cost, attention_dims(shape, q, kv, n, launches, extra=extra))


def _pad(*columns: np.ndarray) -> np.ndarray:
    """Deps as an (ops, k) array, -1 for none."""
    return np.stack(columns, axis=1)


def _post(sched: Schedule, ring: _Ring, held: np.ndarray, kv_size: np.ndarray, names: list[str], after: np.ndarray,
          last: np.ndarray, prev_sent: np.ndarray, step: int, alloc: tuple[tuple[str, float], ...]
          ) -> tuple[np.ndarray, np.ndarray]:
    """Every rank sends the shard it holds (after ``after``) to the next, which receives it once done with that
    buffer's previous shard (its last block and its previous send); returns each rank's receive and send."""
    ranks = np.arange(ring.p, dtype=np.int64)
    first = sched.add_transfers(ranks, ring.next, kv_size[held], Indexed(names, held), after,
                                _pad(last[ring.next], prev_sent[ring.next]), args=(_kv_buf(step),),
                                dst_args=(_kv_buf(step + 1),), alloc=alloc)
    return landed(first, ring.next)


def landed(first: int, nxt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A step's transfers appended from op ``first``, position i's to position ``nxt[i]`` (a permutation): each
    position's receive, and each position's send."""
    sends = transfer_send(first, np.arange(len(nxt), dtype=np.int64))
    have = np.empty(len(nxt), dtype=np.int64)
    have[nxt] = recv_of(sends)
    return have, sends


def _rotate(sched: Schedule, shape: PrefillShape, ring: _Ring, overlap: bool, backward: bool, last: np.ndarray,
            blocks: _Blocks, pairs: np.ndarray) -> np.ndarray:
    """One pass of the K/V shards around the ring with a block per step (``last[r]``: rank r's last compute op
    before it, -1 for none); returns each rank's last compute op. Each step's ops of one kind are appended at once
    (one block of the schedule per kind), in rank order: the ops of one call per rank."""
    p = ring.p
    tok = np.array([tokens(sched, r) for r in range(p)], dtype=np.int64)
    kv_size = np.array([shape.kv_bytes(kv_tokens(sched, r)) for r in range(p)], dtype=float)
    max_kv = max(shape.kv_bytes(kv_tokens(sched, r)) for r in range(p))
    kv_names, dkv_names = [f"kv[{s}]" for s in range(p)], [f"dkv[{s}]" for s in range(p)]
    ranks = np.arange(p, dtype=np.int64)
    none = np.full(p, -1, dtype=np.int64)
    have, sent = none, none  # after which rank r's step buffer holds its shard; rank r's previous K/V send
    dkv_have, dkv_sent = none, none
    started = last >= 0  # rank r has a compute op (its first block allocates the running state)
    last = last.copy()
    if backward:  # the blocks' allocations at step 0: dQ, and dK, dV of the rank's own shard
        allocs = Indexed([(("dq", shape.q_bytes(int(t))), ("dkv0", shape.kv_bytes(int(t)))) for t in tok], ranks)
    else:
        allocs = Indexed([(), *((("acc", shape.state_bytes(int(t))),) for t in tok)], ranks + 1)
    for step in range(p):
        held = ring.shards_at(step)
        buf, nxt = _kv_buf(step), _kv_buf(step + 1)
        new_have, new_sent = none, none
        if overlap and step < p - 1:
            new_have, new_sent = _post(sched, ring, held, kv_size, kv_names, have[:, None], last, sent, step,
                                       (((nxt, max_kv),) if step < 2 and not backward else ()))
        live = np.flatnonzero(pairs[ranks, held] > 0)  # a fully masked block is skipped
        done = none.copy()
        if len(live):
            which = blocks.which(backward, buf, live, held[live])
            if not backward:
                first = sched.add_kernel_step(
                    live, Indexed(blocks.table, which), _pad(have[live], last[live]), dtype=shape.dtype,
                    fn="attn-fwd", out="acc", args=("q", buf),
                    alloc=Indexed(allocs.table, np.where(started[live], 0, allocs.which[live])))
            else:
                dkv = f"dkv{step % 2}"
                first = sched.add_kernel_step(
                    live, Indexed(blocks.table, which), _pad(have[live], last[live], dkv_have[live]),
                    dtype=shape.dtype, fn="attn-bwd", out="dq", args=("q", buf, "lse", "delta", "dout", dkv),
                    alloc=Indexed(allocs.table, allocs.which[live]) if step == 0 else ())
            done[live] = first + np.arange(len(live))
            last[live], started[live] = done[live], True
        if not overlap and step < p - 1:
            new_have, new_sent = _post(sched, ring, held, kv_size, kv_names, _pad(have, done), last, sent, step,
                                       (((nxt, max_kv),) if step < 2 and not backward else ()))
        if backward and p > 1:  # dK, dV of the shard go on with it (after this step's block adds to them)
            dnxt = f"dkv{(step + 1) % 2}"
            first = sched.add_transfers(ranks, ring.next, kv_size[held], Indexed(dkv_names, held), _pad(done, dkv_have),
                                        _pad(dkv_sent[ring.next], last[ring.next]), args=(f"dkv{step % 2}",),
                                        dst_args=(dnxt,), alloc=((dnxt, max_kv),) if step == 0 else ())
            dkv_have, dkv_sent = landed(first, ring.next)
        have, sent = new_have, new_sent
    if backward:
        sched.meta["grads"] = [(r, "dq", f"dkv{p % 2}" if p > 1 else "dkv0") for r in range(p)]
    return last


def build_prefill_ring(shape: PrefillShape, layout: Layout, overlap: bool = True) -> Schedule:
    ring = _Ring(layout)
    p = ring.p
    sched = new_prefill_schedule("ring", shape, p)
    runs = sched.meta["runs"]
    tok = np.array([tokens(sched, r) for r in range(p)], dtype=np.int64)
    if shape.cached:  # queries: the new positions; keys: the cached then the new (base.kv_runs)
        pairs = pair_matrix(runs, shape.causal, kv_runs(sched))
        launches: tuple[np.ndarray, ...] = prefix_launch_matrix(shape.layout, runs, kv_runs(sched), shape.causal)
        ktok = np.array([kv_tokens(sched, r) for r in range(p)], dtype=np.int64)
        blocks = _Blocks(shape, tok, pairs, launches, ktok)
    else:
        pairs = pair_matrix(runs, shape.causal)  # (rank, shard) -> unmasked pairs, for both passes
        launches = launch_matrix(shape.layout, runs, shape.causal)
        blocks = _Blocks(shape, tok, pairs, launches)
    last = _rotate(sched, shape, ring, overlap, False, np.full(p, -1, dtype=np.int64), blocks, pairs)
    finals = [add_final(sched, shape, r, tokens(sched, r), [int(last[r])] if last[r] >= 0 else [])
              for r in range(p)]
    sched.meta["outputs"] = [(r, "out") for r in range(p)]
    if shape.backward:
        deltas = np.array([add_delta(sched, shape, r, tokens(sched, r), [finals[r]]) for r in range(p)])
        _rotate(sched, shape, ring, overlap, True, deltas, blocks, pairs)
    return sched
