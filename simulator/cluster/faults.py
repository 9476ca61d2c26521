"""Faults and degradations: a cluster transformed before anything routes over it or costs a kernel on it.

A scenario's ``faults:`` (docs/whatifs.md) name what is wrong with the cluster; :func:`apply_faults` returns the
cluster as it then is, and everything downstream (routes, NCCL's rings and trees, kernel times, the engine) runs
on it unchanged:

* ``{device: PATTERN, slowdown: s}``: every kernel of the matching devices takes ``s`` times longer (the device's
  spec gets ``slowdown = s``: :func:`simulator.cluster.devices.compute_time`; profiled and tiled times too);
* ``{link: A-B, bandwidth_factor: f}``: the links between a node matching ``A`` and one matching ``B``, both
  directions, carry ``f`` of their bandwidth (a link measured by message size: its whole curve scaled);
* ``{link: A-B, down: true}``: those links are gone; routes are searched over what is left (shortest latency, ECMP
  over the equal paths that remain), and nodes other than GPUs left without any link go too (a NIC whose only
  link failed: NCCL at init finds fewer NICs on that server). Refused if some ranks can no longer reach others;
* ``{node: PATTERN, down: true}``: every node of the matching servers (``n7`` -> ``n7.*``) is gone; the workload is
  **re-placed** on the GPUs that remain, in order (the ranks are the remaining GPUs: a decode ring over 56 GPUs
  where it was 64). Refused where no GPU remains or the rest cannot reach each other.

Patterns are shell-style (``fnmatch``: ``*``, ``?``, ``[...]``), matched against whole node names; a link pattern
``A-B`` is split at any ``-`` whose sides both match some node (names that contain ``-`` still work). A pattern that
matches nothing is an :class:`InputError` (``faults.I.KEY``) naming what it could have
matched. Pure: the input cluster is not changed; a factor of 1 gives the same floats as no fault.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import networkx as nx

from simulator.cluster.size_curve import SizeCurve
from simulator.cluster.topology import Cluster
from simulator.errors import InputError, excerpt

__all__ = ["Fault", "apply_faults", "link_matches"]

Target = Literal["device", "link", "node"]


@dataclass(frozen=True)
class Fault:
    """One fault: what it targets (``device``, ``link`` or ``node``), the name pattern, and what happens to it."""

    target: Target
    pattern: str
    slowdown: float = 1.0
    bandwidth_factor: float = 1.0
    down: bool = False

    def label(self) -> str:
        """How the ``faults_applied`` column names it."""
        if self.target == "device":
            return f"{self.pattern} slowdown {self.slowdown:g}"
        if self.down:
            return f"{self.target} {self.pattern} down"
        return f"{self.pattern} bandwidth x{self.bandwidth_factor:g}"


def _names(names: Iterable[str], pattern: str) -> list[str]:
    return [n for n in names if fnmatch.fnmatchcase(n, pattern)]


def link_matches(graph: nx.DiGraph, pattern: str) -> list[tuple[str, str]]:
    """The directed edges of ``graph`` that link pattern ``A-B`` names, both directions, in the graph's edge order
    (module docstring)."""
    nodes = list(graph.nodes)
    wanted: set[tuple[str, str]] = set()
    for i, ch in enumerate(pattern):
        if ch != "-" or i == 0 or i == len(pattern) - 1:
            continue
        a, b = set(_names(nodes, pattern[:i])), set(_names(nodes, pattern[i + 1:]))
        if not a or not b:
            continue
        for u, v in graph.edges:
            if (u in a and v in b) or (u in b and v in a):
                wanted.add((u, v))
    return [e for e in graph.edges if e in wanted]


def _hint(names: Sequence[str]) -> str:
    shown = ", ".join(names[:6])
    return f"{shown}, ... ({len(names)} in all)" if len(names) > 6 else shown


def _located(i: int, key: str, message: str) -> InputError:
    return InputError(message, field=f"faults.{i}.{key}")


def apply_faults(cluster: Cluster, faults: Sequence[Fault]) -> tuple[Cluster, str]:
    """``cluster`` with ``faults`` applied in order, and a one-line description of what they did (the rows'
    ``faults_applied``: ``none`` for an empty list). Raises :class:`InputError` located at ``faults.I.KEY``."""
    if not faults:
        return cluster, "none"
    graph = cluster.graph.copy()
    specs = dict(cluster.specs)
    ranks = list(cluster.ranks)
    said: list[str] = []
    for i, fault in enumerate(faults):
        if fault.target == "device":
            hit = _names(specs, fault.pattern)
            if not hit:
                raise _located(i, "device", f"no device matches {excerpt(fault.pattern)}; devices: "
                                            f"{_hint(list(specs))}")
            if cluster.host_cores and any(cluster.host_of(n) in cluster.host_cores for n in hit):
                raise _located(i, "device", "a slowdown of ranks that share host CPU cores is not modelled "
                                            "(their kernels are work drained over the host's cores)")
            for node in hit:
                specs[node] = dataclasses.replace(specs[node], slowdown=specs[node].slowdown * fault.slowdown)
            said.append(f"{fault.label()} ({len(hit)} device{'s' if len(hit) > 1 else ''})")
        elif fault.target == "link":
            edges = link_matches(graph, fault.pattern)
            if not edges:
                raise _located(i, "link", f"no link matches {excerpt(fault.pattern)} (a pattern A-B of two node "
                                          f"names, e.g. n0.nic0-*); nodes: {_hint(list(graph.nodes))}")
            if fault.down:
                graph.remove_edges_from(edges)
                gone = [n for n in list(graph.nodes) if graph.degree(n) == 0 and graph.nodes[n].get("kind") != "gpu"]
                graph.remove_nodes_from(gone)
                _check_connected(graph, ranks, i, "link")
            else:
                for u, v in edges:
                    _scale(graph.edges[u, v], fault.bandwidth_factor)
            links = len({frozenset(e) for e in edges})
            said.append(f"{fault.label()} ({links} link{'s' if links > 1 else ''})")
        else:
            hosts = sorted({cluster.host_of(n) for n in graph.nodes if "." in n})
            hit_hosts = set(_names(hosts, fault.pattern))
            if not hit_hosts:
                raise _located(i, "node", f"no server matches {excerpt(fault.pattern)}; servers: {_hint(hosts)}")
            out = [n for n in graph.nodes if "." in n and cluster.host_of(n) in hit_hosts]
            graph.remove_nodes_from(out)
            before = len(ranks)
            ranks = [r for r in ranks if r in graph]
            for node in out:
                specs.pop(node, None)
            if not ranks:
                raise _located(i, "node", "no GPU would remain")
            _check_connected(graph, ranks, i, "node")
            said.append(f"{fault.label()} (workload re-placed on the {len(ranks)} GPUs left of {before})")
    hosts_left = {cluster.host_of(n) for n in graph.nodes}
    faulted = dataclasses.replace(
        cluster, graph=graph, specs=specs, ranks=tuple(ranks),
        host_cores={h: c for h, c in cluster.host_cores.items() if h in hosts_left},
        host_mem_bw={h: c for h, c in cluster.host_mem_bw.items() if h in hosts_left},
        host_copy_bw={h: c for h, c in cluster.host_copy_bw.items() if h in hosts_left},
        host_copy_bw_by_size={h: c for h, c in cluster.host_copy_bw_by_size.items() if h in hosts_left})
    return faulted, "; ".join(said)


def _scale(data: dict[str, object], factor: float) -> None:
    """One directed link's bandwidth (and its by-size curve, so that a message's weight stays) times ``factor``."""
    data["bandwidth"] = float(data["bandwidth"]) * factor  # type: ignore[arg-type]
    curve = data.get("by_size")
    if isinstance(curve, SizeCurve):
        data["by_size"] = SizeCurve(curve.sizes, tuple(b * factor for b in curve.bandwidth))


def _check_connected(graph: nx.DiGraph, ranks: Sequence[str], i: int, key: str) -> None:
    """Every rank still reaches every other as routes go (:mod:`simulator.cluster.routing`: a GPU is a route's end,
    never a hop): over a direct link, or from one of its links into the fabric (the nodes that are not GPUs) to one
    of the other's."""
    if len(ranks) < 2:
        return
    fabric = graph.subgraph([n for n, k in graph.nodes(data="kind") if k != "gpu"])
    condensed = nx.condensation(fabric)
    comp = condensed.graph["mapping"]
    below = {c: nx.descendants(condensed, c) | {c} for c in condensed.nodes}

    def reach(r: str) -> frozenset[int]:
        return frozenset(d for x in graph.successors(r) if x in comp for d in below[comp[x]])

    def entry(r: str) -> frozenset[int]:
        return frozenset(comp[x] for x in graph.predecessors(r) if x in comp)

    groups: dict[tuple[frozenset[int], frozenset[int]], list[str]] = {}
    for r in ranks:
        groups.setdefault((reach(r), entry(r)), []).append(r)
    for (out, _), sources in groups.items():
        for (_, into), sinks in groups.items():
            if out & into:
                continue
            for a in sources:
                lost = [b for b in sinks if b != a and not graph.has_edge(a, b)]
                if lost:
                    raise _located(i, key, f"the faults disconnect the ranks: {a} can no longer reach "
                                           f"{_hint(lost)} (refused: nothing routes between them)")
