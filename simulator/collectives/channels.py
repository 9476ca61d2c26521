"""A collective as NCCL runs it: split over channels, each channel an algorithm over its own ring, one protocol.

:func:`build` appends one collective with an explicit (algorithm, protocol, channel count) to a schedule: every
rank launches it once (the protocol's base latency), the buffer is split into one contiguous share per channel
(``chunk_bounds``), and each channel runs the algorithm on its share along the ring :class:`Fabric` gives it.
Channels only meet on shared links, where the flow engine divides the bandwidth. Every transfer carries the
protocol's bytes on the wire (and, inside one server, its links' overhead: :mod:`.goodput`) and its per-hop latency
(:mod:`simulator.collectives.protocols`).

Algorithms per operation (NCCL's, ``src/graph/tuning.cc``):

* ``ring``: allreduce (reduce-scatter then allgather, 2(P-1) steps of n/P), reduce-scatter and allgather (P-1
  steps), broadcast and reduce (pipelines along the ring from / to the root, in 512 KiB slices);
* ``tree`` (allreduce): NCCL's tree (:mod:`.nccl_tree`): inside every server a chain from the GPU of the
  channel's NIC, NCCL's double binary tree across those GPUs (half the share on each), one pipeline of chunks
  going up and down at once;
* ``hierarchical`` (allreduce): reduce-scatter inside every server, one ring allreduce per local GPU index across
  servers (each GPU on its own NIC rail), allgather inside;
* ``recursive-doubling`` (allreduce): log2 P pairwise exchanges of the whole share (tree protocol constants);
* ``nvls`` (allreduce on one NVSwitch server with NVLink SHARP): the switch reduces; each GPU's link carries its
  buffer and its head's share up, the share's sum and the multicast result down, in NCCL's NVLS loops
  (:mod:`.nvls`; needs the switch as a rank: ``switch_rank``);
* ``pairwise`` (alltoall): P-1 steps, in step k rank i sends its block for rank i+k. One channel: every GPU uses its
  own NIC (alltoall cannot aggregate NICs). Timing only: blocks keep their offsets (no numeric semantics).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from simulator.collectives.base import CollBuilder, chunk_bounds
from simulator.collectives.caps import arch_of, fabric_cap
from simulator.collectives.fabric import Fabric
from simulator.collectives.goodput import link_wire
from simulator.collectives.nccl_tree import channel_trees, tree_allreduce, tree_step
from simulator.collectives.nvls import nvls_allreduce, nvls_slices, nvls_wire
from simulator.collectives.protocols import base_latency, forward_grain, hop_latency, step_payload, wire_factor
from simulator.collectives.ring import lockstep, ring_allreduce, ring_broadcast, ring_reduce, ring_steps
from simulator.collectives.trees import recursive_doubling_allreduce
from simulator.errors import InputError
from simulator.schedule.core import Schedule
from simulator.workloads.collective import OPERATIONS

__all__ = ["OPERATIONS", "SUPPORTED", "Choice", "build", "choice_wire", "protocol_family"]

SUPPORTED: dict[str, tuple[str, ...]] = {  # operation -> algorithms (NCCL: tree and NVLS for allreduce only here)
    "allreduce": ("ring", "tree", "hierarchical", "recursive-doubling", "nvls"),
    "allgather": ("ring",), "reduce-scatter": ("ring",), "broadcast": ("ring",), "reduce": ("ring",),
    "alltoall": ("pairwise",),
}
_PROTO_FAMILY = {"ring": "ring", "tree": "tree", "hierarchical": "ring", "recursive-doubling": "tree", "nvls": "nvls",
                 "pairwise": "ring"}


def protocol_family(algo: str) -> str:
    """Whose protocol constants an algorithm pays: ``ring``, ``tree`` or ``nvls``."""
    return _PROTO_FAMILY[algo]


@dataclass(frozen=True)
class Choice:
    """The algorithm, protocol and channel count a collective runs with."""

    algo: str
    protocol: str
    channels: int


def choice_wire(choice: Choice, fabric: Fabric, ranks: Sequence[int]) -> float:
    """Bytes on the wire per payload byte of ``choice`` over ``ranks``: the protocol's line format, times NVLS's
    traffic and efficiency (:func:`.nvls.nvls_wire`) or, for the other algorithms, the server's link overhead
    (:func:`.goodput.link_wire`)."""
    wire = wire_factor(protocol_family(choice.algo), choice.protocol)
    if choice.algo == "nvls":
        return wire * nvls_wire(arch_of(fabric.device), len(ranks))
    return wire * link_wire(fabric, ranks)


def build(sched: Schedule, operation: str, ranks: Sequence[int], buf: str, n: int, choice: Choice, fabric: Fabric,
          *, elem_bytes: int, dtype: str, tag: str, deps: Mapping[int, Iterable[int]], op: str = "sum",
          root: int | None = None, switch_rank: int | None = None) -> dict[int, tuple[int, ...]]:
    """Append one collective; returns every rank's frontier (the ops after which its buffer holds the result)."""
    family = _PROTO_FAMILY[choice.algo]
    table = fabric.cluster.nccl_latency if fabric.cluster is not None else None
    b = CollBuilder.start(sched, ranks, buf, n, elem_bytes, dtype, op, tag, deps, operation,
                          root if operation in ("broadcast", "reduce") else None,
                          launch_s=base_latency(family, choice.protocol, table))
    if len(ranks) < 2 or n == 0:
        return b.front
    if choice.algo == "nvls" and (switch_rank is None or not (fabric.nvls and fabric.nodes == 1)):
        raise InputError("nvls needs one NVSwitch server with NVLink SHARP (H100, H200), the switch as a rank")
    b.wire = choice_wire(choice, fabric, ranks)
    b.slice_bytes = step_payload(choice.protocol)
    hop = {hw: hop_latency(family, choice.protocol, hw, table) for hw in (fabric.intra, "net")}
    hosts = fabric.hosts
    b.hop_s = lambda a, c: hop[fabric.hw(a, c) if max(a, c) < len(hosts) else fabric.intra]
    b.net_of, b.hop_pair = _net_of(hosts), (hop[fabric.intra], hop["net"])
    if choice.algo == "nvls":
        assert switch_rank is not None
        nvls_allreduce(b, ranks, switch_rank, nvls_slices(n * elem_bytes),
                       hop[fabric.intra])
        return b.front
    if choice.algo == "pairwise":
        _pairwise_alltoall(b, list(ranks))
        return b.front
    if choice.algo in ("ring", "tree"):  # NCCL's own algorithms: its per-channel caps (collectives.caps)
        cap = fabric_cap(fabric, operation, family, choice.protocol, ranks, choice.channels)
        b.cap = cap if math.isfinite(cap) else 0.0
        b.grain = forward_grain(choice.protocol)  # its pipelines (tree, broadcast, reduce) pass lines on
        b.crosses = lambda a, c: max(a, c) < len(hosts) and fabric.hw(a, c) == "net"  # as the tuner reads it
    if choice.algo == "tree":
        b.slice_bytes = tree_step(n * elem_bytes, choice.channels, choice.protocol,
                                  len({hosts[r] for r in ranks}), len(ranks))
    rings = fabric.rings(ranks, choice.channels)
    start = dict(b.front)
    ends: dict[int, tuple[int, ...]] = {r: () for r in ranks}
    for c, (lo, hi) in enumerate(chunk_bounds(n, choice.channels)):
        if hi == lo:
            continue
        b.front = dict(start)  # channels are independent: each starts from the launch
        _channel(b.view(lo, hi), operation, choice.algo, rings[c], fabric, c, root)
        for r in ranks:
            ends[r] = tuple(dict.fromkeys((*ends[r], *b.front[r])))
    b.front.clear()
    b.front.update({r: ends[r] or start[r] for r in ranks})
    return b.front


def _net_of(hosts: Sequence[int]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Over arrays of ranks, whether each connection a -> b leaves the server (``fabric.hw`` is ``net``; a rank
    beyond the GPUs, a switch, is inside): ``hop_s`` and ``crosses`` for many connections at once."""
    host = np.asarray(hosts, dtype=np.int64)
    last = len(host) - 1

    def net(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        inside = np.maximum(a, b) <= last
        return inside & (host[np.minimum(a, last)] != host[np.minimum(b, last)])

    return net


def _channel(b: CollBuilder, operation: str, algo: str, ring: list[int], fabric: Fabric, c: int,
             root: int | None) -> None:
    if operation == "allreduce":
        if algo == "ring":
            ring_allreduce(b, ring)
        elif algo == "tree":
            tree_allreduce(b, channel_trees(fabric, ring, c))
        elif algo == "recursive-doubling":
            recursive_doubling_allreduce(b, sorted(ring))
        else:
            _hierarchical_allreduce(b, ring, fabric)
    elif operation == "reduce-scatter":
        _ring_reduce_scatter(b, ring)
    elif operation == "allgather":
        _ring_allgather(b, ring)
    else:
        assert root is not None
        i = ring.index(root)
        chain = [*ring[i:], *ring[:i]]
        (ring_broadcast if operation == "broadcast" else ring_reduce)(b, chain, root)


def _ring_reduce_scatter(b: CollBuilder, ring: Sequence[int]) -> None:
    """After P-1 steps ring[i] holds chunk i reduced over all ranks (chunk j starts at ring[j+1])."""
    ring_steps(b, ring, -1, len(ring) - 1, reduce=True)  # step k: ring[i] passes chunk (i - k - 1)


def _ring_allgather(b: CollBuilder, ring: Sequence[int]) -> None:
    """ring[i] contributes chunk i; after P-1 steps every rank holds all chunks."""
    ring_steps(b, ring, 0, len(ring) - 1, reduce=False)  # step k: ring[i] passes chunk (i - k)


def _hierarchical_allreduce(b: CollBuilder, ring: list[int], fabric: Fabric) -> None:
    """Reduce-scatter inside servers, ring allreduce across servers per local index, allgather inside."""
    groups = fabric.groups(ring)
    sizes = {len(g) for g in groups}
    if len(groups) == 1 or len(sizes) > 1:  # one server, or uneven servers: a plain ring
        ring_allreduce(b, ring)
        return
    chunks = chunk_bounds(b.n, sizes.pop())
    for g in groups:
        _ring_reduce_scatter(b, g)  # g[i] holds chunk i of its server's sum
    for i, (lo, hi) in enumerate(chunks):
        if hi > lo:
            ring_allreduce(b.view(lo, hi), [g[i] for g in groups])
    for g in groups:
        _ring_allgather(b, g)


def _pairwise_alltoall(b: CollBuilder, ranks: list[int]) -> None:
    """P - 1 steps: at step k (1 .. P - 1) rank i sends its block for rank i + k (:func:`.ring.lockstep`)."""
    shift = np.arange(1, len(ranks), dtype=np.int64)
    lockstep(b, ranks, shift, (np.arange(len(ranks))[None, :] + shift[:, None]) % len(ranks), reduce=False)
