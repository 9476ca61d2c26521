"""Ring Attention over a whole sequence (Liu, Zaharia & Abbeel, arXiv:2310.01889; ring-flash-attention's
``ring_flash_attn_forward``/``backward``), any layout.

Forward: P steps; at step s each rank attends its queries to the K/V shard it holds (its own at step 0), merging
into its running state, and passes the shard on to the next rank of the ring. A block costs its unmasked pairs
only; a fully masked block is skipped (the shard is still passed on). Each rank keeps its own K/V (the layer's
cache) and receives into two buffers that alternate.

* ``overlap: true``: the next shard's transfer is posted before the step's attention (double buffering), so the
  transfer hides behind the compute; a receive waits until its buffer's previous shard was attended to and sent.
* ``overlap: false``: attend, then pass the shard on (the transfer waits for the block).

Backward (``backward: true``, after the forward): the K/V shards go round again; dQ accumulates locally while each
shard's dK, dV travel with it (sent after the block that adds to them) and, after the last step, one hop more
brings them back to their owner: P - 1 K/V transfers and P dK/dV transfers per rank.
"""

from __future__ import annotations

from simulator.algorithms.base import Layout
from simulator.algorithms.prefill.base import (
    add_backward_block,
    add_delta,
    add_final,
    add_forward_block,
    new_prefill_schedule,
    tokens,
)
from simulator.schedule import Schedule
from simulator.workloads.layouts import pair_count
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["build_prefill_ring"]


def _ids(*ops: int | None) -> list[int]:
    return [op for op in ops if op is not None]


class _Ring:
    """Ring geometry: positions, neighbours, and which shard a rank holds at a step."""

    def __init__(self, layout: Layout) -> None:
        self.p = layout.ranks
        self.order = layout.ring_order()
        self.pos = {r: i for i, r in enumerate(self.order)}

    def next(self, r: int) -> int:
        return self.order[(self.pos[r] + 1) % self.p]

    def shard_at(self, r: int, step: int) -> int:
        return self.order[(self.pos[r] - step) % self.p]


def _kv_buf(step: int) -> str:
    return "kv" if step == 0 else f"kvr{step % 2}"


def _rotate(sched: Schedule, shape: PrefillShape, ring: _Ring, overlap: bool, backward: bool,
            start: list[list[int]], pairs: dict[tuple[int, int], int]) -> list[list[int]]:
    """One pass of the K/V shards around the ring with a block per step; returns each rank's compute ops."""
    p, runs = ring.p, sched.meta["runs"]
    max_kv = max(shape.kv_bytes(tokens(sched, r)) for r in range(p))
    have: list[int | None] = [None] * p  # after which rank r's step buffer holds its shard
    sent: list[int | None] = [None] * p  # rank r's previous K/V send
    dkv_have: list[int | None] = [None] * p
    dkv_sent: list[int | None] = [None] * p
    blocks: list[list[int]] = [list(s) for s in start]  # each rank's compute ops so far
    for step in range(p):
        new_have: list[int | None] = [None] * p
        new_sent: list[int | None] = [None] * p

        def post(r: int, after: list[int], s: int, prev_sent: list[int | None]) -> tuple[int, int, int]:
            dst, shard = ring.next(r), ring.shard_at(r, s)
            nxt = _kv_buf(s + 1)
            recv_deps = _ids(*blocks[dst][-1:], prev_sent[dst])  # dst is done with that buffer's previous shard
            alloc = [(nxt, max_kv)] if s < 2 and not backward else []
            snd, recv = sched.add_transfer(r, dst, shape.kv_bytes(tokens(sched, shard)), f"kv[{shard}]",
                                           send_deps=after, recv_deps=recv_deps, args=(_kv_buf(s),),
                                           dst_args=(nxt,), alloc=alloc)
            return dst, recv, snd

        if overlap and step < p - 1:
            for r in range(p):
                dst, new_have[dst], new_sent[r] = post(r, _ids(have[r]), step, sent)
        done: list[int | None] = [None] * p
        for r in range(p):
            shard = ring.shard_at(r, step)
            deps = _ids(have[r], *blocks[r][-1:])
            if (r, shard) not in pairs:
                pairs[r, shard] = pair_count(runs[r], runs[shard], shape.causal)
            if not backward:
                done[r] = add_forward_block(sched, shape, r, runs[r], runs[shard], _kv_buf(step), deps,
                                            first=not blocks[r], pairs=pairs[r, shard])
            else:
                dkv = f"dkv{step % 2}"
                done[r] = add_backward_block(sched, shape, r, runs[r], runs[shard], _kv_buf(step), dkv,
                                             [*deps, *_ids(dkv_have[r])], alloc_dq=step == 0,
                                             alloc_dkv=shape.kv_bytes(tokens(sched, r)) if step == 0 else None,
                                             pairs=pairs[r, shard])
            if done[r] is not None:
                blocks[r].append(done[r])  # type: ignore[arg-type]
        if not overlap and step < p - 1:
            for r in range(p):
                dst, new_have[dst], new_sent[r] = post(r, _ids(have[r], done[r]), step, sent)
        if backward and p > 1:  # dK, dV of the shard go on with it (after this step's block adds to them)
            new_dkv: list[int | None] = [None] * p
            new_dkv_sent: list[int | None] = [None] * p
            for r in range(p):
                dst, shard = ring.next(r), ring.shard_at(r, step)
                nxt = f"dkv{(step + 1) % 2}"
                snd, recv = sched.add_transfer(
                    r, dst, shape.kv_bytes(tokens(sched, shard)), f"dkv[{shard}]",
                    send_deps=_ids(done[r], dkv_have[r]), recv_deps=_ids(dkv_sent[dst], *blocks[dst][-1:]),
                    args=(f"dkv{step % 2}",), dst_args=(nxt,), alloc=[(nxt, max_kv)] if step == 0 else [])
                new_dkv[dst], new_dkv_sent[r] = recv, snd
            dkv_have, dkv_sent = new_dkv, new_dkv_sent
        have, sent = new_have, new_sent
    if backward:
        sched.meta["grads"] = [(r, "dq", f"dkv{p % 2}" if p > 1 else "dkv0") for r in range(p)]
    return blocks


def build_prefill_ring(shape: PrefillShape, layout: Layout, overlap: bool = True) -> Schedule:
    ring = _Ring(layout)
    p = ring.p
    sched = new_prefill_schedule("ring", shape, p)
    pairs: dict[tuple[int, int], int] = {}  # (rank, shard) -> unmasked pairs, for both passes
    blocks = _rotate(sched, shape, ring, overlap, False, [[] for _ in range(p)], pairs)
    finals = [add_final(sched, shape, r, tokens(sched, r), blocks[r][-1:]) for r in range(p)]
    sched.meta["outputs"] = [(r, "out") for r in range(p)]
    if shape.backward:
        deltas = [[add_delta(sched, shape, r, tokens(sched, r), [finals[r]])] for r in range(p)]
        _rotate(sched, shape, ring, overlap, True, deltas, pairs)
    return sched
