"""Read ``nvidia-smi topo -m`` output into a :class:`ServerGraph`.

The matrix gives, for every pair of GPUs and NICs, how they connect: ``NV#`` (a bond of # NVLinks), ``PIX`` (at
most one PCIe bridge), ``PXB`` (several bridges, no host bridge), ``PHB`` (through a PCIe host bridge), ``NODE``
(between host bridges of one NUMA node), ``SYS`` (across the SMP interconnect between NUMA nodes), ``X`` (self).
GPU rows end with the CPU / NUMA affinity columns; newer drivers name the NICs ``NIC#`` and add a ``NIC Legend``
(``NIC0: mlx5_0``), older ones name the columns after the devices.

The server built from it: one ``cpu{k}`` per NUMA node (SMP links between them); GPUs and NICs that are ``PIX`` or
``PXB`` to each other share a PCIe switch ``pcie{k}`` under their NUMA node's CPU, the others hang off the CPU
directly; NVLink bonds become one link per GPU to ``nvswitch`` when every GPU pair reports the same ``NV#`` (an
NVSwitch system: the bond is each GPU's link count), else a link per bonded pair. The file states neither the GPU
model, the NVLink generation, the PCIe generation nor the NIC speed: these come from the options or are inferred
from the device, and the notes say which.

The file is untrusted: a matrix of more than :data:`MAX_DEVICES` columns, or a bond of more than
:data:`MAX_NVLINKS` NVLinks, is refused with its line before any work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from simulator.cluster.hostgraph import (
    NVLINK_LANE_BPS,
    NVLINK_LATENCY_S,
    PCIE_LATENCY_S,
    SMP_LATENCY_S,
    ImportOptions,
    Node,
    ServerGraph,
    device_defaults,
    nvlink_bandwidth,
    pcie_bandwidth,
)
from simulator.errors import InputError, excerpt

__all__ = ["CELL_CODES", "MAX_DEVICES", "MAX_NVLINKS", "TopoMatrix", "looks_like_nvsmi", "nvsmi_server",
           "parse_nvsmi"]

CELL_CODES = ("X", "NV#", "PIX", "PXB", "PHB", "NODE", "SYS")
MAX_DEVICES = 512  # GPUs and NICs of one server (a DGX H100 shows 20)
MAX_NVLINKS = 64  # NVLinks bonded between two GPUs (NV18 on a DGX H100 or B200)
_CELL = re.compile(r"^(?:X|PIX|PXB|PHB|NODE|SYS|SOC|NV(\d{1,9}))$")  # SOC: older drivers' name for SYS
_GPU = re.compile(r"^GPU\d+$")
_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_AFFINITY_WORDS = ("CPU", "NUMA", "GPU")
# NV# of an all-to-all NVSwitch board -> the device spec it indicates
_NV_DEVICE = {18: "h100-sxm", 12: "a100-sxm"}


@dataclass(frozen=True)
class TopoMatrix:
    """The parsed matrix: ``cells[a][b]`` for device names ``a, b``; ``numa`` per GPU (``None`` if not shown)."""

    devices: tuple[str, ...]  # column names in order (GPU0.., NIC0.. or mlx5_0..)
    cells: dict[str, dict[str, str]]
    numa: dict[str, str | None]
    cpu_affinity: dict[str, str | None]
    nic_names: dict[str, str]  # column -> NIC device name (the legend, else the column)

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if _GPU.match(d)]

    @property
    def nics(self) -> list[str]:
        return [d for d in self.devices if not _GPU.match(d)]


def looks_like_nvsmi(text: str) -> bool:
    return any(line.split()[:1] == ["GPU0"] for line in text.splitlines())


def parse_nvsmi(text: str, src: str) -> TopoMatrix:
    """Parse ``nvidia-smi topo -m`` output; :class:`InputError` located at the offending line and cell."""
    lines = text.splitlines()
    head = next((i for i, line in enumerate(lines) if line.split()[:1] == ["GPU0"]), None)
    if head is None:
        raise InputError("no nvidia-smi topo -m matrix: expected a header line starting with GPU0", file=src, line=1)
    devices: list[str] = []
    for tok in lines[head].split():
        if tok in _AFFINITY_WORDS:
            break
        devices.append(tok)
    n = len(devices)
    if n > MAX_DEVICES:
        raise InputError(f"{n:,} columns: at most {MAX_DEVICES} devices (GPUs and NICs) on one server", file=src,
                         line=head + 1, field="columns")
    twice = next((tok for i, tok in enumerate(devices) if tok in devices[:i]), None)
    if twice is not None:
        raise InputError(f"column {twice} appears twice", file=src, line=head + 1, field=twice)
    cells: dict[str, dict[str, str]] = {}
    numa: dict[str, str | None] = {}
    cpus: dict[str, str | None] = {}
    for k, dev in enumerate(devices):
        i = head + 1 + k
        toks = lines[i].split() if i < len(lines) else []
        if toks[:1] != [dev]:
            where = min(i, len(lines)) + 1
            raise InputError(f"truncated matrix: expected the row of {dev} ({n} rows for {n} columns)",
                             file=src, line=where, field=dev)
        row = toks[1:1 + n]
        if len(row) < n:
            raise InputError(f"truncated row: {len(row)} cells, expected {n} (one per column)",
                             file=src, line=i + 1, field=dev)
        for j, code in enumerate(row):
            cell = _CELL.match(code)
            if not cell:
                raise InputError(f"unknown cell code {excerpt(code)}; known: {', '.join(CELL_CODES)}",
                                 file=src, line=i + 1, field=f"{dev}/{devices[j]}")
            if cell.group(1) and int(cell.group(1)) > MAX_NVLINKS:
                raise InputError(f"{code}: at most {MAX_NVLINKS} NVLinks bond two GPUs", file=src, line=i + 1,
                                 field=f"{dev}/{devices[j]}")
            if (code == "X") != (j == k):
                raise InputError(f"{code!r}: X must be on the diagonal and only there",
                                 file=src, line=i + 1, field=f"{dev}/{devices[j]}")
        cells[dev] = dict(zip(devices, row, strict=True))
        rest = toks[1 + n:]
        cpus[dev] = rest[0] if rest and rest[0] != "N/A" else None
        numa[dev] = rest[1] if len(rest) > 1 and rest[1] != "N/A" else None
    for a in devices:
        for b in devices:
            if cells[a][b] != cells[b][a]:
                raise InputError(f"not symmetric: {a}/{b} is {cells[a][b]} but {b}/{a} is {cells[b][a]}",
                                 file=src, line=head + 2 + devices.index(b), field=f"{b}/{a}")
    legend = {m.group(1): m.group(2) for line in lines[head + 1 + n:] if (m := _LEGEND.match(line))}
    if not any(_GPU.match(d) for d in devices):
        raise InputError("the matrix has no GPU column", file=src, line=head + 1)
    nic_names = {d: legend.get(d, d) for d in devices if not _GPU.match(d)}
    return TopoMatrix(tuple(devices), cells, numa, cpus, nic_names)


def _nv(code: str) -> int:
    m = _CELL.match(code)
    return int(m.group(1)) if m and m.group(1) else 0


def nvsmi_server(m: TopoMatrix, src: str, opts: ImportOptions) -> ServerGraph:
    """Build the server described by matrix ``m`` (see the module docstring for the rules)."""
    sg = ServerGraph(source=src, fmt="nvidia-smi topo -m")
    gpus = m.gpus
    pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    bonds = {(a, b): _nv(m.cells[a][b]) for a, b in pairs}
    device = _device(bonds, opts, sg)
    gen = _nvlink_gen(device, bonds, opts, sg)
    pcie_bw = _pcie(device, opts, sg)
    nics = _selected_nics(m, opts, src)
    numa = _numa_of(m, gpus, nics, sg)
    names = {g: f"gpu{i}" for i, g in enumerate(gpus)} | {c: f"nic{k}" for k, c in enumerate(nics)}
    for cpu in sorted(set(numa.values())):
        sg.add_node(Node(f"cpu{cpu}", "cpu", note=f"NUMA node {cpu} (CPU affinity of its GPUs)"))
    for g in gpus:
        sg.add_node(Node(names[g], "gpu", device, note=f"{g}: CPU affinity {m.cpu_affinity[g] or 'N/A'}, "
                                                     f"NUMA affinity {m.numa[g] or 'N/A'}"))
    for c in nics:
        sg.add_node(Node(names[c], "nic", note=f"{c}: {m.nic_names[c]}"))
    _nvlinks(sg, names, gpus, bonds, gen)
    _pcie_tree(sg, m, names, gpus + nics, numa, pcie_bw)
    cpus = sorted(set(numa.values()))
    for i, a in enumerate(cpus):
        for b in cpus[i + 1:]:
            sg.link(f"cpu{a}", f"cpu{b}", opts.smp_Bps, SMP_LATENCY_S, "smp",
                    "SYS: socket to socket, not in the input; assumed (--smp-bandwidth)")
    sg.fabric_nics = [names[c] for c in nics]
    dropped = [m.nic_names[c] for c in m.nics if c not in nics]
    if dropped:
        sg.notes.append(f"NICs left out (not in --nics): {', '.join(dropped)}")
    return sg


def _nvlinks(sg: ServerGraph, names: dict[str, str], gpus: list[str], bonds: dict[tuple[str, str], int],
             gen: int) -> None:
    counts = set(bonds.values())
    if len(gpus) > 2 and len(counts) == 1 and 0 not in counts:
        k = counts.pop()
        sg.add_node(Node("nvswitch", "switch", note=f"NV{k} between every GPU pair: each GPU's {k} NVLinks go to "
                                                    "the NVSwitch fabric (one node for all its switch chips)"))
        for g in gpus:
            sg.link(names[g], "nvswitch", nvlink_bandwidth(gen, k), NVLINK_LATENCY_S, "nvlink",
                    f"NV{k}: {k} x NVLink{gen} at {NVLINK_LANE_BPS[gen] / 1e9:g} GB/s per direction")
        return
    for (a, b), k in bonds.items():
        if k:
            sg.link(names[a], names[b], nvlink_bandwidth(gen, k), NVLINK_LATENCY_S, "nvlink",
                    f"{a}/{b} NV{k}: {k} x NVLink{gen} at {NVLINK_LANE_BPS[gen] / 1e9:g} GB/s per direction")


def _pcie_tree(sg: ServerGraph, m: TopoMatrix, names: dict[str, str], members: list[str], numa: dict[str, int],
               pcie_bw: float) -> None:
    """Devices PIX/PXB to each other share a PCIe switch under their NUMA node's CPU; the others hang off the CPU."""
    root = {d: d for d in members}

    def find(d: str) -> str:
        while root[d] != d:
            d = root[d]
        return d

    for i, a in enumerate(members):
        for b in members[i + 1:]:
            if m.cells[a][b] in ("PIX", "PXB"):
                root[find(b)] = find(a)
    groups: dict[str, list[str]] = {}
    for d in members:
        groups.setdefault(find(d), []).append(d)
    switch = 0
    for group in groups.values():
        cpu = f"cpu{numa[group[0]]}"
        up = cpu
        if len(group) > 1:
            up = f"pcie{switch}"
            switch += 1
            sg.add_node(Node(up, "switch", note="PCIe switch: " + ", ".join(group) + " are PIX/PXB to each other"))
            sg.link(up, cpu, pcie_bw, PCIE_LATENCY_S, "pcie", "switch uplink to its host bridge (width assumed)")
        for d in group:
            code = "PIX/PXB" if len(group) > 1 else "PHB/NODE/SYS to the rest"
            sg.link(names[d], up, pcie_bw, PCIE_LATENCY_S, "pcie", f"{d} ({code})")


def _device(bonds: dict[tuple[str, str], int], opts: ImportOptions, sg: ServerGraph) -> str:
    if opts.device:
        sg.notes.append(f"GPU model: {opts.device} (--device)")
        return opts.device
    counts = set(bonds.values())
    if len(counts) == 1 and (k := next(iter(counts))) in _NV_DEVICE:
        dev = _NV_DEVICE[k]
        sg.notes.append(f"GPU model: not in nvidia-smi topo -m; assumed {dev} from NV{k} between every GPU pair "
                        f"(other GPU models can show NV{k} too: pass --device)")
        return dev
    raise InputError("nvidia-smi topo -m does not name the GPU model and it cannot be inferred from the NVLink "
                     "bonds; pass --device (a spec of topologies/devices.yaml)", field="--device")


def _nvlink_gen(device: str, bonds: dict[tuple[str, str], int], opts: ImportOptions, sg: ServerGraph) -> int:
    if opts.nvlink_gen:
        sg.notes.append(f"NVLink generation {opts.nvlink_gen} (--nvlink-gen)")
        return opts.nvlink_gen
    known = device_defaults(device)
    if known:
        sg.notes.append(f"NVLink generation {known[0]}: that of {device} (not in nvidia-smi topo -m)")
        return known[0]
    if any(bonds.values()):
        raise InputError(f"the NVLink generation of {device} is not known; pass --nvlink-gen", field="--nvlink-gen")
    return 0


def _pcie(device: str, opts: ImportOptions, sg: ServerGraph) -> float:
    if opts.pcie_Bps:
        sg.notes.append(f"PCIe links: {opts.pcie_Bps / 1e9:.4g} GB/s per direction (--pcie-bandwidth)")
        return opts.pcie_Bps
    _, gts, lanes = device_defaults(device) or (0, 16.0, 16)
    sg.notes.append(f"PCIe links: {gts:g} GT/s x{lanes} = {pcie_bandwidth(gts, lanes) / 1e9:.4g} GB/s per direction, "
                    f"assumed from {device} (nvidia-smi topo -m gives no PCIe generation; --pcie-bandwidth sets it)")
    return pcie_bandwidth(gts, int(lanes))


def _selected_nics(m: TopoMatrix, opts: ImportOptions, src: str) -> list[str]:
    if opts.nics is None:
        return m.nics
    by_name = {name: col for col, name in m.nic_names.items()}
    for name in opts.nics:
        if name not in by_name and name not in m.nic_names:
            raise InputError(f"no NIC {name!r} in {src}; NICs: {', '.join(m.nic_names.values())}", field="--nics")
    return [by_name.get(name, name) for name in opts.nics]


def _numa_of(m: TopoMatrix, gpus: list[str], nics: list[str], sg: ServerGraph) -> dict[str, int]:
    """NUMA node index per GPU (NUMA Affinity, else CPU Affinity groups) and per NIC (its nearest GPU's)."""
    keys = [m.numa[g] or m.cpu_affinity[g] or "0" for g in gpus]
    order = list(dict.fromkeys(keys))
    numa = {g: order.index(k) for g, k in zip(gpus, keys, strict=True)}
    for nic in nics:
        near = min(gpus, key=lambda g: _rank(m.cells[nic][g]))
        if _rank(m.cells[nic][near]) == _PCI_RANK["SYS"]:
            sg.notes.append(f"{m.nic_names[nic]} is SYS to every GPU: placed on NUMA node {order[0]} (assumed)")
            numa[nic] = 0
        else:
            numa[nic] = numa[near]
    return numa


_PCI_RANK = {"X": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5, "SOC": 5}


def _rank(code: str) -> int:
    return _PCI_RANK.get(code, 6)
