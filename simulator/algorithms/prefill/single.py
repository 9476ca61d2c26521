"""``single``: the whole sequence on one device (the reference that speedups and parallel efficiency use), one
flash-attention launch per pass."""

from __future__ import annotations

from simulator.algorithms.base import Layout
from simulator.algorithms.prefill.base import (
    add_backward_block,
    add_delta,
    add_final,
    add_forward_block,
    new_prefill_schedule,
)
from simulator.kernels.launches import sequence_launch
from simulator.schedule.core import Schedule
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["build_prefill_single"]


def build_prefill_single(shape: PrefillShape, layout: Layout) -> Schedule:
    del layout  # one rank, whatever the cluster
    sched = new_prefill_schedule("single", shape, 1)
    runs, n = sched.meta["runs"][0], shape.sequence
    launches = sequence_launch(n, shape.causal, shape.cached)  # the new queries against the cached keys too
    fwd = add_forward_block(sched, shape, 0, runs, None, "kv", [], launches=launches, first=True)
    final = add_final(sched, shape, 0, n, [fwd] if fwd is not None else [])
    sched.meta["outputs"] = [(0, "out")]
    if shape.backward:
        delta = add_delta(sched, shape, 0, n, [final])
        add_backward_block(sched, shape, 0, runs, None, "kv", "dkv", [delta], launches=launches, alloc_dq=True,
                           alloc_dkv=shape.kv_bytes(n))
        sched.meta["grads"] = [(0, "dq", "dkv")]
    return sched
