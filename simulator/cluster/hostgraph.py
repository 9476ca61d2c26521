"""One server as read from a vendor tool's output: nodes, links and where each number came from.

The importers (:mod:`simulator.cluster.import_nvsmi`, :mod:`simulator.cluster.import_nccl_xml`) turn a file into a
:class:`ServerGraph`; :mod:`simulator.cluster.importers` replicates it over nodes, adds the inter-node fabric and
writes the explicit topology YAML. Link-class bandwidths (bytes/s, one direction) are pure functions here:

* NVLink: ``links x per-link rate``; the per-link rate per direction is 20 GB/s for NVLink1 (P100: 4 links, 160 GB/s
  bidirectional), 25 GB/s for NVLink2-4 (V100 6 x 50, A100 12 x 50, H100 18 x 50 GB/s bidirectional) and 50 GB/s for
  NVLink5 (B200: 18 links, 1.8 TB/s bidirectional), from NVIDIA's architecture pages.
* PCIe: ``GT/s x lanes x encoding / 8``; 8b/10b for 2.5 and 5 GT/s (Gen1, Gen2), 128b/130b from 8 GT/s (Gen3+):
  Gen4 x16 = 31.5 GB/s, Gen5 x16 = 63.0 GB/s per direction (PCI-SIG base specifications).
* NIC: its port speed, ``Mb/s x 1e6 / 8``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.errors import InputError

__all__ = ["FABRICS", "NVLINK_LANE_BPS", "NVLINK_LATENCY_S", "PCIE_LATENCY_S", "SMP_LATENCY_S", "ImportOptions", "Link",
           "Node", "ServerGraph", "device_defaults", "device_nic_bps", "nvlink_bandwidth", "pcie_bandwidth"]

FABRICS = ("rail", "fat-tree", "single-switch")  # the fabrics an imported topology's servers may join

# NVLink generation -> bytes/s per link per direction
NVLINK_LANE_BPS: dict[int, float] = {1: 20e9, 2: 25e9, 3: 25e9, 4: 25e9, 5: 50e9}

# Latencies are not in either input format. The presets' values (topologies/dgx-h100.yaml) are used: NVLink hop
# 468 ns (ASTRA-sim's validated HGX-H100 fit of 936 ns through the NVSwitch, halved), PCIe hop 0.5 us (an
# assumption); the CPU-to-CPU (SMP) hop 0.5 us is an assumption as well.
NVLINK_LATENCY_S = 468e-9
PCIE_LATENCY_S = 0.5e-6
SMP_LATENCY_S = 0.5e-6


# Device spec -> (NVLink generation, PCIe GT/s, lanes) of its SXM board: H100 SXM5 NVLink4 + PCIe Gen5 x16, A100 SXM4
# NVLink3 + PCIe Gen4 x16 (NVIDIA datasheets). Used only when the input file does not say.
_DEVICE_LINKS: dict[str, tuple[int, float, int]] = {"h100-sxm": (4, 32.0, 16), "a100-sxm": (3, 16.0, 16)}
# Device spec -> the NIC of its DGX: DGX H100 ConnectX-7 NDR 400 Gb/s, DGX A100 ConnectX-6 HDR 200 Gb/s (NVIDIA DGX
# user guides; the presets dgx-h100 / dgx-a100 use the same). Used only when neither the file nor --nic-bandwidth says.
_DEVICE_NIC_BPS: dict[str, float] = {"h100-sxm": 400e9 / 8, "a100-sxm": 200e9 / 8}


@dataclass(frozen=True)
class ImportOptions:
    """What the user tells the importer beyond the file (the CLI's options); ``None`` means infer, and say so."""

    device: str | None = None  # device spec of the GPUs (topologies/devices.yaml)
    nvlink_gen: int | None = None
    pcie_Bps: float | None = None  # GPU/NIC PCIe links when the file does not give them
    nic_Bps: float | None = None  # NIC port speed when the file does not give it (or to override it)
    nics: tuple[str, ...] | None = None  # NIC names (nvidia-smi legend / NCCL net names) joining the fabric
    smp_Bps: float = 40e9  # CPU socket to socket; an assumption (UPI / xGMI class), never in the inputs


def device_defaults(device: str) -> tuple[int, float, int] | None:
    """(NVLink generation, PCIe GT/s, lanes) of a known device spec, else ``None``."""
    return _DEVICE_LINKS.get(device)


def device_nic_bps(device: str) -> float | None:
    """The NIC speed (bytes/s) of the DGX built on ``device``, else ``None``."""
    return _DEVICE_NIC_BPS.get(device)


def nvlink_bandwidth(generation: int, links: int) -> float:
    """Bytes/s per direction of ``links`` bonded NVLinks of ``generation`` (1..5)."""
    if generation not in NVLINK_LANE_BPS:
        raise InputError(f"unknown NVLink generation {generation}; known: {', '.join(map(str, NVLINK_LANE_BPS))}")
    if links < 1:
        raise InputError(f"an NVLink bond needs at least one link, got {links}")
    return links * NVLINK_LANE_BPS[generation]


def pcie_bandwidth(gts: float, lanes: int) -> float:
    """Bytes/s per direction of a PCIe link of ``gts`` GT/s per lane and ``lanes`` lanes."""
    if gts <= 0 or lanes < 1:
        raise InputError(f"a PCIe link needs a positive rate and width, got {gts} GT/s x{lanes}")
    encoding = 0.8 if gts < 8 else 128 / 130
    return gts * 1e9 * lanes * encoding / 8


@dataclass(frozen=True)
class Node:
    """A node of one server; ``name`` is local (``gpu0``), the writer prefixes the server (``n3.gpu0``)."""

    name: str
    kind: str  # gpu | cpu | switch | nic
    device: str | None = None
    note: str = ""  # where it came from, written as a YAML comment


@dataclass(frozen=True)
class Link:
    """A full-duplex link of one server; ``note`` says where the bandwidth came from."""

    a: str
    b: str
    bandwidth_Bps: float
    latency_s: float
    cls: str
    note: str = ""


@dataclass
class ServerGraph:
    """One imported server. ``fabric_nics`` are the local names of the NICs that join the inter-node fabric, in
    rail order (``nic0``, ``nic1``, ...); ``nic_bandwidth_Bps`` is their port speed when the file states it."""

    source: str
    fmt: str  # a phrase: "nvidia-smi topo -m", "NCCL topology XML"
    nodes: list[Node] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    fabric_nics: list[str] = field(default_factory=list)
    nic_bandwidth_Bps: float | None = None
    notes: list[str] = field(default_factory=list)  # what was read and what was assumed

    def add_node(self, node: Node) -> None:
        self.nodes.append(node)

    def link(self, a: str, b: str, bw: float, lat: float, cls: str, note: str = "") -> None:
        self.links.append(Link(a, b, bw, lat, cls, note))

    @property
    def gpus(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "gpu"]
