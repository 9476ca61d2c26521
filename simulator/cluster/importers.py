"""``treering topo import``: real servers in, an explicit topology YAML out.

Each input file describes one server (``nvidia-smi topo -m`` output or NCCL's topology XML dump; the format is
recognised from the content). With one file, ``nodes`` copies of that server are built; with several, one node per
file. The inter-node fabric is in neither format: :func:`simulator.cluster.builders.fabric` wires it (``rail``,
``fat-tree`` or ``single-switch``) between the NICs that join it (``--nics``, default all), at the NIC speed the XML
states or ``--nic-bandwidth`` (else the DGX NIC of the GPU model, said so in the file). The YAML carries comments
saying where each number came from and what was assumed; :func:`simulator.cluster.topology.build_cluster` loads it.

The files are untrusted: each is read as UTF-8 of at most :data:`MAX_INPUT_BYTES`; the options are checked before
any file is read (a known device spec and NVLink generation, at least one NIC named once); and the topology's size
is estimated before it is replicated over the nodes: a topology file holds at most
:data:`simulator.support.yaml_lines.MAX_YAML_BYTES`, so more nodes than fit are refused with the estimate. Text from
the files (device and port names, the file names) reaches the YAML only in comments, each on one line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from simulator.cluster.builders import fabric
from simulator.cluster.hostgraph import FABRICS, NVLINK_LANE_BPS, ImportOptions, ServerGraph, device_nic_bps
from simulator.cluster.import_nccl_xml import looks_like_xml, nccl_xml_server, parse_xml
from simulator.cluster.import_nvsmi import looks_like_nvsmi, nvsmi_server, parse_nvsmi
from simulator.cluster.topology import device_library
from simulator.errors import InputError, excerpt
from simulator.support.yaml_lines import MAX_YAML_BYTES, read_text_file
from simulator.units import LIMITS

__all__ = ["FABRICS", "MAX_INPUT_BYTES", "check_options", "import_topology", "read_server"]

MAX_INPUT_BYTES = 4 * 2**20  # one server's nvidia-smi matrix or NCCL dump: a few KB to a few tens of KB
_FABRIC_LINE_BYTES = 60  # a fabric link's line in the YAML takes at least this many bytes

# NCCL's base latency per operation (src/graph/tuning.cc, Ring/LL), as the presets use
COMM_OVERHEAD = "6.6 us"


def read_server(path: str | Path, opts: ImportOptions) -> ServerGraph:
    """Read one server from ``nvidia-smi topo -m`` output or an NCCL topology XML (recognised by content)."""
    src = str(path)
    text = read_text_file(path, MAX_INPUT_BYTES)
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
    check_options(opts)
    if nodes is not None and nodes < 1:
        raise InputError(f"must be at least 1, got {_count(nodes)}", field="--nodes")
    if nodes is not None and len(paths) > 1 and nodes != len(paths):
        raise InputError(f"{len(paths)} files give {len(paths)} nodes (one per file); got --nodes {_count(nodes)}",
                         field="--nodes")
    if fabric_kind not in FABRICS:
        raise InputError(f"unknown fabric {excerpt(fabric_kind)}; valid: {', '.join(FABRICS)}", field="--fabric")
    servers = [read_server(p, opts) for p in paths]
    n = len(servers) if nodes is None else nodes
    _check_size(servers, n)
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
    text = _render(name, servers, per_node, fab_nodes, fab_links, fab_note)
    size = len(text.encode("utf-8"))
    if size > MAX_YAML_BYTES:
        raise InputError(f"{n:,} node(s) write {size / 2**20:.3g} MiB of YAML; a topology file holds at most "
                         f"{MAX_YAML_BYTES / 2**20:g} MiB (fewer --nodes, or fewer --nics)", field="--nodes")
    return text


def check_options(opts: ImportOptions) -> None:
    """What the user tells the importer, checked before any file is read: a known device spec and NVLink generation,
    bandwidths within :data:`simulator.units.LIMITS`, NICs named at least once and at most once."""
    if opts.device is not None:
        known = device_library()
        if opts.device not in known:
            raise InputError(f"unknown device spec {excerpt(opts.device)}; known: {', '.join(sorted(known))}",
                             field="--device")
    if opts.nvlink_gen is not None and opts.nvlink_gen not in NVLINK_LANE_BPS:
        raise InputError(f"unknown NVLink generation {_count(opts.nvlink_gen)}; known: "
                         f"{', '.join(map(str, NVLINK_LANE_BPS))}", field="--nvlink-gen")
    low, high = LIMITS["bandwidth"]
    for flag, bw in (("--pcie-bandwidth", opts.pcie_Bps), ("--nic-bandwidth", opts.nic_Bps),
                     ("--smp-bandwidth", opts.smp_Bps)):
        if bw is not None and not low <= bw <= high:
            raise InputError(f"a bandwidth of {bw:.3g} B/s is outside {low:g} .. {high:g}", field=flag)
    if opts.nics is not None:
        if not opts.nics:
            raise InputError("names no NIC; give comma-separated NIC names (e.g. mlx5_0,mlx5_1), or leave --nics "
                             "out for every NIC", field="--nics")
        twice = sorted({excerpt(nic) for nic in opts.nics if opts.nics.count(nic) > 1})
        if twice:
            raise InputError(f"names {', '.join(twice)} more than once", field="--nics")


def _count(x: int) -> str:
    """An integer as a user wrote it, short whatever its size."""
    digits = str(abs(x))
    return f"{x:,}" if len(digits) <= 18 else f"{'-' if x < 0 else ''}about 1e{len(digits) - 1}"


def _check_size(servers: list[ServerGraph], n: int) -> None:
    """Refuse ``n`` nodes of ``servers`` whose YAML would be over :data:`MAX_YAML_BYTES`, before building them: each
    server's first node writes its entries with their comments, every other node a copy without them, and each node
    a fabric link per NIC."""
    last = f"n{n - 1}" if n <= MAX_YAML_BYTES else "n0"  # the longest node prefix (more than that never fits)

    def size(s: ServerGraph, commented: bool) -> int:
        lines = [*_node_lines(last, s, commented), *_link_lines(last, s, commented)]
        return len("\n".join(lines).encode("utf-8")) + (_FABRIC_LINE_BYTES * len(s.fabric_nics) if n > 1 else 0)

    firsts = {s.source: size(s, True) for s in servers}
    largest = max(servers, key=lambda s: firsts[s.source])
    if firsts[largest.source] > MAX_YAML_BYTES:
        raise InputError(f"one node of {len(largest.gpus):,} GPUs and {len(largest.links):,} links would write "
                         f"about {firsts[largest.source] / 2**20:,.3g} MiB of YAML; a topology file holds at most "
                         f"{MAX_YAML_BYTES / 2**20:g} MiB", file=largest.source)
    per_copy = max(size(s, False) for s in servers)
    copies = n - len(firsts)
    if sum(firsts.values()) + copies * per_copy > MAX_YAML_BYTES:
        mib = MAX_YAML_BYTES / 2**20
        estimate = sum(firsts.values()) + copies * per_copy
        written = f"about {estimate / 2**20:,.3g} MiB" if n <= MAX_YAML_BYTES else f"over {mib:g} MiB"
        fit = len(firsts) + max(0, MAX_YAML_BYTES - sum(firsts.values())) // per_copy
        raise InputError(f"{_count(n)} nodes of {len(largest.gpus):,} GPUs would write {written} of YAML; a topology "
                         f"file holds at most {mib:g} MiB: about {fit:,} such nodes", field="--nodes")


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


def _one_line(text: str) -> str:
    """``text`` for a YAML comment: anything that is not printable (a line break YAML knows, a control character)
    becomes a space, so that text from a file never starts a line of YAML."""
    return "".join(c if c.isprintable() else " " for c in text)


_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,200}$")


def _scalar(text: str) -> str:
    """``text`` as a YAML string: plain where it reads back as itself, else double-quoted (JSON is YAML)."""
    return text if _PLAIN.match(text) and yaml.safe_load(text) == text else json.dumps(text)


def _entry(fields: dict[str, Any], note: str = "") -> str:
    body = ", ".join(f"{k}: {v}" for k, v in fields.items() if v is not None)
    return f"  - {{{body}}}" + (f"  # {_one_line(note)}" if note else "")


def _node_lines(prefix: str, s: ServerGraph, commented: bool) -> list[str]:
    return [_entry({"name": f"{prefix}.{nd.name}", "kind": nd.kind, "device": nd.device}, nd.note if commented else "")
            for nd in s.nodes]


def _link_lines(prefix: str, s: ServerGraph, commented: bool) -> list[str]:
    return [_entry({"a": f"{prefix}.{lk.a}", "b": f"{prefix}.{lk.b}", "bandwidth": _bw(lk.bandwidth_Bps),
                    "latency": _lat(lk.latency_s), "class": lk.cls}, lk.note if commented else "") for lk in s.links]


def _render(name: str, servers: list[ServerGraph], per_node: list[ServerGraph], fab_nodes: list[dict[str, Any]],
            fab_links: list[dict[str, Any]], fab_note: str) -> str:
    out = [f"# Written by `treering topo import`: {len(per_node)} node(s) n0..n{len(per_node) - 1}, from",
           *(f"#   {_one_line(s.source)} ({s.fmt})" for s in servers),
           "# Where each number comes from is said beside it. What the inputs do not say:"]
    notes = dict.fromkeys(f"{s.source}: {note}" if len(servers) > 1 else note for s in servers for note in s.notes)
    out += [f"#   - {_one_line(note)}" for note in notes]
    out += [f"#   - {_one_line(fab_note)}",
            "#   - latencies: NVLink hop 468 ns (ASTRA-sim HGX-H100 fit, as the presets), Infinity Fabric link 936 ns "
            "and PCIe and SMP hops 0.5 us (assumed, as the presets)",
            f"name: {_scalar(name)}",
            "# NCCL's base latency per operation (src/graph/tuning.cc, Ring/LL), as the presets use",
            f"comm_overhead: {COMM_OVERHEAD}",
            "nodes:"]
    first = {s.source: i for i, s in reversed(list(enumerate(per_node)))}
    for i, s in enumerate(per_node):
        commented = first[s.source] == i
        out.append(f"  # n{i}: {_one_line(s.source)}" + ("" if commented else f" (as n{first[s.source]})"))
        out += _node_lines(f"n{i}", s, commented)
    if fab_nodes:
        out.append("  # inter-node fabric")
        out += [_entry({"name": nd["name"], "kind": nd["kind"]}) for nd in fab_nodes]
    out.append("links:")
    for i, s in enumerate(per_node):
        out.append(f"  # n{i}")
        out += _link_lines(f"n{i}", s, first[s.source] == i)
    if fab_links:
        out.append(f"  # inter-node fabric: {_one_line(fab_note)}")
        out += [_entry({"a": lk["a"], "b": lk["b"], "bandwidth": _bw(lk["bandwidth"]), "latency": _lat(lk["latency"]),
                        "class": lk["class"]}) for lk in fab_links]
    return "\n".join(out) + "\n"
