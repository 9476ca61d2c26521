"""The pipeline of a training step as a schedule the engine runs: one GPU per stage (the representative pipeline's
first GPU of each stage), each forward and backward of a (virtual) stage one kernel of its composed duration, the
activations and gradients between stages real transfers (docs/training.md).

This is what a step's timeline shows (``treering run``'s report, ``trace``): the 1F1B order, the bubble, the
transfers. A kernel's duration is given as FLOPs at the device's rate (no launch, no memory side), so that the
engine's roofline gives it back. Each kernel waits for the one before it in its stage's order, so the engine's FIFO
compute stream keeps that order; the transfers run on the fabric as any other. With transfers that do not overlap
one another, the engine's makespan is :func:`simulator.training.pipeline.run_pipeline`'s with their time (tested):
the pure timing the step uses is held to the engine. That timing has each receive posted ahead (a transfer starts
when its sender's kernel ends), which no op order of stages can say; the schedule is marked as not a program
(``program_order=False``: its ends are not posted in stream order). The DP gradient streams beside the pipeline
(:class:`simulator.training.pipeline.DPStreams`), and the time their kernels' SMs add to the ops beside them, are not
drawn: the timeline shows each op at its composed duration.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.cluster.devices import flops_efficiency
from simulator.cluster.topology import Cluster
from simulator.schedule.core import Schedule
from simulator.training.pipeline import Op, interleaved_order

__all__ = ["pipeline_schedule", "topological"]


def topological(orders: Sequence[Sequence[Op]]) -> list[tuple[int, Op]]:
    """Every stage's ops, (stage, op), in an order where each comes after its stage's previous op and its input."""
    p, last = len(orders), max(g for order in orders for _, g, _ in order)
    done: set[Op] = set()
    pos = [0] * p
    out: list[tuple[int, Op]] = []
    while len(out) < sum(len(o) for o in orders):
        moved = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, g, i = op = orders[s][pos[s]]
                dep = None if kind == "F" and g == 0 else ("F", g - 1, i) if kind == "F" else \
                    ("F", g, i) if g == last else ("B", g + 1, i)
                if dep is not None and dep not in done:
                    break
                done.add(op)
                out.append((s, op))
                pos[s] += 1
                moved = True
        if not moved:
            raise AssertionError("pipeline order deadlocked")
    return out


def pipeline_schedule(fwd: Sequence[float], bwd: Sequence[float], m: int, chunks: int, nbytes: float,
                      stage_gpus: int, cluster: Cluster, dtype: str) -> Schedule:
    """The pipeline as a schedule: ``fwd[g]``, ``bwd[g]`` seconds per virtual stage ``g`` (stage ``g % p``),
    ``nbytes`` per activation or gradient sent, stage ``s`` on the cluster's GPU ``s x stage_gpus``."""
    p = len(fwd) // chunks
    last = len(fwd) - 1
    placement = tuple(cluster.ranks[s * stage_gpus] for s in range(p))
    sched = Schedule(p, placement=placement, name="pipeline", program_order=False)  # receives posted ahead
    rate = [cluster.specs[n].flops_for(dtype) * flops_efficiency(cluster.specs[n]) / cluster.specs[n].slowdown
            for n in placement]
    previous: list[tuple[int, ...]] = [()] * p
    inputs: dict[Op, int] = {}  # an op's input: its producer's kernel, or the receive of its transfer
    orders = [interleaved_order(s, p, chunks, m) for s in range(p)]
    for s, (kind, g, i) in topological(orders):
        seconds = fwd[g] if kind == "F" else bwd[g]
        deps = previous[s] + ((inputs[(kind, g, i)],) if (kind, g, i) in inputs else ())
        oid = sched.add_compute(s, f"{'fwd' if kind == 'F' else 'bwd'} {g}.{i}", flops=seconds * rate[s],
                                dtype=dtype, deps=deps, fused=True)
        previous[s] = (oid,)
        nxt: Op | None = ("F", g + 1, i) if kind == "F" and g < last else ("B", g - 1, i) if kind == "B" and g > 0 \
            else ("B", g, i) if kind == "F" else None
        if nxt is None:
            continue
        to = nxt[1] % p
        if to == s:
            inputs[nxt] = oid
        else:
            _, recv = sched.add_transfer(s, to, nbytes, f"{'act' if kind == 'F' else 'grad'} {g}.{i}",
                                         send_deps=(oid,))
            inputs[nxt] = recv
    return sched
