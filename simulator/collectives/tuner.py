"""``auto``: the (algorithm, protocol, channels) with the lowest predicted time, as NCCL's tuner picks them.

NCCL (``src/enqueue.cc``, ``topoGetAlgoInfo``) evaluates its cost model (``src/graph/tuning.cc``) for every enabled
algorithm and protocol and keeps the fastest. Our predictor (:func:`predict`) has NCCL's form, latency terms plus
bytes over the channels' bandwidth, with our cluster's numbers; it is analytic, as NCCL's, because simulating every
candidate would cost more than the collective's own simulation (cached per cluster, operation, ranks, size and
candidate). Candidates follow NCCL's rules: tree and NVLS for allreduce only; NVLS only with the Simple protocol
and on one NVSwitch server with NVLink SHARP; LL128 only where GPUs talk over NVLink (NCCL enables it by default
only on NVLink/PXN paths); hierarchical and recursive-doubling are not NCCL's and never picked by ``auto``.
Channels: the fabric's count, reduced for small messages as NCCL does
(:func:`simulator.collectives.protocols.channels_for`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from simulator.cluster.devices import compute_time
from simulator.cluster.memo import cluster_memo
from simulator.cluster.topology import Cluster
from simulator.collectives.caps import fabric_cap
from simulator.collectives.channels import SUPPORTED, Choice, choice_wire, protocol_family
from simulator.collectives.fabric import Fabric
from simulator.collectives.hops import hop_table
from simulator.collectives.nccl_tree import pipeline_time_lists, tree_step
from simulator.collectives.nvls import nvls_slices, nvls_time
from simulator.collectives.protocols import (
    PROTOCOLS,
    base_latency,
    channels_for,
    forward_grain,
    hop_latency,
    step_payload,
)
from simulator.collectives.ring import CHAIN_CHUNKS
from simulator.collectives.steps import grain_steps, step_counts
from simulator.collectives.tree_cost import tree_shape, tree_time

__all__ = ["candidates", "choose", "predict"]

_AUTO = {"allreduce": ("ring", "tree", "nvls")}


def candidates(operation: str, algo: str, protocol: str, ranks: Sequence[int], fabric: Fabric,
               channels: int | None, nbytes: float, *, switch: bool = True) -> list[Choice]:
    """Every (algorithm, protocol, channels) that ``algo`` and ``protocol`` (names or ``auto``) allow.

    ``switch``: the schedule has the NVSwitch as a rank (without it, ``auto`` cannot pick NVLS)."""
    algos = [a for a in _AUTO.get(operation, SUPPORTED[operation])] if algo == "auto" else [algo]
    one_server = len(fabric.groups(ranks)) == 1
    out = []
    for a in algos:
        if a == "nvls" and algo == "auto" and not (fabric.nvls and one_server and switch):
            continue
        protos = PROTOCOLS if protocol == "auto" else (protocol,)
        for p in protos:
            if protocol == "auto" and ((a == "nvls" and p != "Simple") or (p == "LL128" and fabric.intra != "nvlink")):
                continue
            if a == "nvls":
                c = 1
            elif a == "pairwise":
                c = channels or 1
            else:
                c = channels or channels_for(nbytes, fabric.default_channels(ranks), protocol_family(a), p,
                                             len(ranks))
            out.append(Choice(a, p, c))
    return out


def predict(operation: str, ranks: Sequence[int], n: int, choice: Choice, fabric: Fabric, *, elem_bytes: int,
            dtype: str = "fp32", root: int | None = None) -> float:
    """Seconds the collective is predicted to take alone on ``fabric.cluster``: NCCL's form (latency terms plus
    bytes over the channels' bandwidth), with our hops' latencies and the bottleneck bandwidth of every channel's
    routes (a link that k channels cross gives each 1/k of it). Rank r is the cluster's r-th GPU."""
    cluster = fabric.cluster
    if cluster is None:
        raise ValueError("predicting a collective needs the fabric's cluster")
    memo = cluster_memo(cluster, "predict")
    key = (operation, tuple(ranks), n, elem_bytes, dtype, choice, root)
    hit = memo.get(key)
    if hit is not None:
        return hit
    pred = _Predictor(cluster, fabric, choice, list(ranks))
    if choice.algo == "tree":
        pred.set_cap(operation)
        t = pred.launch + pred.tree(n, elem_bytes, dtype)
    else:
        t = pred.time(operation, n * elem_bytes * pred.bytes_per_byte, root)
    if operation in ("allreduce", "reduce-scatter") and choice.algo in ("ring", "hierarchical"):
        # a ring rank reduces (P-1)/P of the buffer (read twice, written once), each channel its share between its
        # own steps: a channel's reductions add to its chain of steps, while the others' transfers go on; all the
        # channels' reductions share the rank's compute stream, which bounds the whole from below
        spec = cluster.specs[cluster.ranks[ranks[0]]]
        elems = (len(ranks) - 1) / len(ranks) * n
        own = elems / choice.channels
        t = max(t + compute_time(spec, own, 3 * own * elem_bytes, dtype, launch=False),
                pred.launch + compute_time(spec, elems, 3 * elems * elem_bytes, dtype, launch=False))
    memo[key] = t
    return t


class _Predictor:
    """The closed forms of :mod:`simulator.collectives.channels`' algorithms on one cluster."""

    def __init__(self, cluster: Cluster, fabric: Fabric, choice: Choice, ranks: list[int]) -> None:
        self.cluster, self.fabric, self.choice, self.ranks = cluster, fabric, choice, ranks
        self.family = protocol_family(choice.algo)
        self.launch = max(cluster.collective_start_s,
                          base_latency(self.family, choice.protocol, cluster.nccl_latency))
        self.wires = cluster_memo(cluster, "wires")  # (rank, rank) -> message overhead + route latency
        self.cap = math.inf  # a channel's bytes/s on the wire at most (NCCL's per-channel caps), set by time()
        self.bytes_per_byte = choice_wire(choice, fabric, ranks)  # bytes on the wire per payload byte

    def wire(self, a: int, b: int) -> float:
        """A message's fixed seconds from rank a to rank b: the message overhead and its route's latency."""
        wire = self.wires.get((a, b))
        if wire is None:
            route = self.cluster.route(self.cluster.ranks[a], self.cluster.ranks[b])
            wire = self.wires[(a, b)] = self.cluster.message_overhead_s + self.cluster.route_latency(route)
        return wire


    def hop(self, a: int, b: int) -> float:
        return max(self.wire(a, b), hop_latency(self.family, self.choice.protocol, self.fabric.hw(a, b),
                                                self.cluster.nccl_latency))

    def shared_bw(self, paths: Sequence[Sequence[tuple[int, int]]]) -> float:
        """Bottleneck bandwidth one path (a list of rank hops) gets when all ``paths`` run at once."""
        table = hop_table(self.cluster)
        table.rows_of([hop for path in paths for hop in path])  # routed at once: a batch shares searches
        return table.shared([table.rows_of(path) for path in paths])

    def tree(self, n: int, elem_bytes: int, dtype: str) -> float:
        """NCCL's tree (:mod:`.nccl_tree`) on every channel: the slowest of two forms per tree pipeline.

        * alone: :func:`.nccl_tree.pipeline_time_lists` with every connection at its own route's narrowest link (or
          its cap) and a rank's reductions of a step a stage of their own: the schedule's time exactly where no
          two connections share a link (and no rank reduces two children's steps);
        * shared: the busiest resource's bytes (a link: every connection of every channel crossing it; a
          connection's cap; a rank's compute stream: its reductions of all channels) at its capacity, plus the
          pipeline's fill and drain (the alone time less its steps at its slowest stage).

        Where links are shared the second dominates: the pipeline keeps its busiest link busy (the engine's
        max-min sharing is work-conserving), its first and last steps still cross the tree one stage at a time.
        Priced over arrays (:mod:`.tree_cost`), the trees' structure kept per cluster, ranks and channel count.
        """
        cl = self.cluster
        shape = tree_shape(cl, self.fabric, self.ranks, self.choice.channels)
        spec = cl.specs[cl.ranks[self.ranks[0]]]
        hop = tuple(hop_latency(self.family, self.choice.protocol, hw, cl.nccl_latency)
                    for hw in (self.fabric.intra, "net"))
        step = tree_step(n * elem_bytes, self.choice.channels, self.choice.protocol,
                         len({self.fabric.hosts[r] for r in self.ranks}), len(self.ranks))
        return tree_time(shape, n, elem_bytes, self.bytes_per_byte, self.cap, (hop[0], hop[1]),
                         lambda elems: compute_time(spec, elems, 3 * elems * elem_bytes, dtype, launch=False,
                                                    fn="reduce-sum"), step, forward_grain(self.choice.protocol))

    def set_cap(self, operation: str) -> None:
        """A channel's bytes/s on the wire at most, as :func:`.channels.build` caps ring and tree (NCCL's own)."""
        if self.choice.algo in ("ring", "tree"):
            self.cap = fabric_cap(self.fabric, operation, self.family, self.choice.protocol, self.ranks,
                                  self.choice.channels) * self.bytes_per_byte

    def _pairs(self) -> tuple[float, list[str]]:
        """Over every ordered pair of the ranks (an all-to-all's connections): the slowest wire (:meth:`wire`, off
        the cluster's :class:`~.hops.HopTable` in one batch) and the hop classes they cross (kept per cluster and
        ranks: no protocol in them; the max of :meth:`hop` over the pairs, pair by pair, is the max of these)."""
        memo = cluster_memo(self.cluster, "pairs")
        key = tuple(self.ranks)
        hit = memo.get(key)
        if hit is None:
            ranks = np.asarray(self.ranks, dtype=np.int64)
            a, b = np.repeat(ranks, len(ranks)), np.tile(ranks, len(ranks))
            a, b = a[a != b], b[a != b]
            table = hop_table(self.cluster)
            rows = table.rows(a, b)  # may add rows: the wires are read after
            hit = memo[key] = (float(table.wire[rows].max()), self._classes(a, b))
        return hit

    def _classes(self, a: np.ndarray, b: np.ndarray) -> list[str]:
        """The hop classes the (a[k], b[k]) hops cross: ``net`` between servers, the fabric's own inside one."""
        hosts = np.asarray(self.fabric.hosts, dtype=np.int64)
        net = hosts[a] != hosts[b]
        return sorted({*(("net",) if net.any() else ()), *((self.fabric.intra,) if not net.all() else ())})

    def _slowest_hop(self, wire: float, classes: list[str]) -> float:
        """A hop's max(wire, protocol latency) at its slowest: the slowest wire or the slowest class's latency."""
        return max(wire, *(hop_latency(self.family, self.choice.protocol, hw, self.cluster.nccl_latency)
                           for hw in classes))

    def _rings(self, c: int) -> tuple[float, float, list[str]]:
        """The rings of ``c`` channels: the bandwidth each gets (:meth:`shared_bw`), the slowest wire of their hops,
        the hop classes they cross (kept per cluster, ranks and channel count: no protocol in them)."""
        memo = cluster_memo(self.cluster, "rings")
        key = (tuple(self.ranks), c)
        hit = memo.get(key)
        if hit is None:
            table = hop_table(self.cluster)
            rings = [np.array(ring, dtype=np.int64) for ring in self.fabric.rings(self.ranks, c)]
            table.rows(np.concatenate(rings), np.concatenate([np.roll(ring, -1) for ring in rings]))  # at once
            hops = [table.rows(ring, np.roll(ring, -1)) for ring in rings]
            shared = table.shared(hops)
            wire = float(table.wire[np.concatenate(hops)].max())
            classes = self._classes(np.concatenate(rings), np.concatenate([np.roll(ring, -1) for ring in rings]))
            hit = memo[key] = (shared, wire, classes)
        return hit

    def _chains(self, operation: str, nbytes: float, root: int | None) -> float:
        """Seconds of a ring broadcast's or reduce's pipelines (:func:`.ring.ring_broadcast`): each channel's share
        down its chain from (or to) the root in the pipeline's steps (NCCL's; with LL and LL128 the grains a rank
        passes on, :func:`.steps.grain_steps`). Step 0 pays every hop's latency (its own class's) and its bytes at
        the hop's rate; the later steps stream behind it, so the last leaves at the longest path: up to some hop i
        with step 0, there every later step, on with the last (max over i of the latencies up to i, every hop's step
        time once and i's S - 1 times more). Where a hop between servers holds back a whole NCCL step (LL, LL128),
        the chain is priced as its chunks' ops run, one chunk at a time (:func:`.nccl_tree.pipeline_time_lists`). A
        hop's rate: the channel's cap, or its route's narrowest link shared by every channel's hops that cross it
        (the same at every step: channels lockstep)."""
        c = self.choice.channels
        count, chunks, head = grain_steps(nbytes / self.bytes_per_byte / c, step_payload(self.choice.protocol),
                                     forward_grain(self.choice.protocol), CHAIN_CHUNKS)
        size = nbytes / c / count  # a step's bytes on the wire
        start = self.ranks[0] if root is None else root
        chains = []
        for ring in self.fabric.rings(self.ranks, c):
            i = ring.index(start)
            chain = [*ring[i:], *ring[:i]]
            chains.append(list(itertools.pairwise(chain[::-1] if operation == "reduce" else chain)))
        cl = self.cluster
        cl.prepare_routes((cl.ranks[a], cl.ranks[b]) for hops in chains for a, b in hops)
        routes = {hop: cl.route(cl.ranks[hop[0]], cl.ranks[hop[1]]) for hops in chains for hop in hops}
        uses: dict[tuple[str, str], int] = {}
        for hops in chains:
            for hop in hops:
                for edge in routes[hop]:
                    uses[edge] = uses.get(edge, 0) + 1
        worst = 0.0
        for hops in chains:
            times = [size / min(self.cap, min((cl.graph.edges[e]["bandwidth"] / uses[e] for e in routes[hop]),
                                              default=math.inf)) for hop in hops]
            held = [head if head > 1 and self.fabric.hw(*hop) == "net" else 1 for hop in hops]
            if max(held) > 1:  # a network hop holds back a step of every chunk: its chunks' ops, one at a time
                n, zero = len(hops) + 1, (0.0, 0.0)
                down = [zero] + [(self.hop(*hop), t) for hop, t in zip(hops, times, strict=True)]
                best = pipeline_time_lists([-1, *range(n - 1)], step_counts(count, chunks), [zero] * n, down,
                                           [0.0] * n, [False] * n, [1, *held])
            else:
                total, latency, best = sum(times), 0.0, 0.0
                for hop, t in zip(hops, times, strict=True):
                    latency += self.hop(*hop)
                    best = max(best, latency + total + (count - 1) * t)
            worst = max(worst, best)
        return worst

    def _nvls(self, payload: float) -> float:
        """:func:`.nvls.nvls_time` on the first GPU's links to its server's switch: NCCL's NVLS latency (at least
        the route's) up, the route's latency down, the narrower link's rate."""
        cl, fabric = self.cluster, self.fabric
        gpu, switch = cl.ranks[self.ranks[0]], fabric.switch[fabric.hosts[self.ranks[0]]]
        up, down = cl.route(gpu, switch), cl.route(switch, gpu)
        bw = min(cl.graph.edges[e]["bandwidth"] for e in (*up, *down))
        latency = hop_latency(self.family, self.choice.protocol, self.fabric.intra, cl.nccl_latency)
        return nvls_time(payload, self.bytes_per_byte, nvls_slices(payload),
                         bw, max(cl.message_overhead_s + cl.route_latency(up), latency),
                         cl.message_overhead_s + cl.route_latency(down))

    def time(self, operation: str, nbytes: float, root: int | None = None) -> float:
        p, c = len(self.ranks), self.choice.channels
        algo = self.choice.algo
        if algo == "pairwise":  # the slowest hop of any pair: the slowest wire or the slowest class's latency
            hop = self._slowest_hop(*self._pairs())
            ring = [[(self.ranks[i], self.ranks[(i + 1) % p])] for i in range(p)]
            return self.launch + (p - 1) * (hop + nbytes / p / self.shared_bw(ring))
        if algo == "nvls":  # NCCL's NVLS loops, each up to the switch and down again (.nvls)
            return self.launch + self._nvls(nbytes / self.bytes_per_byte)
        self.set_cap(operation)
        if operation in ("broadcast", "reduce") and algo == "ring":
            return self.launch + self._chains(operation, nbytes, root)
        shared, wire, classes = self._rings(c)
        bw = min(shared, self.cap) * c
        step = self._slowest_hop(wire, classes)
        if algo == "hierarchical" or algo == "recursive-doubling":
            return self.launch + 2 * (p - 1) * step + 2 * (p - 1) / p * nbytes / bw
        steps = {"allreduce": 2 * (p - 1), "reduce-scatter": p - 1, "allgather": p - 1}.get(operation, p - 1)
        factor = {"allreduce": 2 * (p - 1) / p, "reduce-scatter": (p - 1) / p, "allgather": (p - 1) / p}
        return self.launch + steps * step + factor.get(operation, 1.0) * nbytes / bw


def choose(operation: str, ranks: Sequence[int], n: int, fabric: Fabric, *, algo: str = "auto",
           protocol: str = "auto", channels: int | None = None, elem_bytes: int = 1, dtype: str = "fp32",
           root: int | None = None, switch: bool = True) -> Choice:
    """The fastest candidate (the first in NCCL's order on ties); a single candidate is not simulated. Kept per
    fabric and question (a whole model's step asks the same one for every layer's allreduce)."""
    if len(ranks) < 2:  # nothing moves: no prediction needed
        return Choice(SUPPORTED[operation][0] if algo == "auto" else algo, "Simple" if protocol == "auto" else protocol,
                      channels or 1)
    key = ("tuner.choose", operation, tuple(ranks), n, algo, protocol, channels, elem_bytes, dtype, root, switch)
    hit: Choice | None = fabric.memo.get(key)
    if hit is not None:
        return hit
    options = candidates(operation, algo, protocol, ranks, fabric, channels, n * elem_bytes, switch=switch)
    if not options:
        raise ValueError(f"no algorithm for {operation} with algo={algo!r}, protocol={protocol!r}")
    best = options[0] if len(options) == 1 else min(
        options, key=lambda c: predict(operation, ranks, n, c, fabric, elem_bytes=elem_bytes, dtype=dtype, root=root))
    fabric.memo[key] = best
    return best
