"""What a server's GPU-to-GPU links carry of their line rate, for a collective inside the server.

A topology gives links their line rate (the vendors' figures). Where the vendor documents that a link class moves
less payload than that, a collective's transfers carry ``1 / efficiency`` bytes on the wire per payload byte:

* xGMI (AMD Infinity Fabric) between MI300X GPUs: "xGMI's raw bandwidth is rated up to 64 GB/s for each
  point-to-point link ... CRC bit correction and protocol overhead ... reduce the usable bandwidth to approximately
  48 GB/s per link" (AMD ROCm blog, "Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X",
  2025-03-02, rocm.blogs.amd.com/software-tools-optimization/mi300x-rccl-xgmi): 48 / 64 = 0.75. RCCL's rings on the
  full mesh use every link once each way (:func:`.fabric.mesh_rings`), so the bus bandwidth of a large allreduce
  tends to 7 x 48 GB/s less the reductions' share.

It applies where every hop of the collective is inside one server (its ranks on one host); across servers the
network's hops would need their own factor, which the model does not have (a multi-server collective keeps the line
rate). NVLink's data rate (NCCL's 20.6 GB/s of a 25 GB/s Hopper link) is charged to NVLS only (:mod:`.nvls`): on
NVSwitch servers the ring's serialized reductions already bring it to the measured ring bandwidth (365-370 GB/s on
8 x H100, NCCL issue 1455), so NVLink rings keep the line rate.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.collectives.fabric import Fabric

__all__ = ["LINK_EFFICIENCY", "link_efficiency", "link_wire"]

# (device name prefix, link class) -> payload share of the line rate
LINK_EFFICIENCY: dict[tuple[str, str], float] = {
    ("mi300", "infinity-fabric"): 48.0 / 64.0,
    ("mi300", "xgmi"): 48.0 / 64.0,
}


def link_efficiency(device: str, link_class: str) -> float:
    """The payload share of the line rate of a ``link_class`` link between ``device`` GPUs (1.0: none known)."""
    name = device.lower()
    for (prefix, cls), eff in LINK_EFFICIENCY.items():
        if name.startswith(prefix) and link_class == cls:
            return eff
    return 1.0


def link_wire(fabric: Fabric, ranks: Sequence[int]) -> float:
    """Bytes on the wire per payload byte that ``fabric``'s links add to a collective over ``ranks``: the inverse
    of the server's link efficiency where the ranks share one server, else 1."""
    if len(ranks) < 2 or len(fabric.groups(ranks)) > 1:
        return 1.0
    return 1.0 / link_efficiency(fabric.device, fabric.link_class)
