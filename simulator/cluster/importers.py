"""``treering topo import``: real servers in, an explicit topology YAML out.

Each input file describes one server (``nvidia-smi topo -m`` output or NCCL's topology XML dump; the format is
recognised from the content). With one file, ``nodes`` copies of that server are built; with several, one node per
file. The inter-node fabric is in neither format: :func:`simulator.cluster.builders.fabric` wires it (``rail``,
``fat-tree`` or ``single-switch``) between the NICs that join it (``--nics``, default all), at the NIC speed the XML
states or ``--nic-bandwidth`` (else the DGX NIC of the GPU model, said so in the file). The YAML carries comments
saying where each number came from and what was assumed; :func:`simulator.cluster.topology.build_cluster` loads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from simulator.cluster.builders import fabric
from simulator.cluster.hostgraph import FABRICS, ImportOptions, ServerGraph, device_nic_bps
from simulator.cluster.import_nccl_xml import looks_like_xml, nccl_xml_server, parse_xml
from simulator.cluster.import_nvsmi import looks_like_nvsmi, nvsmi_server, parse_nvsmi
from simulator.errors import InputError

__all__ = ["FABRICS", "import_topology", "read_server"]

# NCCL's base latency per operation (src/graph/tuning.cc, Ring/LL), as the presets use
COMM_OVERHEAD = "6.6 us"


def read_server(path: str | Path, opts: ImportOptions) -> ServerGraph:
    """Read one server from ``nvidia-smi topo -m`` output or an NCCL topology XML (recognised by content)."""
    src = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise InputError("no such file", file=src) from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read it as text: {err}", file=src) from None
    if looks_like_xml(text):
        return nccl_xml_server(parse_xml(text, src), src, opts)
    if looks_like_nvsmi(text):
        return nvsmi_server(parse_nvsmi(text, src), src, opts)
    raise InputError("unrecognised format: expected `nvidia-smi topo -m` output (a header line starting with GPU0) "
                     "or an NCCL topology XML dump (<system>)", file=src, line=1)


def import_topology(paths: Sequence[str | Path], *, nodes: int | None = None, fabric_kind: str = "rail",
                    name: str = "imported", opts: ImportOptions | None = None,
                    fabric_params: Mapping[str, Any] | None = None) -> str:
    """The explicit topology YAML (with comments) of the servers in ``paths``; see the module docstring."""
    opts = opts or ImportOptions()
    if not paths:
        raise InputError("give at least one file", field="FILE")
    servers = [read_server(p, opts) for p in paths]
    n = len(servers) if nodes is None else nodes
    if n < 1:
        raise InputError(f"must be at least 1, got {n}", field="--nodes")
    if len(servers) > 1 and n != len(servers):
        raise InputError(f"{len(servers)} files give {len(servers)} nodes (one per file); got --nodes {n}",
                         field="--nodes")
    if fabric_kind not in FABRICS:
        raise InputError(f"unknown fabric {fabric_kind!r}; valid: {', '.join(FABRICS)}", field="--fabric")
    per_node = [servers[i % len(servers)] for i in range(n)]
    fab_nodes: list[dict[str, Any]] = []
    fab_links: list[dict[str, Any]] = []
    fab_note = "single node: no inter-node fabric"
    if n > 1:
        nics = {len(s.fabric_nics) for s in per_node}
        if len(nics) > 1 or 0 in nics:
            counts = ", ".join(f"{s.source}: {len(s.fabric_nics)}" for s in servers)
            raise InputError(f"every node needs the same number (> 0) of fabric NICs; got {counts}", field="--nics")
        nic_bw, how = _nic_speed(per_node, opts)
        params = {"inter": fabric_kind, "nic_bandwidth": nic_bw, **(fabric_params or {})}
        fab_nodes, fab_links = fabric(n, nics.pop(), params)
        fab_note = (f"{fabric_kind} fabric (builders.py, as the presets), {nic_bw * 8 / 1e9:g} Gb/s per NIC ({how}); "
                    "the fabric is not in the inputs: assumed")
    return _render(name, servers, per_node, fab_nodes, fab_links, fab_note)


def _nic_speed(servers: list[ServerGraph], opts: ImportOptions) -> tuple[float, str]:
    if opts.nic_Bps:
        return opts.nic_Bps, "--nic-bandwidth"
    stated = {s.source: s.nic_bandwidth_Bps for s in servers if s.nic_bandwidth_Bps}
    if stated:
        unstated = sorted({s.source for s in servers} - set(stated))
        rest = f"; assumed the same for {', '.join(unstated)}" if unstated else ""
        return min(stated.values()), f"the slowest NIC speed stated in the input{rest}"
    devices = {g.device for s in servers for g in s.gpus}
    guess = {device_nic_bps(d or "") for d in devices}
    if len(guess) == 1 and (bw := guess.pop()):
        return bw, f"not in the input; assumed the DGX NIC of {', '.join(sorted(d or '' for d in devices))}"
    raise InputError("the NIC speed is not in the input; pass --nic-bandwidth (e.g. 400Gb/s)", field="--nic-bandwidth")


def _bw(x: float) -> str:
    return f"{x / 1e9:.12g} GB/s"


def _lat(x: float) -> str:
    return f"{x * 1e9:.10g} ns"


def _entry(fields: dict[str, Any], note: str = "") -> str:
    body = ", ".join(f"{k}: {v}" for k, v in fields.items() if v is not None)
    return f"  - {{{body}}}" + (f"  # {note}" if note else "")


def _render(name: str, servers: list[ServerGraph], per_node: list[ServerGraph], fab_nodes: list[dict[str, Any]],
            fab_links: list[dict[str, Any]], fab_note: str) -> str:
    out = [f"# Written by `treering topo import`: {len(per_node)} node(s) n0..n{len(per_node) - 1}, from",
           *(f"#   {s.source} ({s.fmt})" for s in servers),
           "# Where each number comes from is said beside it. What the inputs do not say:"]
    notes = dict.fromkeys(f"{s.source}: {note}" if len(servers) > 1 else note for s in servers for note in s.notes)
    out += [f"#   - {note}" for note in notes]
    out += [f"#   - {fab_note}",
            "#   - latencies: NVLink hop 468 ns (ASTRA-sim HGX-H100 fit, as the presets), Infinity Fabric link 936 ns "
            "and PCIe and SMP hops 0.5 us (assumed, as the presets)",
            f"name: {name}",
            "# NCCL's base latency per operation (src/graph/tuning.cc, Ring/LL), as the presets use",
            f"comm_overhead: {COMM_OVERHEAD}",
            "nodes:"]
    first = {s.source: i for i, s in reversed(list(enumerate(per_node)))}
    for i, s in enumerate(per_node):
        commented = first[s.source] == i
        out.append(f"  # n{i}: {s.source}" + ("" if commented else f" (as n{first[s.source]})"))
        out += [_entry({"name": f"n{i}.{nd.name}", "kind": nd.kind, "device": nd.device},
                       nd.note if commented else "") for nd in s.nodes]
    if fab_nodes:
        out.append("  # inter-node fabric")
        out += [_entry({"name": nd["name"], "kind": nd["kind"]}) for nd in fab_nodes]
    out.append("links:")
    for i, s in enumerate(per_node):
        commented = first[s.source] == i
        out.append(f"  # n{i}")
        out += [_entry({"a": f"n{i}.{lk.a}", "b": f"n{i}.{lk.b}", "bandwidth": _bw(lk.bandwidth_Bps),
                        "latency": _lat(lk.latency_s), "class": lk.cls}, lk.note if commented else "")
                for lk in s.links]
    if fab_links:
        out.append(f"  # inter-node fabric: {fab_note}")
        out += [_entry({"a": lk["a"], "b": lk["b"], "bandwidth": _bw(lk["bandwidth"]), "latency": _lat(lk["latency"]),
                        "class": lk["class"]}) for lk in fab_links]
    return "\n".join(out) + "\n"
