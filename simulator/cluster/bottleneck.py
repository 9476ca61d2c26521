"""Which link bounds each class of route, and whether a what-if changed any route.

A *route class* is a kind of GPU-to-GPU path: inside a node, across nodes on the same NIC rail (GPU k to GPU k),
across nodes between rails. For each, the slowest route from rank 0 to the ranks of its node and of the next node
is the representative; its bottleneck is the slowest link on it, and the faster link classes on the same route are
the ones it *caps*: raising their bandwidth changes nothing until the bottleneck is raised too. E.g. on a DGX with
800 Gb/s NICs: "across nodes: 64 GB/s, bound by pcie (gpu-nic) 64 GB/s, which caps net (nic-switch) 100 GB/s".
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.cluster.topology import Cluster

__all__ = ["RouteClass", "describe", "route_classes", "whatif_note"]


@dataclass(frozen=True)
class RouteClass:
    """The slowest route of one class: its bandwidth (bytes/s), latency (s), the link bounding it, and the faster
    link classes it caps as ``(label, bytes/s)``."""

    name: str
    src: str
    dst: str
    bandwidth_Bps: float
    latency_s: float
    bound_by: tuple[str, float]
    capped: tuple[tuple[str, float], ...]
    tied: tuple[str, ...] = ()  # other link classes on the route at the bottleneck's bandwidth


def _gb(x: float) -> str:
    return f"{x / 1e9:.4g} GB/s"


def _link_label(cluster: Cluster, u: str, v: str) -> str:
    """``pcie (gpu-nic)``: the link class and the kinds of its ends, so that a reader knows which link it is."""
    g = cluster.graph
    kinds = "-".join(sorted((g.nodes[u]["kind"], g.nodes[v]["kind"])))
    return f"{g.edges[u, v]['cls']} ({kinds})"


def _classify(cluster: Cluster, src: str, dst: str, local: dict[str, int]) -> str:
    if cluster.host_of(src) == cluster.host_of(dst):
        return "GPU -> GPU in a node"
    if local[src] == local[dst]:
        return "GPU -> GPU across nodes, same local index (rail)"
    return "GPU -> GPU across nodes, other local index"


def route_classes(cluster: Cluster) -> list[RouteClass]:
    """The route classes of ``cluster`` (none with one GPU), each with its slowest representative route."""
    ranks = cluster.ranks
    if len(ranks) < 2:
        return []
    hosts = list(dict.fromkeys(cluster.host_of(r) for r in ranks))
    local: dict[str, int] = {}
    per_host: dict[str, int] = {}
    for r in ranks:
        h = cluster.host_of(r)
        local[r] = per_host.get(h, 0)
        per_host[h] = local[r] + 1
    src = ranks[0]
    targets = [r for r in ranks[1:] if cluster.host_of(r) in hosts[:2]]
    cluster.prepare_routes((src, t) for t in targets)
    worst: dict[str, tuple[float, float, str]] = {}
    for dst in targets:
        route = cluster.route(src, dst)
        key = (cluster.route_bandwidth(route), -cluster.route_latency(route), dst)
        name = _classify(cluster, src, dst, local)
        if name not in worst or key < worst[name]:
            worst[name] = key
    out = []
    for name, (bw, neg_lat, dst) in worst.items():
        route = cluster.route(src, dst)
        links: dict[str, float] = {}
        for u, v in route:
            label = _link_label(cluster, u, v)
            links[label] = min(links.get(label, float("inf")), cluster.graph.edges[u, v]["bandwidth"])
        bound = min(links.items(), key=lambda kv: (kv[1], kv[0]))
        capped = tuple(sorted(((lab, b) for lab, b in links.items() if b > bound[1]), key=lambda kv: kv[1]))
        tied = tuple(sorted(lab for lab, b in links.items() if b == bound[1] and lab != bound[0]))
        out.append(RouteClass(name, src, dst, bw, -neg_lat, bound, capped, tied))
    return sorted(out, key=lambda rc: rc.name)


def describe(rc: RouteClass) -> str:
    """One line: ``GPU -> GPU across nodes ...: 64 GB/s, 3.4 us; bound by pcie (gpu-nic) 64 GB/s, which caps ...``."""
    line = (f"{rc.name}: {_gb(rc.bandwidth_Bps)}, {rc.latency_s * 1e6:.3g} us "
            f"({rc.src} -> {rc.dst}); bound by {' and '.join((rc.bound_by[0], *rc.tied))} {_gb(rc.bound_by[1])}")
    if rc.capped:
        line += ", which caps " + ", ".join(f"{lab} {_gb(b)}" for lab, b in rc.capped)
    return line


def whatif_note(base: Cluster, changed: Cluster, what: str) -> str | None:
    """A sentence when the what-if ``what`` (e.g. ``--set topology_params.nic_bandwidth=800Gb/s``) changed links
    that a slower link caps on some route class, or changed no route at all; ``None`` when it simply took effect."""
    bw_before = {(u, v): d["bandwidth"] for u, v, d in base.graph.edges(data=True)}
    changed_links = {_link_label(changed, u, v) for u, v, d in changed.graph.edges(data=True)
                     if bw_before.get((u, v)) != d["bandwidth"]}
    before = {rc.name: rc for rc in route_classes(base)}
    after = route_classes(changed)
    capped = []
    for rc in after:
        hit = [(lab, b) for lab, b in rc.capped if lab in changed_links]
        if hit:
            capped.append(f"{rc.name} gets {_gb(rc.bandwidth_Bps)}: {rc.bound_by[0]} {_gb(rc.bound_by[1])} caps "
                          + ", ".join(f"{lab} {_gb(b)}" for lab, b in hit))
    if capped:
        return f"{what} is capped by a slower link: " + "; ".join(capped)
    same = all(rc.name in before and (rc.bandwidth_Bps, rc.latency_s) == (before[rc.name].bandwidth_Bps,
                                                                          before[rc.name].latency_s) for rc in after)
    if same and len(after) == len(before):
        return f"{what} makes no GPU-to-GPU route of {changed.name} faster or slower"
    return None
