"""The cluster room: topology YAML and parametric builders -> :class:`Cluster` (a networkx graph with device
specs), device specs and the roofline, routing, and the ``topo show`` summary."""

from simulator.cluster.topology import Cluster, load_topology

__all__ = ["Cluster", "load_topology"]
