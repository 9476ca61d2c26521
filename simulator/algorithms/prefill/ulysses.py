"""``ulysses``: DeepSpeed-Ulysses (Jacobs et al., arXiv:2309.14509).

Forward: all-to-all q, and K with V, from sequence-sharded to head-sharded (rank j gets heads
[j H/P, (j+1) H/P) of every position), full-sequence attention of H/P heads per rank, all-to-all of the output
back to sequence-sharded. Backward: dO goes head-sharded the same way; one backward kernel on the head-sharded
q, K, V, out and lse (kept from the forward); dQ and dK, dV go back by the reverse all-to-alls.

Heads must divide by P. With GQA, rank j needs the KV heads its query heads use: kv_heads/P of them when P divides
kv_heads; when kv_heads < P (P a multiple of kv_heads) each KV head is **replicated** to the P/kv_heads ranks that
use it (more bytes on the wire), and its dK, dV from those ranks are summed on the way back. Other shapes are
refused (:func:`check_ulysses`).

``alltoall: pairwise`` (default) exchanges directly between every pair; ``hierarchical`` (on several nodes) goes
through the rank of the destination's local index inside the node first, then rail to rail across nodes
(:func:`simulator.collectives.alltoall.hierarchical_alltoall`).
"""

from __future__ import annotations

from typing import Any

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
from simulator.collectives.alltoall import hierarchical_alltoall, pairwise_alltoall
from simulator.errors import InputError
from simulator.kernels.launches import sequence_launch
from simulator.schedule.core import Schedule
from simulator.workloads.layouts import Run
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["build_prefill_ulysses", "check_ulysses", "kv_heads_of"]


def check_ulysses(shape: PrefillShape, p: int) -> None:
    """Heads divisible by P, and KV heads either divisible by P or dividing P (then replicated)."""
    if shape.heads % p:
        raise InputError(f"ulysses splits the {shape.heads} heads over the {p} ranks: heads must be a multiple of "
                         f"the ranks", field="workload.model.heads")
    if shape.kv_heads % p and p % shape.kv_heads:
        raise InputError(f"ulysses with {shape.kv_heads} KV heads on {p} ranks: the KV heads must be a multiple of "
                         f"the ranks, or divide them (then each KV head is replicated)",
                         field="workload.model.kv_heads")


def kv_heads_of(shape: PrefillShape, p: int, j: int) -> tuple[int, int]:
    """The KV head range [lo, hi) rank j holds."""
    if shape.kv_heads % p == 0:
        per = shape.kv_heads // p
        return j * per, (j + 1) * per
    h = j * (shape.heads // p) // shape.group
    return h, h + 1


def build_prefill_ulysses(shape: PrefillShape, layout: Layout, alltoall: str = "pairwise") -> Schedule:
    p = layout.ranks
    check_ulysses(shape, p)
    groups = layout.groups()
    hierarchical = alltoall == "hierarchical" and len(groups) > 1
    if hierarchical and len({len(g) for g in groups}) > 1:
        raise InputError("alltoall: hierarchical needs the same number of GPUs on every node", field="algorithms")

    def exchange(buf: str, name: Any, piece: Any, mode: str, tag: str, deps: dict[int, list[int]]
                 ) -> dict[int, tuple[int, ...]]:
        if hierarchical:
            return hierarchical_alltoall(sched, groups, buf, name, piece, mode=mode, tag=tag, deps=deps)
        return pairwise_alltoall(sched, order, buf, name, piece, mode=mode, tag=tag, deps=deps)

    hq, n = shape.heads // p, shape.sequence
    kvq = kv_heads_of(shape, p, 0)[1] - kv_heads_of(shape, p, 0)[0]
    sched = new_prefill_schedule("ulysses", shape, p)
    order = list(range(p))
    offsets = [0]
    for r in range(p):
        offsets.append(offsets[-1] + tokens(sched, r))

    def to_heads(buf: str, prefix: str, kv: bool, deps: dict[int, list[int]], tag: str) -> dict[int, tuple[int, ...]]:
        def piece(src: int, dst: int) -> tuple[int, int, float]:
            t = tokens(sched, src)
            if kv:
                return (*kv_heads_of(shape, p, dst), shape.kv_bytes(t, kvq))
            return dst * hq, (dst + 1) * hq, shape.q_bytes(t, hq)
        return exchange(buf, lambda s: f"{prefix}@{s}", piece, "heads", tag, deps)

    def to_rows(buf: str, prefix: str, kv: bool, deps: dict[int, list[int]], tag: str) -> dict[int, tuple[int, ...]]:
        def piece(src: int, dst: int) -> tuple[int, int, float]:
            t = tokens(sched, dst)
            return offsets[dst], offsets[dst + 1], shape.kv_bytes(t, kvq) if kv else shape.q_bytes(t, hq)
        return exchange(buf, lambda s: f"{prefix}@{s}", piece, "rows", tag, deps)

    def concat(out: str, prefix: str, front: dict[int, tuple[int, ...]]) -> dict[int, list[int]]:
        return {r: [add_concat(sched, r, out, [f"{prefix}@{s}" for s in order], front[r])] for r in order}

    everything, launches = (Run(0, 1, n),), sequence_launch(n, shape.causal)
    qf = concat("qh", "q", to_heads("q", "q", False, {}, "q-alltoall"))
    kvf = concat("kvh", "kv", to_heads("kv", "kv", True, {}, "kv-alltoall"))
    done: dict[int, list[int]] = {}
    for r in order:
        fwd = add_forward_block(sched, shape, r, everything, None, "kvh", [*qf[r], *kvf[r]], launches=launches,
                                q_buf="qh", first=True, heads=hq)
        done[r] = [add_final(sched, shape, r, n, [fwd] if fwd is not None else qf[r], heads=hq)]
    concat("y", "o", to_rows("out", "o", False, done, "out-alltoall"))
    sched.meta["outputs"] = [(r, "y") for r in order]
    if not shape.backward:
        return sched
    dof = concat("doh", "do", to_heads("dout", "do", False, done, "dout-alltoall"))
    bwd: dict[int, list[int]] = {}
    for r in order:
        delta = add_delta(sched, shape, r, n, dof[r], dout="doh", heads=hq)
        op = add_backward_block(sched, shape, r, everything, None, "kvh", "dkvh", [delta], launches=launches,
                                q_buf="qh", dout="doh", dq="dqh", alloc_dq=True, alloc_dkv=shape.kv_bytes(n, kvq),
                                heads=hq)
        bwd[r] = [op] if op is not None else [delta]
    concat("dq", "dq", to_rows("dqh", "dq", False, bwd, "dq-alltoall"))
    concat("dkv", "dkv", to_rows("dkvh", "dkv", True, bwd, "dkv-alltoall"))
    sched.meta["grads"] = [(r, "dq", "dkv") for r in order]
    return sched
