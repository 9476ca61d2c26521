"""The size limits estimate a collective's ops as they do a schedule's: per algorithm, the one that runs (``auto``:
the tuner's pick), so that a collective too big to run is refused before it is built, with one located line."""

from __future__ import annotations

import textwrap

import pytest

import simulator.run.kinds.collective as kind_module
from simulator.cli import main
from simulator.cluster.topology import load_topology
from simulator.collectives import fabric_of
from simulator.collectives.nccl_tree import tree_parts
from simulator.collectives.standalone import collective_choice, collective_schedule
from simulator.errors import InputError
from simulator.run.prepare import prepare_point
from simulator.run.scenario import load_scenario
from simulator.support.limits import collective_ops

BUILT = [("hgx-h200", 2, "allreduce", "ring", "LL", 2**29), ("hgx-h200", 4, "allreduce", "tree", "LL", 2**29),
         ("hgx-h200", 4, "allreduce", "tree", "Simple", 2**19), ("dgx-h100", 2, "allreduce", "tree", "LL128", 2**19),
         ("hgx-h200", 4, "allreduce", "hierarchical", "LL", 2**29),
         ("hgx-h200", 4, "allreduce", "recursive-doubling", "LL", 2**29),
         ("hgx-h200", 1, "allreduce", "nvls", "LL", 2**29),
         ("hgx-h200", 2, "allgather", "ring", "LL", 2**29), ("hgx-h200", 2, "reduce-scatter", "ring", "LL", 2**29),
         ("hgx-h200", 2, "broadcast", "ring", "LL", 2**29), ("hgx-h200", 2, "reduce", "ring", "LL", 2**29),
         ("hgx-h200", 4, "alltoall", "pairwise", "LL", 2**29), ("mi300x", 1, "allreduce", "tree", "LL", 2**29)]


@pytest.mark.parametrize(("topo", "nodes", "operation", "algo", "protocol", "n"), BUILT)
def test_the_estimate_bounds_the_ops_built_closely(topo, nodes, operation, algo, protocol, n):
    """1 GiB of bf16 (a pipeline's chunks all used), and for the tree 1 MiB (fewer parts: counted)."""
    cluster = load_topology(topo, {"nodes": nodes})
    fabric = fabric_of(cluster)
    sched, choice = collective_schedule(cluster, fabric, operation, n, 2, "bf16", algo, protocol)
    assert collective_choice(cluster, fabric, operation, n, 2, "bf16", algo, protocol) == choice
    p = len(cluster.ranks)
    parts = tree_parts(n, 2, choice.channels, choice.protocol, fabric.nodes, p) if choice.algo == "tree" else None
    est = collective_ops(p, choice.channels, choice.algo, operation, p // fabric.nodes, parts)
    assert len(sched.ops) <= est <= 1.4 * len(sched.ops) + 1_000


SCENARIO = """\
name: c
topology: hgx-h200
topology_params: {nodes: 64}
workload: {kind: collective, collective: allreduce, bytes: 1 GiB, dtype: bf16}
algorithms: [tree, ring]
"""


def _write(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_ring_too_big_is_refused_and_the_tree_beside_it_is_not(tmp_path, capsys):
    """512 GPUs: the ring's 2 (P - 1) steps a channel are 10.5M ops, the tree's pipeline 1M (the estimate before
    issue 41, the largest of any algorithm's, refused both)."""
    path = _write(tmp_path, SCENARIO)
    assert main(["run", str(path), "-o", str(tmp_path / "out"), "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"treering: error: {path}:5: algorithms.1: the ring allreduce on 512 GPUs x 8 "
                              f"channel(s) would have too many ops: about 1.05e+07 (limit 10,000,000; ~2.72 GB of "
                              f"memory); --force runs it anyway"), err
    assert not (tmp_path / "out" / "results.csv").exists()
    prepare_point(load_scenario(path, ["algorithms=[tree, auto]"], False)[0])  # tree, and auto's pick: tree


def test_auto_is_estimated_by_what_it_runs(tmp_path, monkeypatch):
    """Where auto's candidates straddle the limit the tuner's pick decides (512 GPUs: the tree, 1M ops, not the
    ring's 10.5M); where all are over, the smallest is refused at once, without the tuner."""
    path = _write(tmp_path, SCENARIO)
    prepare_point(load_scenario(path, ["algorithms=[auto]"], False)[0])
    asked = []
    monkeypatch.setattr(kind_module, "collective_choice", lambda *a: asked.append(a))
    sets = ["topology_params.nodes=100", "algorithms=[{name: auto, protocol: LL128, channels: 64}]"]
    with pytest.raises(InputError, match=r"algorithms\.0: the tree allreduce on 800 GPUs x 64 channel\(s\) would "
                                         r"have too many ops: about 1\.23e\+07"):
        prepare_point(load_scenario(path, sets, False)[0])
    assert not asked
    prepare_point(load_scenario(path, sets, True)[0])  # --force
