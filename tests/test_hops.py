"""The tuner's table of rank-to-rank connections (simulator.collectives.hops): each row's numbers are those of its
route, read one connection at a time, and the shared bandwidth of many paths is the per-link count's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cluster.topology import Cluster, load_topology
from simulator.collectives.hops import hop_table

CLUSTERS = {"dgx": load_topology("dgx-h100", {"nodes": 3, "gpus_per_node": 4}),
            "fat-tree": load_topology("cluster", {"nodes": 6, "gpus_per_node": 2, "inter": "fat-tree",
                                                  "nodes_per_leaf": 2, "spines": 2, "oversubscription": 2})}


def _shared_by_hand(cluster: Cluster, paths: list[list[tuple[int, int]]]) -> float:
    """What a path gets when all run at once: each link's bandwidth over the paths that cross it (once each)."""
    uses: dict[tuple[str, str], int] = {}
    routes = [[cluster.route(cluster.ranks[a], cluster.ranks[b]) for a, b in path] for path in paths]
    for path in routes:
        for edge in {e for route in path for e in route}:
            uses[edge] = uses.get(edge, 0) + 1
    return min((cluster.graph.edges[e]["bandwidth"] / uses[e] for path in routes for route in path for e in route),
               default=math.inf)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(CLUSTERS)), st.data())
def test_rows_are_their_routes_numbers(name: str, data: st.DataObject) -> None:
    cluster = CLUSTERS[name]
    p = len(cluster.ranks)
    table = hop_table(cluster)
    pair = st.tuples(st.integers(0, p - 1), st.integers(0, p - 1))
    pairs = data.draw(st.lists(pair, min_size=1, max_size=20))
    rows = table.rows_of(pairs)  # repeats and pairs asked before get the same row
    assert rows.tolist() == table.rows_of(pairs).tolist()
    links = table.links(rows)
    at = 0
    for (a, b), row in zip(pairs, rows.tolist(), strict=True):
        route = cluster.route(cluster.ranks[a], cluster.ranks[b])
        assert table.wire[row] == cluster.message_overhead_s + cluster.route_latency(route)
        assert table.free[row] == min((cluster.graph.edges[e]["bandwidth"] for e in route), default=math.inf)
        mine = links[at:at + len(route)]
        assert table.capacity[mine].tolist() == [cluster.graph.edges[e]["bandwidth"] for e in route]
        at += len(route)
    assert at == len(links)
    paths = data.draw(st.lists(st.lists(pair, min_size=1, max_size=6), min_size=1, max_size=5))
    assert table.shared([table.rows_of(path) for path in paths]) == _shared_by_hand(cluster, paths)


def test_a_connection_beyond_the_gpus_is_refused() -> None:
    table = hop_table(CLUSTERS["dgx"])
    with pytest.raises(ValueError, match="beyond the cluster's 12 GPUs"):
        table.rows(np.array([0]), np.array([12]))
    assert table.shared([]) == math.inf
