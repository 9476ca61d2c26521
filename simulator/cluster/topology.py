"""Cluster graphs: load a preset or a user's topology YAML into a :class:`Cluster`.

A cluster is a :class:`networkx.DiGraph`. Nodes carry ``kind`` (gpu | cpu | switch | nic) and, for compute
devices, ``device`` (a spec name). Each directed edge is one direction of a link with ``bandwidth`` (bytes/s),
``latency`` (s) and ``cls`` (a link class such as ``nvlink`` or ``ib``). Ranks are the GPUs in file order.

Two YAML forms are accepted (see docs/topology.md):

* explicit: ``devices:`` (named specs), ``nodes:``, ``links:``, optional ``message_overhead`` (per message, at the
  sender), ``comm_overhead`` (per communication operation: one collective, or one standalone send/recv) and
  ``collective_overhead`` (a collective's start, when it differs from a standalone send's), ``collective_stall``
  (what a collective's start costs on average beyond that: the slow calls of a heavy-tailed start, e.g. gloo's
  hand-off of each collective to a worker thread on CPU ranks; default 0) and ``nccl_latency``
  (NCCL's protocol latencies replaced: ``{ring: {LL: {net: 50 us}}}``, :mod:`simulator.collectives.protocols`);
* parametric: ``builder: cluster`` with ``params:`` defaults (see :mod:`simulator.cluster.builders`), which a scenario's
  ``topology_params`` override.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from simulator.cluster.builders import expand_preset
from simulator.cluster.devices import DeviceSpec, parse_device_spec
from simulator.cluster.nccl_keys import ALGOS, LATENCY_KINDS, PROTOCOLS, latency_key
from simulator.cluster.presets import DEVICE_LIBRARY, NOT_PRESETS, list_presets, preset_description
from simulator.cluster.routing import Edge, Router
from simulator.cluster.size_curve import SizeCurve, parse_size_curve
from simulator.errors import InputError, excerpt
from simulator.support.gcpause import gc_paused
from simulator.support.paths import TOPOLOGY_DIR
from simulator.support.yaml_lines import line_of, load_yaml
from simulator.units import CODE, SI, Check, checked_quantity, user_check

__all__ = ["NODE_KINDS", "Cluster", "build_cluster", "list_presets", "load_topology", "override_devices",
           "preset_description"]

NODE_KINDS = ("gpu", "cpu", "switch", "nic")


@dataclass(frozen=True)
class Cluster:
    """A cluster: graph, device specs per compute node, ranks, per-message software overhead."""

    name: str
    graph: nx.DiGraph
    specs: Mapping[str, DeviceSpec]  # compute node name -> spec
    ranks: tuple[str, ...]  # GPU node names, rank order
    message_overhead_s: float = 0.0
    comm_overhead_s: float = 0.0
    collective_overhead_s: float | None = None  # a collective's start; None: comm_overhead
    collective_stall_s: float = 0.0  # a collective start's mean beyond its typical cost (the slow calls' share)
    host_cores: Mapping[str, int] = field(default_factory=dict)  # hosts whose ranks share CPU cores
    host_mem_bw: Mapping[str, float] = field(default_factory=dict)  # and their memory bandwidth (bytes/s)
    host_copy_bw: Mapping[str, float] = field(default_factory=dict)  # bytes/s one core copies for a transfer
    host_copy_bw_by_size: Mapping[str, SizeCurve] = field(default_factory=dict)  # ... at each message size
    nccl_latency: Mapping[str, float] = field(default_factory=dict)  # "ring.LL.net" -> s (collectives/protocols.py)
    _router: Router = field(init=False, repr=False, compare=False)
    _latency: dict[Edge, float] = field(init=False, repr=False, compare=False)  # edge -> latency, filled on use
    _owned: dict[str, Any] = field(init=False, repr=False, compare=False)  # see owned()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_router", Router(self.graph))
        object.__setattr__(self, "_latency", {})
        object.__setattr__(self, "_owned", {})

    def owned(self, name: str) -> dict[Any, Any]:
        """A memo kept on the cluster itself, for what refers back to it (a collective's ``Fabric``): freed with it
        by the collector (:func:`simulator.cluster.memo.cluster_memo` keeps the rest apart, keyed by the cluster's
        id, so must not hold it)."""
        return self._owned.setdefault(name, {})

    def route(self, src: str, dst: str) -> tuple[Edge, ...]:
        """Deterministic route (shortest latency, fewest hops, stable ECMP hash) as directed edges."""
        return self._router.route(src, dst)

    def prepare_routes(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Compute the routes of many (src, dst) pairs in one batch (faster than one by one)."""
        self._router.prepare(pairs)

    def paths(self, pairs: Sequence[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The routes of many (src, dst) pairs as arrays (the new ones routed in one batch): ``(starts, ids,
        latency)``, pair k's link ids ``ids[starts[k]:starts[k + 1]]`` in route order (a link's id: its position
        in the graph's edge order, :func:`simulator.cluster.links.link_table`'s), and its route's latency
        (:meth:`route_latency` of its route, the same float)."""
        return self._router.paths(pairs)

    def route_latency(self, route: tuple[Edge, ...]) -> float:
        """Sum of link latencies along ``route`` in seconds."""
        lat = self._latency
        if not lat:
            lat.update(((u, v), w) for u, v, w in self.graph.edges(data="latency"))
        return sum(map(lat.__getitem__, route))  # the same floats added in the same order

    def route_bandwidth(self, route: tuple[Edge, ...]) -> float:
        """Bottleneck bandwidth (bytes/s) of ``route``; infinite for an empty route."""
        return min((self.graph.edges[e]["bandwidth"] for e in route), default=float("inf"))

    @property
    def collective_start_s(self) -> float:
        """What starting one collective costs on a rank on average: ``collective_overhead`` (else
        ``comm_overhead``) plus ``collective_stall``."""
        base = self.comm_overhead_s if self.collective_overhead_s is None else self.collective_overhead_s
        return base + self.collective_stall_s

    def host_of(self, node: str) -> str:
        """The server a node belongs to: its name up to the first dot (``n3.gpu1`` -> ``n3``)."""
        return node.split(".", 1)[0]

    def host_indices(self, nodes: Sequence[str]) -> tuple[int, ...]:
        """The server index of each of ``nodes``, servers numbered in order of first appearance."""
        index: dict[str, int] = {}
        return tuple(index.setdefault(self.host_of(n), len(index)) for n in nodes)

    @property
    def num_hosts(self) -> int:
        return len(set(self.host_indices(self.ranks)))


def device_library() -> dict[str, DeviceSpec]:
    """The named device specs of ``topologies/devices.yaml`` (datasheet values, cited there): read once per version
    of the file (a sweep builds a cluster per point), a new dict each call (the specs are frozen)."""
    path = TOPOLOGY_DIR / DEVICE_LIBRARY
    try:
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
    except OSError:  # (load_yaml says what is wrong)
        stamp = (0, -1)
    return dict(_device_library(str(path), stamp))


@functools.lru_cache(maxsize=2)
def _device_library(path: str, stamp: tuple[int, int]) -> Mapping[str, DeviceSpec]:
    raw = load_yaml(path)
    return _parse_devices(raw.get("devices", {}), path, raw, ("devices",))


def load_topology(ref: str, params: Mapping[str, Any] | None = None, base_dir: Path | None = None,
                  force: bool = False) -> Cluster:
    """Load a preset by name or a topology YAML by path; ``params`` override a parametric preset's defaults.

    A parametric topology too big to build (:mod:`simulator.support.limits`), and a quantity outside
    :data:`simulator.units.PLAUSIBLE` (a link of ``400 B/s``), are refused unless ``force``.

    Raises :class:`InputError` located in the topology file, or with ``field`` set (``topology`` or
    ``topology_params.KEY``) when the problem is in the caller's reference or parameters.
    """
    path = _resolve(ref, base_dir)
    raw = load_yaml(path)
    src = str(path)
    if not isinstance(raw, Mapping):
        raise InputError("a topology file must be a mapping", file=src, line=1)
    if "builder" in raw:
        with gc_paused():  # (the explicit form of a large preset: dicts by the hundred thousand, none garbage)
            return build_cluster(expand_preset(raw, src, dict(params or {}), force), src, check=user_check(force))
    if params:
        raise InputError(f"{src} is an explicit topology and takes no parameters",
                         field=f"topology_params.{str(next(iter(params)))[:60]}")
    return build_cluster(raw, src, check=user_check(force))


def override_devices(cluster: Cluster, overrides: Mapping[str, Mapping[str, float]]) -> Cluster:
    """The cluster with some fields of named device specs replaced (``{"h100-sxm": {"eff_mem": 0.8}}``).

    A name that no device of the cluster uses is an :class:`InputError` (field ``devices.NAME``) listing those used.
    """
    if not overrides:
        return cluster
    used = sorted({spec.name for spec in cluster.specs.values()})
    for name in overrides:
        if name not in used:
            raise InputError(f"no device of topology {cluster.name!r} uses spec {name!r}; its devices: "
                             f"{', '.join(used)}", field=f"devices.{name}")
    replaced = {name: dataclasses.replace(spec, **dict(overrides[name]))  # type: ignore[arg-type]
                for name, spec in {s.name: s for s in cluster.specs.values()}.items() if name in overrides}
    specs = {node: replaced.get(spec.name, spec) for node, spec in cluster.specs.items()}
    return dataclasses.replace(cluster, specs=specs)


def _resolve(ref: str, base_dir: Path | None) -> Path:
    if not isinstance(ref, str) or not ref or "\0" in ref or len(ref) > 4096:
        raise InputError(f"must be a preset name or a file path, got {excerpt(ref)}", field="topology")
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        path = Path(ref)
        if not path.is_absolute() and base_dir is not None and not path.exists():
            path = base_dir / path
        if not path.exists():
            raise InputError(f"topology file {excerpt(ref)} not found", field="topology")
        return path
    preset = TOPOLOGY_DIR / f"{ref}.yaml"
    if ref in {Path(name).stem for name in NOT_PRESETS} or not preset.exists():
        raise InputError(f"unknown topology preset {excerpt(ref)}; presets: {', '.join(list_presets())}",
                         field="topology")
    return preset


def _locator(src: str, tree: Any, base: tuple[Any, ...]) -> Callable[[tuple[Any, ...], InputError], InputError]:
    def locate(sub: tuple[Any, ...], err: InputError) -> InputError:
        path = base + sub
        name = ".".join(str(p) for p in path)
        return err.located(file=src, line=line_of(tree, path), field=name or None)

    return locate


def _parse_devices(raw: Any, src: str, tree: Any, base: tuple[Any, ...], check: Check = CODE
                   ) -> dict[str, DeviceSpec]:
    locate = _locator(src, tree, base)
    if not isinstance(raw, Mapping):
        raise locate((), InputError("must map device names to specs"))
    return {name: parse_device_spec(name, spec, _locator(src, tree, (*base, name)), check)
            for name, spec in raw.items()}


_TOP_KEYS = {"name", "devices", "nodes", "links", "message_overhead", "comm_overhead", "collective_overhead",
             "collective_stall",
             "host_cores", "host_mem_bw", "host_copy_bw", "host_copy_bw_by_size", "description", "nccl_latency"}


def build_cluster(raw: Mapping[str, Any], src: str, tree: Any = None, *, check: Check = CODE) -> Cluster:
    """Build and validate a :class:`Cluster` from an explicit topology mapping (``nodes``/``links``). ``check``: what
    its quantities must satisfy beyond their sign and range (:class:`simulator.units.Check`: a user's file, read by
    :func:`load_topology`, writes every unit and, without ``--force``, plausible values; a mapping built by code,
    the default, may give plain SI numbers)."""
    with gc_paused():  # a graph of a node and link attributes' dict each: all alive, none garbage
        return _build_cluster(raw, src, raw if tree is None else tree, check)


def _build_cluster(raw: Mapping[str, Any], src: str, tree: Any, check: Check) -> Cluster:
    locate = _locator(src, tree, ())
    for key in raw:
        if key not in _TOP_KEYS:
            raise locate((key,), InputError(f"unknown key; valid keys: {', '.join(sorted(_TOP_KEYS))}"))
    specs_by_name = device_library()
    specs_by_name.update(_parse_devices(raw.get("devices", {}), src, tree, ("devices",), check))
    graph = nx.DiGraph()
    specs: dict[str, DeviceSpec] = {}
    nodes = raw.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise locate(("nodes",), InputError("must be a non-empty list of {name, kind, device}"))
    named: dict[str, dict[str, Any]] = {}  # each node's attributes, in the file's order
    for i, node in enumerate(nodes):
        _add_node(named, specs, specs_by_name, node, _locator(src, tree, ("nodes", i)))
    graph.add_nodes_from(named.items())
    links = raw.get("links")
    if not isinstance(links, list) or not links:
        raise locate(("links",), InputError("must be a non-empty list of {a, b, bandwidth, latency}"))
    edges: dict[Edge, dict[str, Any]] = {}  # each directed link's attributes, in the file's order
    parsed: dict[tuple[Any, ...], float] = {}  # a quantity's value, once per distinct (kind, type, value)
    for i, link in enumerate(links):
        _add_link(named, edges, parsed, link, _locator(src, tree, ("links", i)), check)
    graph.add_edges_from((a, b, attrs) for (a, b), attrs in edges.items())
    overhead = _quantity("time", raw.get("message_overhead", 0), locate, ("message_overhead",), 0.0, check)
    comm = _quantity("time", raw.get("comm_overhead", 0), locate, ("comm_overhead",), 0.0, check)
    coll = (None if raw.get("collective_overhead") is None
            else _quantity("time", raw["collective_overhead"], locate, ("collective_overhead",), 0.0, check))
    stall = _quantity("time", raw.get("collective_stall", 0), locate, ("collective_stall",), 0.0, check)
    ranks = tuple(n for n, k in graph.nodes(data="kind") if k == "gpu")
    if not ranks:
        raise locate(("nodes",), InputError("no node of kind gpu: a cluster needs at least one GPU"))
    _check_reachable(graph, locate)
    name = str(raw.get("name") or Path(src).stem)
    cluster = Cluster(name=name, graph=graph, specs=specs, ranks=ranks, message_overhead_s=overhead,
                      comm_overhead_s=comm, collective_overhead_s=coll, collective_stall_s=stall,
                      host_cores=_host_cores(raw.get("host_cores", {}), locate),
                      host_mem_bw=_host_bandwidths("host_mem_bw", raw, locate, check),
                      host_copy_bw=_host_bandwidths("host_copy_bw", raw, locate, check),
                      host_copy_bw_by_size=_host_curves(raw, locate),
                      nccl_latency=_nccl_latency(raw.get("nccl_latency", {}), locate, check))
    hosts = {cluster.host_of(r) for r in ranks}
    tables = {"host_cores": cluster.host_cores, "host_mem_bw": cluster.host_mem_bw,
              "host_copy_bw": cluster.host_copy_bw, "host_copy_bw_by_size": cluster.host_copy_bw_by_size}
    for key, table in tables.items():
        for host in table:
            if host not in hosts:
                raise locate((key, host), InputError(f"no rank is on host {excerpt(host)}; hosts: {sorted(hosts)}"))
            if key != "host_cores" and host not in cluster.host_cores:
                raise locate((key, host), InputError("needs host_cores for the same host"))
            if key == "host_copy_bw_by_size" and host not in cluster.host_copy_bw:
                raise locate((key, host), InputError("needs host_copy_bw for the same host (the nominal figure)"))
    return cluster


def _host_curves(raw: Mapping[str, Any],
                 locate: Callable[[tuple[Any, ...], InputError], InputError]) -> dict[str, SizeCurve]:
    """``host_copy_bw_by_size``: ``{HOST: {bytes: [...], bandwidth: [...]}}`` (:mod:`.size_curve`)."""
    table = raw.get("host_copy_bw_by_size", {})
    if not isinstance(table, Mapping):
        raise locate(("host_copy_bw_by_size",), InputError("must map host names to {bytes, bandwidth}"))
    return {str(h): parse_size_curve(v, locate, ("host_copy_bw_by_size", h)) for h, v in table.items()}


def _host_bandwidths(key: str, raw: Mapping[str, Any],
                     locate: Callable[[tuple[Any, ...], InputError], InputError], check: Check) -> dict[str, float]:
    """``host_mem_bw`` / ``host_copy_bw``: ``{HOST: "20 GB/s"}``."""
    table = raw.get(key, {})
    if not isinstance(table, Mapping):
        raise locate((key,), InputError("must map host names to bandwidths"))
    return {str(h): _quantity("bandwidth", v, locate, (key, h), None, check) for h, v in table.items()}


def _nccl_latency(raw: Any, locate: Callable[[tuple[Any, ...], InputError], InputError], check: Check
                  ) -> dict[str, float]:
    """``nccl_latency: {ALGO: {PROTOCOL: {KIND: TIME}}}``, flattened to ``{"ALGO.PROTOCOL.KIND": seconds}``."""
    out: dict[str, float] = {}
    levels = (("algorithm", ALGOS), ("protocol", PROTOCOLS), ("latency", LATENCY_KINDS))

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        if len(path) == len(levels):
            out[latency_key(*path)] = _quantity("time", node, locate, ("nccl_latency", *path), 0.0, check)
            return
        what, valid = levels[len(path)]
        if not isinstance(node, Mapping):
            raise locate(("nccl_latency", *path), InputError(f"must map {what} names ({', '.join(valid)}) to "
                                                             f"{'times' if len(path) == 2 else 'mappings'}"))
        for key, sub in node.items():
            if key not in valid:
                raise locate(("nccl_latency", *path, key),
                             InputError(f"unknown {what} {excerpt(key)}; valid: {', '.join(valid)}"))
            walk(sub, (*path, key))

    walk(raw, ())
    return out


def _host_cores(raw: Any, locate: Callable[[tuple[Any, ...], InputError], InputError]) -> dict[str, int]:
    """``host_cores: {HOST: CORES}``: the ranks on HOST share CORES CPU cores (their kernels slow down together)."""
    if not isinstance(raw, Mapping):
        raise locate(("host_cores",), InputError("must map host names to core counts"))
    out = {}
    for host, cores in raw.items():
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise locate(("host_cores", host), InputError(f"must be a positive integer, got {excerpt(cores)}"))
        out[str(host)] = cores
    return out


def _add_node(named: dict[str, dict[str, Any]], specs: dict[str, DeviceSpec], library: Mapping[str, DeviceSpec],
              node: Any, locate: Callable[[tuple[Any, ...], InputError], InputError]) -> None:
    """Check a node of the file and add its attributes to ``named`` (the graph takes them all at once)."""
    if not isinstance(node, Mapping):
        raise locate((), InputError("must be a mapping {name, kind, device}"))
    extra = set(node) - {"name", "kind", "device"}
    if extra:
        raise locate((sorted(extra, key=str)[0],), InputError("unknown key; valid keys: device, kind, name"))
    name = node.get("name")
    if not isinstance(name, str) or not name:
        raise locate(("name",), InputError(f"must be a non-empty string, got {excerpt(name)}"))
    if name in named:
        raise locate(("name",), InputError(f"duplicate node name {excerpt(name)}"))
    kind = node.get("kind")
    if kind not in NODE_KINDS:
        raise locate(("kind",), InputError(f"must be one of {', '.join(NODE_KINDS)}, got {excerpt(kind)}"))
    device = node.get("device")
    if device is not None:
        if kind not in ("gpu", "cpu"):
            raise locate(("device",), InputError(f"a {kind} node takes no device"))
        if not isinstance(device, str) or device not in library:
            raise locate(("device",), InputError(
                f"unknown device spec {excerpt(device)}; known: {', '.join(sorted(library))}"))
        specs[name] = library[device]
    elif kind == "gpu":
        raise locate(("device",), InputError("a gpu node needs a device spec"))
    named[name] = {"kind": kind, "device": device}


_LINK_KEYS = ("bandwidth", "latency", "class", "bandwidth_by_size")
_DUPLEX_KEYS, _SIMPLEX_KEYS = frozenset({"a", "b", *_LINK_KEYS}), frozenset({"src", "dst", *_LINK_KEYS})


def _add_link(named: Mapping[str, Any], edges: dict[Edge, dict[str, Any]], parsed: dict[tuple[Any, ...], float],
              link: Any, locate: Callable[[tuple[Any, ...], InputError], InputError], check: Check = CODE) -> None:
    """Check a link of the file and add its directed links' attributes to ``edges`` (the graph takes them all at
    once); ``parsed`` keeps each distinct quantity's value (a preset's thousands of links share a few)."""
    if not isinstance(link, Mapping):
        raise locate((), InputError("must be a mapping {a, b, bandwidth, latency}"))
    duplex = "a" in link or "b" in link
    ends = ("a", "b") if duplex else ("src", "dst")
    allowed = _DUPLEX_KEYS if duplex else _SIMPLEX_KEYS
    for key in link:
        if key not in allowed:
            raise locate((key,), InputError(
                f"unknown key; valid keys: {', '.join(sorted(allowed))} (a/b full duplex, src/dst one way)"))
    for end in ends:
        node = link.get(end)
        if not isinstance(node, str) or node not in named:  # (node names are strings: a list is no key)
            raise locate((end,), InputError(f"unknown node {excerpt(node)}"))
    u, v = link[ends[0]], link[ends[1]]
    if u == v:
        raise locate((ends[1],), InputError(f"a link needs two different nodes, got {excerpt(u)} twice"))
    if "bandwidth" not in link:
        raise locate((), InputError("missing field 'bandwidth'"))
    bw = _parsed(parsed, "bandwidth", link["bandwidth"], locate, ("bandwidth",), None, check)
    lat = _parsed(parsed, "time", link.get("latency", 0), locate, ("latency",), 0.0, check)
    cls = str(link.get("class", "link"))
    extra = {} if "bandwidth_by_size" not in link else {
        "by_size": parse_size_curve(link["bandwidth_by_size"], locate, ("bandwidth_by_size",))}
    for a, b in ((u, v), (v, u)) if duplex else ((u, v),):
        if (a, b) in edges:
            raise locate((), InputError(f"duplicate link {a} -> {b}"))
        edges[(a, b)] = {"bandwidth": bw, "latency": lat, "cls": cls, **extra}


def _parsed(parsed: dict[tuple[Any, ...], float], kind: str, value: Any,
            locate: Callable[[tuple[Any, ...], InputError], InputError], path: tuple[Any, ...],
            minimum: float | None, check: Check) -> float:
    """:func:`_quantity`, each distinct value (and type: an :class:`~simulator.units.SI` figure is not judged as a
    user's number is) parsed once; a value that fails is refused where it first appears, as unparsed."""
    if type(value) not in _SCALARS:  # (a list, a mapping...: refused by _quantity, never a key)
        return _quantity(kind, value, locate, path, minimum, check)
    key = (kind, type(value), value)
    hit = parsed.get(key)
    if hit is None:
        hit = parsed[key] = _quantity(kind, value, locate, path, minimum, check)
    return hit


_SCALARS = frozenset({str, int, float, SI})


def _quantity(kind: str, value: Any, locate: Callable[[tuple[Any, ...], InputError], InputError],
              path: tuple[Any, ...], minimum: float | None, check: Check = CODE) -> float:
    """Parse a quantity; ``minimum=None`` means strictly positive, else non-negative."""
    try:
        return checked_quantity(value, kind, positive=minimum is None, unit=check.unit,
                                plausible=check.plausible)
    except InputError as err:
        raise locate(path, err) from None


def _check_reachable(graph: nx.DiGraph, locate: Callable[[tuple[Any, ...], InputError], InputError]) -> None:
    """Every device (GPU or CPU) reaches every other by a route, no route passing through a GPU
    (:mod:`simulator.cluster.routing`): from ``a`` to ``b`` over a direct link, or from a node after ``a`` to one
    before ``b`` through nodes that are not GPUs. The nodes every device reaches that way (its non-GPU successors
    and what they reach) are found per strongly connected component of the graph without its GPUs; a device entered
    from one of the components all devices reach is reached by all, the others are checked pair by pair."""
    kind = dict(graph.nodes(data="kind"))
    devices = [n for n, k in kind.items() if k in ("gpu", "cpu")]
    rest = [n for n, k in kind.items() if k != "gpu"]
    index = {n: i for i, n in enumerate(rest)}
    code = np.array([index.get(n, -1) for n in kind], dtype=np.int64)  # each node's place in ``rest``, -1: a GPU
    order = {n: i for i, n in enumerate(kind)}
    links = np.fromiter((order[e] for edge in graph.edges for e in edge), dtype=np.int64).reshape(-1, 2)  # by node
    ends = code[links]
    ends = ends[(ends >= 0).all(axis=1)]
    adjacency = csr_matrix((np.ones(len(ends)), (ends[:, 0], ends[:, 1])), shape=(len(rest), len(rest)))
    _, labels = connected_components(adjacency, directed=True, connection="strong")
    comp = dict(zip(rest, labels.tolist(), strict=True))
    cond = nx.DiGraph()
    cond.add_nodes_from(set(comp.values()))
    cond.add_edges_from({(int(a), int(b)) for a, b in zip(labels[ends[:, 0]], labels[ends[:, 1]], strict=True)
                         if a != b})
    below: dict[int, frozenset[int]] = {}  # each component and those it reaches
    for c in reversed(list(nx.topological_sort(cond))):
        below[c] = frozenset({c}).union(*(below[x] for x in cond.successors(c)))

    def reach(d: str) -> frozenset[int]:  # components a route from d reaches without passing through a GPU
        return frozenset().union(*(below[comp[v]] for v in (d, *graph.successors(d)) if v in comp))

    def entered(d: str) -> set[int]:  # components a route into d comes from
        return {comp[v] for v in (d, *graph.predecessors(d)) if v in comp}

    # the same sets over arrays (a cluster of 131,072 GPUs has as many devices): each device's own component and its
    # successors' (reach) or predecessors' (entered), as (device, component) pairs; reach's union per distinct list
    label = np.full(len(kind), -1, dtype=np.int64)  # each node's component, -1: a GPU
    label[code >= 0] = labels[code[code >= 0]]
    device = np.fromiter((k in ("gpu", "cpu") for k in kind.values()), dtype=bool, count=len(kind))
    own = np.flatnonzero(device & (label >= 0))
    u, v = links[:, 0], links[:, 1]
    out = device[u] & (label[v] >= 0)
    into = device[v] & (label[u] >= 0)
    common = _common_reach(np.concatenate([own, u[out]]), np.concatenate([label[own], label[v[out]]]),
                           np.flatnonzero(device), below)
    common_mask = np.zeros(len(below), dtype=bool)  # (below holds every component, numbered from 0)
    common_mask[list(common)] = True
    entered_from = np.concatenate([label[own], label[u[into]]])
    ok = np.zeros(len(kind), dtype=bool)
    ok[np.concatenate([own, v[into]])[common_mask[entered_from]]] = True
    reached: dict[str, frozenset[int]] = {}
    for b in (d for d in devices if not ok[order[d]]):  # (a device entered from a common component is reached)
        into_b = entered(b)
        for a in devices:
            if a != b and not graph.has_edge(a, b) and not reached.setdefault(a, reach(a)) & into_b:
                raise locate(("links",), InputError(f"device {b} is unreachable from {a} (a route may not pass "
                                                    "through a GPU)"))


def _common_reach(nodes: np.ndarray, comps: np.ndarray, devices: np.ndarray, below: Mapping[int, frozenset[int]]
                  ) -> frozenset[int]:
    """The components every device reaches: ``(nodes[k], comps[k])`` pairs each device's own component and its
    successors' (``devices``: every device, some with no pair), each list's reach (the union of ``below``) worked out
    once per distinct list."""
    if not len(devices):
        return frozenset()
    pairs = np.unique(np.stack([nodes, comps], axis=1), axis=0) if len(nodes) else np.zeros((0, 2), dtype=np.int64)
    starts = np.searchsorted(pairs[:, 0], devices, side="left")
    stops = np.searchsorted(pairs[:, 0], devices, side="right")
    column = pairs[:, 1].tolist()
    lists = {tuple(column[a:b]) for a, b in zip(starts.tolist(), stops.tolist(), strict=True)}
    return frozenset.intersection(*(frozenset().union(*(below[c] for c in t)) for t in lists))
