"""What the collective tuner memoizes per cluster goes with the cluster (a sweep or a fit makes many)."""

from __future__ import annotations

import gc

from simulator.cluster.memo import cluster_memo, live_memos
from simulator.cluster.topology import load_topology
from simulator.collectives import fabric_of
from simulator.collectives.standalone import collective_schedule
from simulator.collectives.tuner import choose, predict


def _auto_allreduce(nodes: int) -> tuple[object, float]:
    cluster = load_topology("dgx-h100", {"nodes": nodes})
    fabric = fabric_of(cluster)
    ranks = list(range(len(cluster.ranks)))
    choice = choose("allreduce", ranks, 1 << 20, fabric, elem_bytes=2, dtype="bf16")
    collective_schedule(cluster, fabric, "allreduce", 1 << 20, 2, "bf16", "tree", "auto")
    return choice, predict("allreduce", ranks, 1 << 20, choice, fabric, elem_bytes=2, dtype="bf16")


def test_memos_are_dropped_with_their_cluster_and_answers_do_not_change():
    gc.collect()
    before = live_memos()
    first = _auto_allreduce(2)
    gc.collect()
    assert live_memos() == before  # the cluster is gone, so are its memos
    for _ in range(3):  # a fresh cluster each time (ids may be reused): the same answer, nothing kept
        assert _auto_allreduce(2) == first
        gc.collect()
        assert live_memos() == before


def test_a_memo_is_per_cluster_and_per_name():
    a, b = load_topology("dgx-h100", {"nodes": 1}), load_topology("dgx-h100", {"nodes": 1})
    cluster_memo(a, "x")[1] = "a"
    assert cluster_memo(a, "x") == {1: "a"} and cluster_memo(a, "y") == {} and cluster_memo(b, "x") == {}


def test_the_training_fabric_and_p2p_channels_go_with_their_cluster():
    """What refers back to its cluster (the training step's Fabric) is kept on the cluster, not in the id-keyed
    memos: a cluster that went through the training step and the engine's P2P channel count is freed."""
    import weakref

    from simulator.collectives import fabric_of
    from simulator.collectives.p2p import p2p_channels

    cluster = load_topology("dgx-h100", {"nodes": 2})
    gone = weakref.ref(cluster)
    assert fabric_of(cluster) is fabric_of(cluster)
    assert p2p_channels(cluster, cluster.ranks) is not None
    del cluster
    gc.collect()
    assert gone() is None
