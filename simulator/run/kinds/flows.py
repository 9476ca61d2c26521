"""``kind: flows`` points: the network model on its own. Each flow is one matched send/recv between two devices,
started at its ``start``; a row per flow gives its completion time."""

from __future__ import annotations

from typing import Any

from simulator.cluster.topology import Cluster
from simulator.engine import simulate
from simulator.errors import InputError
from simulator.run.prepared import Kind, PreparedPoint, Run
from simulator.run.rows import Column, make_row
from simulator.run.scenario import Point
from simulator.schedule.core import Schedule
from simulator.workloads.flows import FlowsWorkload

__all__ = ["COLUMNS", "KIND", "flows_schedule"]

COLUMNS = (
    Column("flow", "", "the flow's index in workload.flows"),
    Column("src", "", "the sending device"),
    Column("dst", "", "the receiving device"),
    Column("bytes", "bytes", "the flow's size"),
    Column("start_s", "s", "when the flow may start"),
    Column("finish_s", "s", "when its last byte arrived"),
)


def flows_schedule(workload: FlowsWorkload, cluster: Cluster) -> Schedule:
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


def _prepare(point: Point, cluster: Cluster, numeric: bool) -> PreparedPoint:
    wl = point.scenario.workload
    assert isinstance(wl, FlowsWorkload)
    try:
        sched = flows_schedule(wl, cluster)
    except InputError as err:
        raise point.locate(err) from None
    return PreparedPoint(point, cluster, "flows", numeric, extra={"schedule": sched})


def _simulate(prep: PreparedPoint, keep_runs: bool) -> tuple[list[dict[str, Any]], list[Run] | None]:
    sched: Schedule = prep.extra["schedule"]
    result = simulate(sched, prep.cluster)
    recv_of = [op.id for op in sched.ops if op.kind == "recv"]  # flow i's receive, in flow order
    ends = result.end[recv_of].tolist()
    rows = [make_row("flows", COLUMNS, {"flow": i, "src": f.src, "dst": f.dst, "bytes": f.bytes, "start_s": f.start,
                                        "finish_s": ends[i]}, prep.point.columns())
            for i, f in enumerate(prep.workload.flows)]
    return rows, [("flows", sched, result)] if keep_runs else None


def _runs(prep: PreparedPoint, record_links: bool) -> list[Run]:
    sched: Schedule = prep.extra["schedule"]
    return [("flows", sched, simulate(sched, prep.cluster, record_links))]


KIND = Kind("flows", COLUMNS, _prepare, _simulate, _runs, numeric="--numeric needs a decode workload")
