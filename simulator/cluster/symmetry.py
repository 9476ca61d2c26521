"""Whether a cluster's servers are all the same, so that work confined to one server takes the same time on each.

A parametric preset builds every server alike (``dgx-h100`` with ``nodes: 64``): the same devices at the same local
indices, the same links between them, the same routes. Then a schedule whose ops stay inside each server, the same
on every one (a tensor-parallel group's kernels and allreduces: :func:`simulator.models.step.dense_layer`), runs the
same on each: the engine never shares a link between two servers' flows, and every server's events fall at the same
instants (the same floats), so one server's timeline is every server's. :func:`server_size` checks the conditions
on the graph once per cluster.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.cluster.memo import cluster_memo
from simulator.cluster.topology import Cluster

__all__ = ["first_server", "server_size"]


def server_size(cluster: Cluster) -> int | None:
    """The GPUs per server when the cluster has several servers and all are alike (None otherwise): the ranks are
    in server order, as many on each; every server's GPUs have the first server's devices at the same local index;
    the links among every server's own nodes are the first server's (by local name: ``n3.gpu1`` is ``gpu1`` of
    ``n3``), attribute for attribute; and the route between any two GPUs of a server stays inside it and is the
    first server's. Servers whose ranks share host CPU cores (``host_cores``) are never taken as alike."""
    memo = cluster_memo(cluster, "server size")
    if "size" not in memo:
        memo["size"] = _server_size(cluster)
    size: int | None = memo["size"]
    return size


def first_server(cluster: Cluster, n: int, group: int) -> int:
    """How many of the cluster's first ``n`` ranks to build so that their timeline is every server's: the GPUs of
    one server where the ``n`` ranks fill whole alike servers (:func:`server_size`), two or more, and groups of
    ``group`` consecutive ranks (a TP group) never cross a server; else ``n``."""
    gpn = server_size(cluster)
    if gpn is None or n <= gpn or n % gpn or gpn % group:
        return n
    return gpn


def _server_size(cluster: Cluster) -> int | None:
    ranks = cluster.ranks
    if cluster.host_cores or cluster.host_mem_bw or cluster.host_copy_bw or cluster.host_copy_bw_by_size:
        return None
    hosts = cluster.host_indices(ranks)
    servers = hosts[-1] + 1 if hosts else 0
    if servers < 2 or len(ranks) % servers:
        return None
    gpn = len(ranks) // servers
    if hosts != tuple(r // gpn for r in range(len(ranks))) or any("." not in n for n in ranks):
        return None
    index = {cluster.host_of(ranks[h * gpn]): h for h in range(servers)}
    graph = cluster.graph
    where: dict[str, tuple[int, str]] = {}  # a server's node -> (the server, its local name)
    nodes: list[dict[str, Any]] = [{} for _ in range(servers)]
    for node, data in graph.nodes(data=True):
        host = cluster.host_of(node)
        h = index.get(host)
        if h is not None:
            where[node] = (h, node[len(host) + 1:])
            nodes[h][node[len(host) + 1:]] = data
    links: list[dict[tuple[str, str], Any]] = [{} for _ in range(servers)]
    link_server: list[int] = []  # by link id (the graph's edge order, as routes name links): its server, or -1
    link_local: list[int] = []  # and its local (from, to) names, numbered
    numbered: dict[tuple[str, str], int] = {}
    for u, out in graph.adjacency():
        a = where.get(u)
        for v, data in out.items():
            b = where.get(v)
            if a is not None and b is not None and a[0] == b[0]:
                links[a[0]][a[1], b[1]] = data
                link_server.append(a[0])
                link_local.append(numbered.setdefault((a[1], b[1]), len(numbered)))
            else:
                link_server.append(-1)
                link_local.append(-1)
    if any(nodes[h] != nodes[0] or links[h] != links[0] for h in range(1, servers)):
        return None
    if any(cluster.specs[ranks[h * gpn + i]] != cluster.specs[ranks[i]] for h in range(servers) for i in range(gpn)):
        return None
    pairs = [(ranks[h * gpn + i], ranks[h * gpn + j]) for h in range(servers) for i in range(gpn)
             for j in range(gpn) if i != j]
    starts, ids, _ = cluster.paths(pairs)
    counts = np.diff(starts).reshape(servers, -1)
    if (counts != counts[0]).any():
        return None
    server_of, local_of = np.asarray(link_server)[ids], np.asarray(link_local)[ids]
    per = len(ids) // servers  # every server's routes take as many links, in the same order
    if (server_of != np.repeat(np.arange(servers), per)).any() or \
            (local_of.reshape(servers, per) != local_of[:per]).any():
        return None
    return gpn
