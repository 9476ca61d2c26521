"""Shared test helpers: tiny explicit topologies, a sweep scenario of a chosen size and its rows."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd
import pytest
from hypothesis import settings

from simulator.cluster.topology import Cluster, build_cluster

# hypothesis: "ci" by default; ``pytest --hypothesis-profile=long`` runs 50 times the examples (tests/test_fuzz.py)
settings.register_profile("ci", deadline=None, max_examples=100)
settings.register_profile("long", deadline=None, max_examples=5000)
settings.load_profile("ci")

ZERO_COMPUTE = {"peak_flops": {d: "1e30 FLOP/s" for d in ("fp64", "fp32", "bf16", "fp16", "fp8")},
                "mem_bw": "1e30 B/s", "mem": "80 GB", "launch_overhead": 0}


@pytest.fixture
def no_contention() -> Iterator[None]:
    """Transfers hold no SMs: for the closed forms of the timing model without contention (contention's own closed
    forms: tests/test_contention.py)."""
    with mock.patch("simulator.engine.core.p2p_channels", return_value=None), \
            mock.patch("simulator.engine.reference.p2p_channels", return_value=None):
        yield


def star(n_hosts: int, bw: str = "10 GB/s", lat: str = "0 s", overhead: str = "0 s",
         device: str = "h100-sxm", comm_overhead: str = "0 s") -> Cluster:
    """``n_hosts`` GPUs h0..h{n-1} on one switch ``s``, full-duplex links of ``bw`` and ``lat``.

    ``device="zero"`` is a device whose kernels take no time (for closed forms of communication alone).
    """
    raw: dict[str, Any] = {
        "devices": {"zero": ZERO_COMPUTE},
        "comm_overhead": comm_overhead,
        "name": "star",
        "nodes": [{"name": f"h{i}", "kind": "gpu", "device": device} for i in range(n_hosts)]
        + [{"name": "s", "kind": "switch"}],
        "links": [{"a": f"h{i}", "b": "s", "bandwidth": bw, "latency": lat} for i in range(n_hosts)],
        "message_overhead": overhead,
    }
    return build_cluster(raw, "<star>")


SWEEP = """
name: s
topology: dgx-h100
topology_params: {nodes: 1}
workload:
  kind: decode
  model: {heads: 8, head_dim: 64}
  context: 1000
algorithms: [ring, tree]
sweep:
  topology_params.nodes: [1, 2, 4]
  workload.context: [%s]
"""


def scenario(tmp_path: Path, contexts: int) -> Path:
    """A sweep of ring and tree over 1, 2 and 4 DGX H100 nodes and ``contexts`` contexts: 3 x ``contexts`` points."""
    path = tmp_path / "s.yaml"
    values = ", ".join(str(1000 + 100 * i) for i in range(contexts))
    path.write_text(textwrap.dedent(SWEEP % values).lstrip())
    return path


def rows(path: Path) -> pd.DataFrame:
    """A results.csv without its one measured column (``sim_wall_s``), in (point, algorithm) order."""
    df = pd.read_csv(path).drop(columns=["sim_wall_s"])
    return df.sort_values(["point", "algorithm"]).reset_index(drop=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first: a worker that starts one at the end would finish long after the other."""
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)


@pytest.fixture
def make_star():
    return star


def run_scenario(tmp_path: Path, text: str, *extra: str) -> Path:
    """``treering run`` of the scenario ``text`` (dedented) in one process; its output folder (the run must pass)."""
    from simulator.cli import main

    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(text))
    out = tmp_path / "o"
    assert main(["run", str(path), "-o", str(out), "--jobs", "1", *extra]) == 0
    return out
