"""What a run resolved from what its scenario wrote, said before it works and kept in ``meta.json``: the token
counts (``80K`` is 81,920 tokens: K = 1024) and the bandwidth of each class of its cluster's links (``400 Gb/s`` is
50 GB/s), so that a count or a unit read otherwise than meant shows at once.

>>> header({"tokens": {"workload.context": [81920, 655360]}, "bandwidth_Bps": {"nvlink": [4.5e11], "net": [5e10]}})
'context 81,920, 655,360 tokens; links nvlink 450 GB/s, net 50 GB/s'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from simulator.cluster.topology import Cluster
from simulator.run.prepared import PreparedPoint
from simulator.units import format_quantity
from simulator.workloads.decode import token_fields

__all__ = ["header", "resolved"]


def _add(table: dict[str, list[Any]], key: str, value: Any) -> None:
    values = table.setdefault(key, [])
    if value not in values:
        values.append(value)


def _link_bandwidths(cluster: Cluster, table: dict[str, list[float]]) -> None:
    for _, _, data in cluster.graph.edges(data=True):
        _add(table, str(data["cls"]), float(data["bandwidth"]))


def resolved(prepared: Sequence[PreparedPoint]) -> dict[str, Any]:
    """``{"tokens": {"workload.context": [81920, ...]}, "bandwidth_Bps": {"nvlink": [4.5e11], ...}}``: every
    distinct value over the points, in their order (bandwidths per link class, each cluster once)."""
    tokens: dict[str, list[int]] = {}
    bandwidths: dict[str, list[float]] = {}
    seen: set[int] = set()
    for prep in prepared:
        wl = prep.workload
        for name in token_fields(type(wl)):
            _add(tokens, f"workload.{name}", int(getattr(wl, name)))
        if id(prep.cluster) not in seen:
            seen.add(id(prep.cluster))
            _link_bandwidths(prep.cluster, bandwidths)
    return {"tokens": tokens, "bandwidth_Bps": {k: sorted(v) for k, v in bandwidths.items()}}


def header(values: dict[str, Any]) -> str:
    """One line: ``context 81,920 tokens; links nvlink 450 GB/s, pcie 64 GB/s, net 50 GB/s``."""
    parts = [f"{key.removeprefix('workload.')} {_few([f'{n:,}' for n in counts])} tokens"
             for key, counts in values["tokens"].items()]
    links = [f"{cls} {_few([format_quantity(b, 'bandwidth') for b in bws])}"
             for cls, bws in values["bandwidth_Bps"].items()]
    if links:
        parts.append("links " + ", ".join(links))
    return "; ".join(parts)


def _few(texts: list[str], most: int = 6) -> str:
    """The first ``most`` values, and how many more (a line stays a line on a 1,000-point sweep)."""
    more = f" and {len(texts) - most} more" if len(texts) > most else ""
    return ", ".join(texts[:most]) + more
