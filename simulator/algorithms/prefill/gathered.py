"""``allgather``: Llama 3's context parallelism (Llama Team, arXiv:2407.21783, Sec. 3.3.2).

Forward: all-gather K and V over the group (a ring all-gather of the ranks' shards, any sizes), then each rank
attends its queries to the keys they may see in one op (its pairs: the sum of (position + 1) over its queries,
causal), run as Transformer Engine's all-gather context parallelism runs it: each of the rank's chunks its own
launch against the keys up to its end, the launches on two streams
(:func:`simulator.kernels.launches.gathered_launches`). The gathered K/V is released after the op. Backward:
all-gather K and V again, one backward op (the same launches) gives dQ and every position's partial dK, dV (the
chunks' gradients over the keys both see summed), which a ring reduce-scatter sums onto their owners.
"""

from __future__ import annotations

from simulator.algorithms.base import Layout
from simulator.algorithms.prefill.base import (
    add_backward_block,
    add_concat,
    add_delta,
    add_final,
    add_forward_block,
    new_prefill_schedule,
    tokens,
)
from simulator.collectives.pieces import ring_allgather_pieces, ring_reduce_scatter_pieces
from simulator.kernels.launches import gathered_launches
from simulator.schedule.core import Schedule
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["build_prefill_allgather"]


def _piece(c: int) -> str:
    return f"kv@{c}"


def build_prefill_allgather(shape: PrefillShape, layout: Layout) -> Schedule:
    p = layout.ranks
    sched = new_prefill_schedule("allgather", shape, p, kv_name="kv@{r}")
    runs, order = sched.meta["runs"], layout.ring_order()
    pieces = [_piece(c) for c in range(p)]

    def size(c: int) -> float:
        return shape.kv_bytes(tokens(sched, c))

    def gather(tag: str, deps: dict[int, list[int]]) -> dict[int, int]:
        front = ring_allgather_pieces(sched, order, _piece, size, tag=tag, deps=deps)
        return {r: add_concat(sched, r, "kvall", pieces, front[r]) for r in range(p)}

    launches = [gathered_launches(shape.layout, runs[r], runs, shape.sequence, shape.causal) for r in range(p)]
    cat = gather("kv-allgather", {})
    finals = {}
    for r in range(p):
        others = [x for c, x in enumerate(pieces) if c != r]
        fwd = add_forward_block(sched, shape, r, runs[r], None, "kvall", [cat[r]], launches=launches[r], first=True,
                                free=others)
        finals[r] = [add_final(sched, shape, r, tokens(sched, r), [fwd] if fwd is not None else [cat[r]])]
    sched.meta["outputs"] = [(r, "out") for r in range(p)]
    if not shape.backward:
        return sched
    deltas = {r: [add_delta(sched, shape, r, tokens(sched, r), finals[r])] for r in range(p)}
    cat = gather("kv-allgather-bwd", deltas)
    bwd: dict[int, list[int]] = {}
    for r in range(p):
        others = [x for c, x in enumerate(pieces) if c != r]
        op = add_backward_block(sched, shape, r, runs[r], None, "kvall", "dkvall", [cat[r], *deltas[r]],
                                launches=launches[r], alloc_dq=True, alloc_dkv=shape.kv_bytes(shape.sequence),
                                free=others, extra=shape.overlap_sum_extra([lc.nk for lc in launches[r]]))
        bwd[r] = [op] if op is not None else [cat[r]]
    offsets = [0]
    for c in range(p):
        offsets.append(offsets[-1] + tokens(sched, c))
    elems = 2 * shape.batch * shape.kv_heads * shape.head_dim
    ring_reduce_scatter_pieces(sched, order, "dkvall", lambda c: (offsets[c], offsets[c + 1]), size,
                               lambda c: float(elems * tokens(sched, c)), out=lambda c: "dkv",
                               tag="dkv-reduce-scatter", dtype=shape.dtype, elem_bytes=shape.elem_bytes, deps=bwd)
    sched.meta["grads"] = [(r, "dq", "dkv" if p > 1 else "dkvall") for r in range(p)]
    return sched
