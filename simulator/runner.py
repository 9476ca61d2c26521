"""Run sweep points: build the cluster and the schedule of each point, simulate, derive result rows."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from simulator.engine import simulate
from simulator.errors import InputError
from simulator.scenario import Point, Workload
from simulator.schedule import Schedule
from simulator.topology import Cluster, load_topology

__all__ = ["FLOW_COLUMNS", "cluster_for", "flows_schedule", "run_point", "run_points"]

FLOW_COLUMNS = ["flow", "src", "dst", "bytes", "start_s", "finish_s"]

_CLUSTERS: dict[tuple[str, str, str], Cluster] = {}


def cluster_for(point: Point) -> Cluster:
    """The point's cluster (cached per topology and parameters); errors located in the scenario file."""
    sc = point.scenario
    key = (sc.topology, repr(sorted(sc.topology_params.items())), str(point.base_dir))
    if key not in _CLUSTERS:
        try:
            _CLUSTERS[key] = load_topology(sc.topology, sc.topology_params, point.base_dir)
        except InputError as err:
            raise point.locate(err) from None
    return _CLUSTERS[key]


def flows_schedule(workload: Workload, cluster: Cluster) -> Schedule:
    """One matched send/recv per flow; ranks are the distinct endpoints in order of first use."""
    compute_nodes = {n for n, k in cluster.graph.nodes(data="kind") if k in ("gpu", "cpu")}
    names: list[str] = []
    index: dict[str, int] = {}
    for i, flow in enumerate(workload.flows):
        for end in ("src", "dst"):
            node = getattr(flow, end)
            if node not in compute_nodes:
                sample = ", ".join(cluster.ranks[:3])
                raise InputError(f"unknown device {node!r} in topology {cluster.name!r} (devices such as {sample})",
                                 field=f"workload.flows.{i}.{end}")
            if node not in index:
                index[node] = len(names)
                names.append(node)
    sched = Schedule(len(names), placement=tuple(names), name="flows")
    for i, flow in enumerate(workload.flows):
        sched.add_transfer(index[flow.src], index[flow.dst], flow.bytes, f"flow{i}", not_before_s=flow.start)
    return sched


def run_point(point: Point) -> list[dict[str, Any]]:
    """Simulate one sweep point; returns its result rows (one per flow for a ``flows`` workload)."""
    cluster = cluster_for(point)
    wl = point.scenario.workload
    try:
        sched = flows_schedule(wl, cluster)
    except InputError as err:
        raise point.locate(err) from None
    ends = simulate(sched, cluster).op_ends()
    swept = dict(point.swept)
    rows = []
    for i, flow in enumerate(wl.flows):
        recv_id = 2 * i + 1
        rows.append({"flow": i, "src": flow.src, "dst": flow.dst, "bytes": flow.bytes, "start_s": flow.start,
                     "finish_s": ends[recv_id], **swept})
    return rows


def run_points(points: Iterable[Point]) -> pd.DataFrame:
    """All rows of all points, as one DataFrame (stable columns first, then one per swept key)."""
    rows = [row for point in points for row in run_point(point)]
    return pd.DataFrame(rows)
