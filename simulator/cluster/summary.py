"""Text summary of a :class:`Cluster`: devices (with their efficiencies), links by class, the link bounding each
route class, bisection bandwidth."""

from __future__ import annotations

from collections import Counter, defaultdict

import networkx as nx

from simulator.cluster.bottleneck import describe, route_classes
from simulator.cluster.size_curve import SizeCurve
from simulator.cluster.topology import Cluster

__all__ = ["bisection_bandwidth", "summarize"]


def _si(x: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.4g} {prefix}{unit}"
    return f"{x:.4g} {unit}"


def _time(x: float) -> str:
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if x >= factor:
            return f"{x / factor:.4g} {unit}"
    return f"{x * 1e9:.4g} ns"


def bisection_bandwidth(cluster: Cluster) -> float:
    """Max flow (bytes/s, one direction) from the first half of the ranks to the second half.

    Ranks are ordered node by node, so for presets this is the cut between the two halves of the machine. With
    one rank it is 0.
    """
    n = len(cluster.ranks)
    if n < 2:
        return 0.0
    g = nx.DiGraph()
    for u, v, bw in cluster.graph.edges(data="bandwidth"):
        g.add_edge(u, v, capacity=bw)
    half = n // 2
    for r in cluster.ranks[:half]:
        g.add_edge("__source__", r)  # no capacity attribute = infinite
    for r in cluster.ranks[half:]:
        g.add_edge(r, "__sink__")
    value, _ = nx.maximum_flow(g, "__source__", "__sink__")
    return float(value)


def summarize(cluster: Cluster) -> str:
    """Human-readable summary for ``treering topo show``."""
    g = cluster.graph
    kinds = Counter(k for _, k in g.nodes(data="kind"))
    lines = [f"topology {cluster.name}: {len(cluster.ranks)} GPUs on {cluster.num_hosts} node(s); "
             + ", ".join(f"{kinds[k]} {k}" for k in ("gpu", "cpu", "switch", "nic") if kinds[k])]
    lines.append(f"overheads: {_time(cluster.message_overhead_s)} per message, "
                 f"{_time(cluster.comm_overhead_s)} per communication operation, "
                 f"{_time(cluster.collective_start_s)} per collective")
    lines.append("devices:")
    by_spec = Counter(spec.name for spec in cluster.specs.values())
    for name, count in sorted(by_spec.items()):
        spec = next(s for s in cluster.specs.values() if s.name == name)
        flops = ", ".join(f"{d} {_si(f, 'FLOP/s')}" for d, f in spec.peak_flops.items())
        lines.append(f"  {count} x {name}: {_si(spec.mem_bytes, 'B')} at {_si(spec.mem_bw_Bps, 'B/s')}; "
                     f"{flops}; launch {_time(spec.launch_s)}")
        lines.append(f"    achievable: eff_mem {spec.eff_mem:g} ({_si(spec.mem_bw_Bps * spec.eff_mem, 'B/s')}), "
                     f"eff_flops {spec.eff_flops:g} (topologies/devices.yaml cites the measurements)")
    lines.append("links by class (directed edges):")
    classes: dict[str, list[tuple[float, float]]] = defaultdict(list)
    curves: dict[str, list[SizeCurve]] = defaultdict(list)
    for _, _, data in g.edges(data=True):
        classes[data["cls"]].append((data["bandwidth"], data["latency"]))
        if "by_size" in data:
            curves[data["cls"]].append(data["by_size"])
    for cls, vals in sorted(classes.items()):
        bws = sorted({bw for bw, _ in vals})
        lats = sorted({lat for _, lat in vals})
        bw = _si(bws[0], "B/s") if len(bws) == 1 else f"{_si(bws[0], 'B/s')} .. {_si(bws[-1], 'B/s')}"
        lat = _time(lats[0]) if len(lats) == 1 else f"{_time(lats[0])} .. {_time(lats[-1])}"
        lines.append(f"  {cls:<16} {len(vals):>6} x {bw} per direction, latency {lat}")
        for curve in sorted(set(curves[cls]), key=lambda c: c.sizes + c.bandwidth):  # a link measured by size
            lines.append(f"  {'':<16} {curves[cls].count(curve):>6} x by message size: "
                         + ", ".join(f"{_si(n, 'B')} {_si(b, 'B/s')}" for n, b in zip(curve.sizes, curve.bandwidth,
                                                                                     strict=True)))
    classes_ = route_classes(cluster)
    if classes_:
        lines.append("routes by class (the slowest of each, per direction; the link that bounds it):")
        lines.extend(f"  {describe(rc)}" for rc in classes_)
    lines.append(f"bisection bandwidth (first half of GPUs -> second half): {_si(bisection_bandwidth(cluster), 'B/s')}")
    return "\n".join(lines)
