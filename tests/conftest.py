"""Shared test helpers: tiny explicit topologies."""

from __future__ import annotations

from typing import Any

import pytest

from simulator.topology import Cluster, build_cluster


def star(n_hosts: int, bw: str = "10 GB/s", lat: str = "0 s", overhead: str = "0 s",
         device: str = "h100-sxm") -> Cluster:
    """``n_hosts`` GPUs h0..h{n-1} on one switch ``s``, full-duplex links of ``bw`` and ``lat``."""
    raw: dict[str, Any] = {
        "name": "star",
        "nodes": [{"name": f"h{i}", "kind": "gpu", "device": device} for i in range(n_hosts)]
        + [{"name": "s", "kind": "switch"}],
        "links": [{"a": f"h{i}", "b": "s", "bandwidth": bw, "latency": lat} for i in range(n_hosts)],
        "message_overhead": overhead,
    }
    return build_cluster(raw, "<star>")


@pytest.fixture
def make_star():
    return star
