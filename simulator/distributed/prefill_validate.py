"""``treering validate`` of prefill (and training) points: the schedules run for real, timed, checked, predicted.

For each algorithm every rank runs ``--warmup`` untimed then ``--iters`` timed iterations of the whole schedule
(forward, and backward with ``backward: true``); an iteration's time is the maximum over ranks and ``measured_s``
the median. Rank 0 gathers every rank's output and gradient blocks and checks them against single-device torch
autograd of dense attention on the same inputs, in float64 (``max_abs_err``: the output; ``grad_max_abs_err``: dQ,
dK, dV, NaN without a backward). The reference is computed once per point, by blocks of query rows (each block's
autograd gives its dQ rows exactly and adds its share to dK, dV), so its memory stays bounded at long sequences.
``bitwise_equal_to_sim``: the gathered blocks equal, bit for bit, the simulator's numeric mode run serially on the
same torch inputs. ``predicted_s``: the simulated makespan of the same schedule on the topology.

The collectives of prefill schedules (all-gather of K/V pieces, reduce-scatter of dK/dV, all-to-all) run as the
schedule's own sends, whatever ``--collectives`` says. Inputs are float64 for ``dtype: fp64``, else float32.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from simulator.algorithms.prefill import build_prefill
from simulator.distributed.common import rank_layout, timed_iterations
from simulator.distributed.drift import drift_before
from simulator.distributed.floor import compared, timing
from simulator.distributed.prefill_run import check_outputs, gather_results, to_torch
from simulator.distributed.runner import PrefillRankRunner
from simulator.engine.core import simulate
from simulator.kernels.payload import transfer_layouts
from simulator.kernels.prefill import Rows
from simulator.kernels.profiles import extrapolated_text
from simulator.numeric.prefill import PrefillExecutor, PrefillInputs, make_prefill_inputs
from simulator.run.prepared import PreparedPoint
from simulator.schedule.core import Schedule
from simulator.workloads.prefill import PrefillWorkload

__all__ = ["REFERENCE_BLOCK_SCORES", "prefill_point_rows", "reference_by_blocks"]

REFERENCE_BLOCK_SCORES = 2**24  # scores (batch x heads x rows x sequence) of one block of the reference


def reference_by_blocks(inp: PrefillInputs, block_scores: int = REFERENCE_BLOCK_SCORES) -> tuple[np.ndarray, ...]:
    """(out, dq, dk, dv) of dense attention (softmax(scale q k^T, masked by position when causal) v, differentiated
    against dO) by torch autograd in float64 on the CPU, a block of query rows at a time."""
    def f64(x: Any) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x), dtype=torch.float64)
    q, k, v, dout = (f64(x) for x in (inp.q, inp.k, inp.v, inp.dout))
    b, heads, n, _ = q.shape
    group = heads // k.shape[1]
    k.requires_grad_(True)
    v.requires_grad_(True)
    ke, ve = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    rows = max(1, block_scores // (b * heads * n))
    outs, dqs = [], []
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        qb = q[:, :, lo:hi].clone().requires_grad_(True)
        s = qb @ ke.transpose(-1, -2) * inp.scale
        if inp.causal:
            s = s.masked_fill(torch.arange(n)[None, :] > torch.arange(lo, hi)[:, None], -float("inf"))
        out = torch.softmax(s, dim=-1) @ ve
        out.backward(dout[:, :, lo:hi], retain_graph=True)  # dK, dV accumulate over the blocks
        assert qb.grad is not None
        outs.append(out.detach())
        dqs.append(qb.grad)
    assert k.grad is not None and v.grad is not None
    return tuple(t.numpy() for t in (torch.cat(outs, dim=2), torch.cat(dqs, dim=2), k.grad, v.grad))


def _time_runs(args: argparse.Namespace, sched: Schedule, inp: PrefillInputs, device: torch.device
               ) -> tuple[list[float], dict[str, Any]]:
    rank, layouts = dist.get_rank(), transfer_layouts(sched, sched.meta["shape"])
    return timed_iterations(args, lambda pool: PrefillRankRunner(sched, inp, rank, layouts, device, pool), device)


def _bitwise(sched: Schedule, inp: PrefillInputs, results: dict[int, dict[str, Rows]]) -> bool:
    """The real blocks equal numeric mode's on the same (CPU torch) inputs, bit for bit."""
    ex = PrefillExecutor(sched, inp)
    ex.run(sched)
    return all(all(torch.equal(a, b) for a, b in zip(got.arrays, ex.buf[r][name].arrays, strict=True))
               for r, blocks in results.items() for name, got in blocks.items())


def prefill_point_rows(args: argparse.Namespace, prep: PreparedPoint, device: torch.device,
                       cluster_of: Any) -> list[dict[str, Any]]:
    """Rows of one prefill point (rank 0; an empty list elsewhere). ``cluster_of(args, point, ranks)``: the
    topology the prediction runs on."""
    point = prep.point
    wl = point.scenario.workload
    assert isinstance(wl, PrefillWorkload)
    shape, layout = wl.shape(), rank_layout()
    dtype = np.float64 if shape.dtype == "fp64" else np.float32
    np_inp = make_prefill_inputs(np.random.default_rng(args.seed), shape.batch, shape.heads, shape.kv_heads,
                                 shape.head_dim, shape.keys, shape.causal, dtype)  # a cached prefix's too
    inp = to_torch(np_inp, device)
    cpu_inp = to_torch(np_inp, torch.device("cpu"))
    ref: tuple[np.ndarray, ...] | None = None
    rows = []
    cluster = cluster_of(args, point, layout.ranks)
    for algo in prep.algorithms:
        sched = build_prefill(algo.name, algo.params, shape, layout)
        drift = drift_before(sched, cluster, layout, device, not args.no_drift)
        times, bufs = _time_runs(args, sched, inp, device)
        results = gather_results(sched, bufs)
        if results is None:
            continue
        stats = timing(times)
        ref = reference_by_blocks(np_inp) if ref is None else ref
        check = check_outputs(sched, results, ref)
        result = simulate(sched, cluster)
        predicted = result.makespan
        rows.append({
            "algorithm": algo.label, "ranks": sched.ranks, "context": shape.sequence,
            **compared(stats, predicted), "max_abs_err": check.max_abs_err,
            "bitwise_equal_to_sim": _bitwise(sched, cpu_inp, results),
            **stats, "grad_max_abs_err": check.grad_max_abs_err,
            "phase": "train" if shape.backward else "prefill", "layout": shape.layout,
            "extrapolated": extrapolated_text(result.extrapolated), "drift": drift, **dict(point.swept),
        })
    return rows
