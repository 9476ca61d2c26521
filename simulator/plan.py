"""``treering plan``: the smallest cluster on which a model's decode step meets a time-between-tokens target.

For each algorithm, node counts 1, 2, 4, ... are simulated as a whole decode step (``scope: model``, tensor
parallel inside each node, context parallel across nodes) until one runs within the target without running out of
memory. The binding constraint is what ruled out the node counts below the answer: memory (weights + KV cache
do not fit) or latency (the step is too slow).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.errors import InputError, excerpt
from simulator.limits import check_graph, check_schedule
from simulator.points import cluster_for, run_point
from simulator.scenario import scenario_points
from simulator.workloads.base import MAX_COUNT

__all__ = ["PlanRequest", "parse_tokens", "plan"]

_TOKEN_SUFFIX = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


def parse_tokens(text: str) -> int:
    """Token counts: ``1048576``, ``128K`` (x 1024), ``1M`` (x 2^20), ``1.5M``; at most 2^53."""
    t = text.strip().lower()
    suffix = t[-1] if t and t[-1] in "kmg" else ""
    try:
        value = float(t[: len(t) - len(suffix)]) * _TOKEN_SUFFIX[suffix] if len(t) <= 40 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InputError(f"expected a token count such as 1048576, 128K or 1M, got {excerpt(text)}",
                         field="--context")
    if not 1 <= value <= MAX_COUNT or value != int(value):
        raise InputError(f"must be a whole number of tokens from 1 to 2^53, got {excerpt(text)}", field="--context")
    return int(value)


@dataclass(frozen=True)
class PlanRequest:
    model: str
    context: int
    tbt_s: float
    topology: str
    algorithms: Sequence[str]
    batch: int = 1
    dtype: str = "bf16"
    tp: int | None = None
    max_nodes: int = 64
    sets: Sequence[str] = ()
    force: bool = False  # past the size limits of simulator.limits


def _points(req: PlanRequest, nodes: int, algorithm: str, tp: int) -> list[Any]:
    tree = {"name": "plan", "topology": req.topology, "topology_params": {"nodes": nodes},
            "workload": {"kind": "decode", "model": req.model, "scope": "model", "tp": tp, "batch": req.batch,
                         "context": req.context, "dtype": req.dtype},
            "algorithms": [algorithm]}
    return scenario_points(tree, "treering plan", Path.cwd(), req.sets, req.force)


def plan(req: PlanRequest) -> pd.DataFrame:
    """One row per algorithm: the answer (or the largest node count tried) and the binding constraint."""
    probe = _points(req, 1, req.algorithms[0], req.tp or 1)[0]
    cluster = cluster_for(probe)
    tp = req.tp or len(cluster.ranks) // cluster.num_hosts  # default: tensor parallel across one node
    graph = cluster.graph.number_of_nodes() + cluster.graph.number_of_edges()
    check_graph(graph * req.max_nodes, f"{req.max_nodes:,} nodes of {req.topology}", "--max-nodes", req.force)
    for algorithm in req.algorithms:  # the largest cluster tried
        check_schedule(algorithm, req.max_nodes * len(cluster.ranks) // tp, "--max-nodes", req.force)
    rows = []
    for algorithm in req.algorithms:
        failed: list[str] = []
        found: dict[str, Any] | None = None
        nodes = 1
        while nodes <= req.max_nodes:
            row = run_point(_points(req, nodes, algorithm, tp)[0])[0]
            if not row["oom"] and row["latency_s"] <= req.tbt_s:
                found = row
                break
            failed.append("memory" if row["oom"] else "latency")
            last = row
            nodes *= 2
        if found is not None:
            binding = "none: one node is enough" if not failed else failed[-1]
            rows.append(_row(algorithm, found, binding, met=True))
        else:
            rows.append(_row(algorithm, last, f"{failed[-1]} (not met up to {req.max_nodes} nodes)", met=False))
    return pd.DataFrame(rows)


def _row(algorithm: str, row: dict[str, Any], binding: str, met: bool) -> dict[str, Any]:
    return {"algorithm": algorithm, "nodes": row["nodes"] if met else "-", "gpus": row["ranks"] if met else "-",
            "tp": row["tp"], "tbt_ms": row["latency_s"] * 1e3, "peak_mem_GB": row["peak_mem_bytes"] / 1e9,
            "binding": binding}
