"""What-ifs on a point's rows (docs/whatifs.md): the faults applied, the latency's distribution over trials, and
what the configuration costs.

A scenario's ``faults:`` transform the point's cluster before anything else sees it (:func:`simulator.run.prepared.
cluster_for`, :mod:`simulator.cluster.faults`); its rows then say what they did (``faults_applied``). Its
``variability:`` simulates each algorithm's schedule ``trials`` more times with varied durations
(:mod:`simulator.engine.trials`) and gives the percentiles of the latency over the trials. Its ``cost:`` prices the
cluster's GPUs (:mod:`simulator.cluster.prices`) and what the row's time yields. These columns follow a
kind's own and precede the swept keys (:data:`WHATIF_COLUMNS`, printed with every kind's in docs/reference.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from simulator.cluster.prices import load_offers, owned, usd_per_m_tokens
from simulator.cluster.topology import Cluster
from simulator.engine.trials import trial_makespans
from simulator.errors import InputError, excerpt
from simulator.run.prepared import PreparedPoint, Run, faults_applied
from simulator.run.rows import WHATIF_COLUMNS
from simulator.run.whatif_models import Cost
from simulator.support.limits import check_trials, collective_ops, schedule_ops

__all__ = ["LATENCY_COLUMN", "WHATIF_COLUMNS", "check_whatifs", "cost_columns", "price_per_gpu_hour", "whatif_rows"]

# the workload kinds whose rows are each one schedule's simulation, and the column holding its latency
LATENCY_COLUMN = {"decode": "latency_s", "prefill": "latency_s", "collective": "time_s"}


def check_whatifs(prep: PreparedPoint) -> None:
    """The point's ``variability:`` applies to it and its trials are within bounds, its ``cost:`` prices its GPUs;
    errors are the caller's to locate (fields ``variability.*``, ``cost.*``)."""
    if prep.point.scenario.cost is not None:
        price_per_gpu_hour(prep.point.scenario.cost, prep.cluster)
    var = prep.point.scenario.variability
    if var is None:
        return
    wl = prep.workload
    if prep.kind not in LATENCY_COLUMN or getattr(wl, "scope", "attention") != "attention":
        raise InputError("applies to decode and prefill workloads of scope: attention and to collective workloads "
                         "(one schedule per row)", field="variability")
    if prep.cluster.host_cores:
        raise InputError("ranks that share host CPU cores run kernels as work on the cores: their durations are "
                         "not varied", field="variability")
    p = len(prep.cluster.ranks)
    if prep.kind == "collective":
        ops = len(prep.algorithms) * collective_ops(p, 1)
    else:
        prefix = "prefill:" if prep.kind == "prefill" else ""
        ops = sum(schedule_ops(prefix + a.name, p) for a in prep.algorithms)
    check_trials(var.trials, ops, "variability.trials", prep.point.force)


def whatif_rows(prep: PreparedPoint, rows: Sequence[dict[str, Any]], runs: Sequence[Run] | None
                ) -> list[dict[str, Any]]:
    """``rows`` with the what-if columns the scenario asks for, placed before the swept keys. ``runs``: the rows'
    simulated schedules, one per row, in order (needed with ``variability:``)."""
    sc = prep.point.scenario
    if sc.faults is None and sc.variability is None and sc.cost is None:
        return list(rows)
    swept = prep.point.columns()
    extra: list[dict[str, Any]] = [{} for _ in rows]
    if sc.faults is not None:
        applied = faults_applied(prep.point)
        for e in extra:
            e["faults_applied"] = applied
    var = sc.variability
    if var is not None:
        assert runs is not None and len(runs) == len(rows)
        for e, (_, sched, _) in zip(extra, runs, strict=True):
            times = trial_makespans(sched, prep.cluster, var.trials, var.kernel_cv, var.link_cv, var.seed)
            e.update(latency_percentiles(times))
    if sc.cost is not None:
        price = price_per_gpu_hour(sc.cost, prep.cluster)
        for e, row in zip(extra, rows, strict=True):
            e.update(cost_columns(prep, row, len(prep.cluster.ranks) * price))
    out = []
    for row, e in zip(rows, extra, strict=True):
        mine = {k: v for k, v in row.items() if k not in swept}
        mine.update(e)
        mine.update((k, row[k]) for k in swept if k in row)
        out.append(mine)
    return out


def latency_percentiles(times: np.ndarray) -> dict[str, Any]:
    """The trials' count and the p50, p90, p99 and max of their latencies (s)."""
    p50, p90, p99 = np.percentile(times, [50, 90, 99]).tolist()
    return {"trials": len(times), "p50_s": p50, "p90_s": p90, "p99_s": p99, "max_s": float(times.max())}


def price_per_gpu_hour(cost: Cost, cluster: Cluster) -> float:
    """Dollars per GPU-hour of ``cluster``'s GPUs under ``cost``; an offer must be for the cluster's device (errors
    with fields ``cost.*``)."""
    if cost.usd_per_gpu_hour is not None:
        return cost.usd_per_gpu_hour
    if cost.owned is not None:
        return owned(cost.owned).usd_per_gpu_hour
    offers = load_offers()
    offer = offers.get(str(cost.offer))
    if offer is None:
        raise InputError(f"unknown offer {excerpt(cost.offer)}; offers of topologies/prices.yaml: "
                         f"{', '.join(offers)}", field="cost.offer")
    devices = sorted({cluster.specs[r].name for r in cluster.ranks})
    if offer.device and devices != [offer.device]:
        raise InputError(f"offer {offer.name} prices {offer.device} GPUs; this cluster's are {', '.join(devices)} "
                         f"(offers for them: {', '.join(o.name for o in offers.values() if o.device in devices)}"
                         f" or none; or give usd_per_gpu_hour)", field="cost.offer")
    return offer.usd_per_gpu_hour


def cost_columns(prep: PreparedPoint, row: dict[str, Any], usd_per_hour: float) -> dict[str, Any]:
    """The row's cost columns at ``usd_per_hour`` for the cluster (:data:`WHATIF_COLUMNS`; tokens as
    :func:`simulator.cluster.prices.usd_per_m_tokens` counts them)."""
    out: dict[str, Any] = {"usd_per_hour": usd_per_hour}
    scope = row.get("scope", getattr(prep.workload, "scope", "attention"))
    batch = row.get("batch") or 1
    if prep.kind == "generate" and scope == "model":
        out["usd_per_m_tokens"] = usd_per_m_tokens(usd_per_hour, row["tpot_s"], batch)
        out["usd_per_request"] = usd_per_hour * row["latency_s"] / 3600.0 / batch
    elif prep.kind == "decode" and scope == "model":
        out["usd_per_m_tokens"] = usd_per_m_tokens(usd_per_hour, row["latency_s"], batch)
    elif prep.kind == "prefill" and scope == "model" and row.get("phase") == "prefill":
        out["usd_per_m_tokens"] = usd_per_m_tokens(usd_per_hour, row["latency_s"], batch * row["context"])
        out["usd_per_request"] = usd_per_hour * row["latency_s"] / 3600.0 / batch
    elif prep.kind == "train" and row.get("step_s"):
        out["usd_per_m_tokens"] = usd_per_m_tokens(usd_per_hour, row["step_s"], row["tokens_per_s"] * row["step_s"])
        out["usd_per_step"] = usd_per_hour * row["step_s"] / 3600.0
    return out
