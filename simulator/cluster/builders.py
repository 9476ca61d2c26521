"""The parametric ``cluster`` builder: nodes x gpus_per_node, an intra-node fabric and an inter-node fabric.

It expands a preset (``builder: cluster`` plus ``params:``) into the explicit form (``nodes:``/``links:``) that
:func:`simulator.cluster.topology.build_cluster` validates, so presets and users' files share one code path.

Node names: ``n{i}.gpu{j}``, ``n{i}.nvswitch`` (intra ``switch``), ``n{i}.host`` (intra ``pcie-host``),
``n{i}.nic{k}``; fabric switches ``leaf{i}``/``spine{s}`` (fat-tree), ``rail{k}``/``spine{s}`` (rail),
``fabric`` (single-switch).

Intra-node: ``switch`` (every GPU has one link of ``intra_bandwidth`` to the node switch), ``mesh`` (a link of
``intra_bandwidth`` between every GPU pair), ``pcie-host`` (each GPU has a PCIe link to the host; no peer-to-peer,
so GPU-to-GPU traffic is routed, i.e. staged, through the host). With a NIC per GPU or more, NIC ``k`` hangs off
GPU ``k * G // nics`` over PCIe; with fewer, NIC ``k`` and the GPUs ``j`` with ``j * nics // G == k`` share a PCIe
switch ``n{i}.pcie{k}`` (as a DGX's GPUs share theirs with their NIC: no route passes through a GPU, so a NIC
reaches its GPUs over PCIe, not through one of them); for ``pcie-host`` every NIC hangs off the host.
Inter-node (only when ``nodes > 1``): ``fat-tree`` (leaves of ``nodes_per_leaf`` nodes, ``spines`` spines, uplinks
sized by ``oversubscription``), ``rail`` (NIC ``k`` of every node on rail switch ``k``; spines join the rails,
non-blocking), ``single-switch``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

from simulator.errors import InputError, excerpt
from simulator.support.limits import MAX_COUNT, check_builder
from simulator.support.yaml_lines import line_of
from simulator.units import SI, checked_quantity

__all__ = ["PARAMS", "expand_preset", "fabric"]


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InputError(f"must be a positive integer, got {excerpt(v)}")
    if v > MAX_COUNT:
        raise InputError(f"must be at most {MAX_COUNT}, got {excerpt(v)}")
    return v


def _choice(*options: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        if v not in options:
            raise InputError(f"must be one of {', '.join(options)}, got {excerpt(v)}")
        return str(v)

    return parse


class _Quantity:
    """A parameter that is a quantity of ``kind`` (with its unit; ``plausible``: within units.PLAUSIBLE). Parsed
    to a :class:`~simulator.units.SI` value: the expansion's links carry it on without a unit."""

    def __init__(self, kind: str, positive: bool) -> None:
        self.kind, self.positive = kind, positive

    def __call__(self, v: Any, plausible: bool = False) -> float:
        return SI(checked_quantity(v, self.kind, positive=self.positive, plausible=plausible))


def _pos(kind: str) -> _Quantity:
    return _Quantity(kind, positive=True)


def _nonneg(kind: str) -> _Quantity:
    return _Quantity(kind, positive=False)


def _ratio(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 1:
        raise InputError(f"must be a number >= 1, got {excerpt(v)}")
    return float(v)


def _text(v: Any) -> str:
    if not isinstance(v, str) or not v or len(v) > 200:
        raise InputError(f"must be a name (a non-empty string), got {excerpt(v)}")
    return v


# name -> (parser, default)
PARAMS: dict[str, tuple[Callable[[Any], Any], Any]] = {
    "nodes": (_int, 1),
    "gpus_per_node": (_int, 8),
    "device": (_text, "h100-sxm"),
    "intra": (_choice("switch", "mesh", "pcie-host"), "switch"),
    "intra_class": (_text, None),
    "intra_bandwidth": (_pos("bandwidth"), "450 GB/s"),
    "intra_latency": (_nonneg("time"), "0.468 us"),
    "pcie_bandwidth": (_pos("bandwidth"), "64 GB/s"),
    "pcie_latency": (_nonneg("time"), "0.5 us"),
    "host_device": (_text, None),
    "inter": (_choice("fat-tree", "rail", "single-switch"), "rail"),
    "nics_per_node": (_int, None),
    "nic_bandwidth": (_pos("bandwidth"), "400 Gb/s"),
    "nic_latency": (_nonneg("time"), "0.6 us"),
    "fabric_latency": (_nonneg("time"), "0.3 us"),
    "nodes_per_leaf": (_int, 4),
    "spines": (_int, 2),
    "oversubscription": (_ratio, 1.0),
    "message_overhead": (_nonneg("time"), 0),
    "comm_overhead": (_nonneg("time"), 0),
}


def _params(raw: Mapping[str, Any], src: str, overrides: dict[str, Any], force: bool = False) -> dict[str, Any]:
    """Builder defaults, then the preset's ``params:``, then the caller's overrides (aliases resolved); quantities
    judged plausible unless ``force``."""
    aliases = raw.get("aliases") or {}
    for key in ("aliases", "params"):
        if not isinstance(raw.get(key) or {}, Mapping):
            raise InputError("must be a mapping", file=src, line=line_of(raw, (key,)), field=key)
    values: dict[str, Any] = {k: d for k, (_, d) in PARAMS.items()}
    override_key: dict[str, str] = {}  # builder param -> the caller's key that set it
    for key, val in (raw.get("params") or {}).items():
        if key not in PARAMS:
            raise InputError(f"unknown builder parameter; valid: {', '.join(PARAMS)}", file=src,
                             line=line_of(raw, ("params", key)), field=f"params.{key}")
        values[key] = val
    for key, val in overrides.items():
        target = aliases.get(key, key) if isinstance(key, str) else key
        if not isinstance(target, str) or target not in PARAMS:
            valid = sorted({*PARAMS, *aliases})
            raise InputError(f"unknown parameter of this topology; valid: {', '.join(valid)}",
                             field=f"topology_params.{key}")
        values[target] = val
        override_key[target] = key
    out: dict[str, Any] = {}
    for key, val in values.items():
        try:
            if val is None and PARAMS[key][1] is not None:
                raise InputError(f"needs a value (default {PARAMS[key][1]!r}), got null")
            parse = PARAMS[key][0]
            out[key] = None if val is None else parse(val, not force) if isinstance(parse, _Quantity) else parse(val)
        except InputError as err:
            if key in override_key:
                raise err.located(field=f"topology_params.{override_key[key]}") from None
            raise err.located(file=src, line=line_of(raw, ("params", key)), field=f"params.{key}") from None
    return out


_PASSED = ("devices", "collective_overhead", "collective_stall", "host_cores", "host_mem_bw", "host_copy_bw",
           "host_copy_bw_by_size", "nccl_latency")
_TOP_KEYS = {"name", "builder", "params", "aliases", "description", *_PASSED}


def expand_preset(raw: Mapping[str, Any], src: str, overrides: dict[str, Any], force: bool = False
                  ) -> dict[str, Any]:
    """Expand a ``builder: cluster`` preset into the explicit ``{devices, nodes, links}`` form.

    A topology estimated over :data:`simulator.support.limits.MAX_GRAPH_ELEMENTS` is refused unless ``force``."""
    for key in raw:
        if key in ("message_overhead", "comm_overhead"):
            raise InputError(f"a builder topology takes {key} under params:", file=src, line=line_of(raw, (key,)),
                             field=str(key))
        if key not in _TOP_KEYS:
            raise InputError(f"unknown key; valid keys: {', '.join(sorted(_TOP_KEYS))}", file=src,
                             line=line_of(raw, (key,)), field=str(key)[:60])
    if raw.get("builder") != "cluster":
        raise InputError(f"unknown builder {excerpt(raw.get('builder'))}; valid: cluster", file=src,
                         line=line_of(raw, ("builder",)), field="builder")
    p = _params(raw, src, overrides, force)
    sizes = ("nodes", "gpus_per_node", "nics_per_node", "intra", "inter", "nodes_per_leaf", "spines")
    given = [k for k in overrides if (raw.get("aliases") or {}).get(k, k) in sizes]
    try:
        check_builder(p, f"topology_params.{given[0]}" if given else "topology_params" if overrides else "params",
                      force)
    except InputError as err:
        raise (err if overrides else err.located(file=src, line=line_of(raw, ("params",)))) from None
    nodes: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    n_nodes, g = p["nodes"], p["gpus_per_node"]
    nics = p["nics_per_node"] or g
    for i in range(n_nodes):
        _intra(i, g, p, nodes, links)
        if n_nodes > 1:
            anchor = f"n{i}.host" if p["intra"] == "pcie-host" else None
            shared = anchor is None and nics < g  # GPUs share their NIC's PCIe switch
            for k in range(nics):
                nic = f"n{i}.nic{k}"
                nodes.append({"name": nic, "kind": "nic"})
                up = anchor or (f"n{i}.pcie{k}" if shared else f"n{i}.gpu{k * g // nics}")
                if shared:
                    nodes.append({"name": up, "kind": "switch"})
                    links.extend(_link(f"n{i}.gpu{j}", up, p["pcie_bandwidth"], p["pcie_latency"], "pcie")
                                 for j in range(g) if j * nics // g == k)
                links.append(_link(nic, up, p["pcie_bandwidth"], p["pcie_latency"], "pcie"))
    if n_nodes > 1:
        _inter(n_nodes, nics, p, nodes, links)
    out: dict[str, Any] = {"name": raw.get("name", "cluster"), "nodes": nodes, "links": links,
                           "message_overhead": p["message_overhead"], "comm_overhead": p["comm_overhead"]}
    out.update({key: raw[key] for key in _PASSED if key in raw})
    return out


def fabric(n_nodes: int, nics: int, overrides: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The inter-node fabric alone, as :func:`expand_preset` wires it: the switch nodes and the links from NICs
    ``n{i}.nic{k}`` (which the caller provides) up to the spines. ``overrides`` are builder parameters (``inter``,
    ``nic_bandwidth``, ...); a bad value raises :class:`InputError` with the field ``--KEY``."""
    p = {k: None if d is None else PARAMS[k][0](d) for k, (_, d) in PARAMS.items()}
    for key, val in overrides.items():
        try:  # a float is the caller's figure in SI units (an importer's, from a flag or a file it parsed)
            p[key] = PARAMS[key][0](SI(val) if type(val) is float else val)
        except InputError as err:
            raise err.located(field=f"--{key.replace('_', '-')}") from None
    nodes: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    if n_nodes > 1:
        _inter(n_nodes, nics, p, nodes, links)
    return nodes, links


def _link(a: str, b: str, bw: float, lat: float, cls: str) -> dict[str, Any]:
    return {"a": a, "b": b, "bandwidth": _si(bw), "latency": _si(lat), "class": cls}


@functools.lru_cache(maxsize=64)
def _si(x: float) -> SI:
    """``SI(x)``, one object per value: a preset's links by the hundred thousand share a few figures."""
    return SI(x)


def _intra(i: int, g: int, p: dict[str, Any], nodes: list[dict[str, Any]], links: list[dict[str, Any]]) -> None:
    gpus = [f"n{i}.gpu{j}" for j in range(g)]
    nodes.extend({"name": name, "kind": "gpu", "device": p["device"]} for name in gpus)
    bw, lat = p["intra_bandwidth"], p["intra_latency"]
    if p["intra"] == "switch":
        sw = f"n{i}.nvswitch"
        nodes.append({"name": sw, "kind": "switch"})
        links.extend(_link(gpu, sw, bw, lat, p["intra_class"] or "nvlink") for gpu in gpus)
    elif p["intra"] == "mesh":
        links.extend(_link(gpus[a], gpus[b], bw, lat, p["intra_class"] or "mesh")
                     for a in range(g) for b in range(a + 1, g))
    else:
        host = {"name": f"n{i}.host", "kind": "cpu"}
        if p["host_device"]:
            host["device"] = p["host_device"]
        nodes.append(host)
        links.extend(_link(gpu, f"n{i}.host", p["pcie_bandwidth"], p["pcie_latency"], p["intra_class"] or "pcie")
                     for gpu in gpus)


def _inter(n: int, nics: int, p: dict[str, Any], nodes: list[dict[str, Any]], links: list[dict[str, Any]]) -> None:
    nic_bw, nic_lat, fab_lat = p["nic_bandwidth"], p["nic_latency"], p["fabric_latency"]
    spines = p["spines"]
    if p["inter"] == "single-switch":
        nodes.append({"name": "fabric", "kind": "switch"})
        links.extend(_link(f"n{i}.nic{k}", "fabric", nic_bw, nic_lat, "net") for i in range(n) for k in range(nics))
        return
    if p["inter"] == "rail":
        leaves = [f"rail{k}" for k in range(nics)]
        members = {f"rail{k}": [f"n{i}.nic{k}" for i in range(n)] for k in range(nics)}
        uplink = n * nic_bw / spines
    else:
        per_leaf = p["nodes_per_leaf"]
        count = math.ceil(n / per_leaf)
        leaves = [f"leaf{j}" for j in range(count)]
        members = {f"leaf{j}": [f"n{i}.nic{k}" for i in range(j * per_leaf, min(n, (j + 1) * per_leaf))
                                for k in range(nics)] for j in range(count)}
        uplink = per_leaf * nics * nic_bw / (p["oversubscription"] * spines)
    for leaf in leaves:
        nodes.append({"name": leaf, "kind": "switch"})
        links.extend(_link(nic, leaf, nic_bw, nic_lat, "net") for nic in members[leaf])
    if len(leaves) > 1:
        for s in range(spines):
            nodes.append({"name": f"spine{s}", "kind": "switch"})
            links.extend(_link(leaf, f"spine{s}", uplink, fab_lat, "fabric") for leaf in leaves)
