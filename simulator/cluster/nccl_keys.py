"""The names a topology's ``nccl_latency`` table uses: NCCL's algorithms, protocols and latency kinds.

They live here, beside the topology that parses them, so that :mod:`simulator.cluster.topology` need not import the
collectives package (which imports the topology); :mod:`simulator.collectives.protocols` holds the values.
"""

from __future__ import annotations

__all__ = ["ALGOS", "LATENCY_KINDS", "PROTOCOLS", "latency_key"]

PROTOCOLS = ("LL", "LL128", "Simple")
ALGOS = ("ring", "tree", "nvls")
LATENCY_KINDS = ("base", "nvlink", "pci", "net")  # the collective's base latency, then per hop of each class


def latency_key(algo: str, proto: str, kind: str) -> str:
    """The key of one latency in a topology's ``nccl_latency`` table: ``"ring.LL.net"``."""
    return f"{algo}.{proto}.{kind}"
