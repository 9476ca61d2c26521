"""Engine time against the tuner's prediction for NCCL's ring and tree allreduce (issue 12's tree defect).

For every topology, size and (algorithm, protocol): the simulated makespan of the schedule the builders emit, the
``auto`` tuner's prediction for the same choice, their ratio, the busbw each implies, and NCCL's own cost model
(``src/graph/tuning.cc``, ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``: latencies, busBw per channel with its
refinements and ``treeCorrectionFactor``) evaluated on the same cluster: NCCL's channels as its search would size
them on the channel's narrowest link (:func:`simulator.collectives.caps.nccl_width`), Intel hosts, no NVLS. NCCL's
model is empty (``-``) for GPUs it does not cover (MI300X). ``ops`` and ``sim_s``: the schedule's ops and the
seconds its simulation took on this machine (the issue asks well under a second up to 16 GiB).

    PYTHONPATH=. python benchmarks/nccl_tree.py [--sizes 1MiB,16MiB,...] [--protocols Simple,LL128,LL]
                                                [--topologies dgx-h100:2,...] [--tree-chunks N] [--max-slices N]

``--tree-chunks``: what if the tree's pipelines were cut in more (or fewer) chunks than ``nccl_tree.TREE_CHUNKS``
(16 a channel): each chunk's steps are three ops whatever its size, so the times barely move while the ops do.
``--max-slices``: the bound on NVLS's slices (64; the ring's broadcast and reduce cut their steps like the tree).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence

from simulator.cluster.topology import Cluster, load_topology
from simulator.collectives import Choice, Fabric, fabric_of
from simulator.collectives import caps as _caps
from simulator.collectives import nccl_tree as _nccl_tree
from simulator.collectives import ring as _ring
from simulator.collectives import tuner as _tuner
from simulator.collectives.protocols import PROTOCOLS, base_latency, hop_latency
from simulator.collectives.standalone import collective_schedule
from simulator.collectives.tuner import predict
from simulator.engine.core import simulate
from simulator.units import parse_bytes

TOPOLOGIES = (("dgx-a100", 1), ("dgx-h100", 1), ("dgx-h100", 2), ("dgx-h100", 4), ("mi300x", 1))
# src/graph/tuning.cc: treeCorrectionFactor[protocol][log2(bytes / 64)], 64 B to 256 MiB
_TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9))


def nccl_model(cluster: Cluster, fabric: Fabric, ranks: Sequence[int], nbytes: int, choice: Choice) -> float:
    """Seconds NCCL's own cost model predicts for an allreduce of ``nbytes`` (module docstring); nan where it has
    no constants."""
    arch = _caps.arch_of(cluster.specs[cluster.ranks[ranks[0]]].name)
    if arch not in _caps.ARCHS or choice.algo not in ("ring", "tree"):
        return math.nan
    p, nodes = len(ranks), fabric.nodes
    ring = fabric.rings(ranks, 1)[0]
    link = min(cluster.graph.edges[e]["bandwidth"] for a, b in zip(ring, [*ring[1:], ring[0]], strict=True)
               for e in cluster.route(cluster.ranks[a], cluster.ranks[b]))
    speeds = _caps._SPEEDS.get(arch, _caps._SPEEDS["old"])[0 if nodes <= 1 else 1]
    speed = next((s for s in speeds if s <= link / 1e9), speeds[-1])
    width = _caps.nccl_width(arch, link, nodes)
    n_ch = choice.channels * width
    bw = speed * math.floor(link / 1e9 / speed + 1e-9) / width  # GB/s per NCCL channel (duplicates halve it)
    i, proto = min(nodes - 1, 2), choice.protocol
    ll_max = (_caps._LL_MAX[arch] if nodes == 1 else _caps._LL_MAX_HOST["intel"])[i]
    bus = n_ch * bw
    if choice.algo == "ring":
        if proto == "LL":
            bus = min(ll_max, bus * .5)
        if proto == "LL128":
            bus = min(bus * .92, n_ch * _caps._RING_LL128[arch][i])
        alg = bus * p / (2 * (p - 1))
    else:
        bus = min(bus * .92, n_ch * _caps._TREE[arch][i])
        if proto == "LL":
            bus = min(bus / 3.8, ll_max)
        if proto == "LL128":
            bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128), n_ch * _caps._TREE_LL128[arch][i])
        alg = bus * .5
    family, intra = choice.algo, fabric.intra
    lat = base_latency(family, proto) * 1e6
    intra_lat = hop_latency(family, proto, intra) * 1e6
    inter_lat = hop_latency("tree" if p == nodes else family, proto, "net") * 1e6
    if family == "ring":
        if nodes > 1:
            intra_lat = max(intra_lat, 3.0 if proto == "Simple" else 1.0)  # getNetOverhead: 1 us on Intel hosts
        inter = 2 * (nodes - 1)
        lat += (2 * (p - 1) - inter) * intra_lat + inter * inter_lat
        if proto == "Simple" and nodes > 1 and nbytes / (n_ch * p) >= 64:
            lat *= 1.4  # NCCL's "plateau effect of ring" (compute capability >= 80)
    else:
        lat += 2 * ((p // nodes - 1) * intra_lat + int(math.log2(nodes)) * inter_lat)
        log_size = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
        if 0 <= log_size < 23:
            alg *= _TREE_CORRECTION[PROTOCOLS.index(proto)][log_size]
    return (lat + nbytes / (1000 * alg)) * 1e-6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1MiB,16MiB,256MiB,1GiB")
    ap.add_argument("--protocols", default="Simple,LL128,LL")
    ap.add_argument("--algos", default="ring,tree")
    ap.add_argument("--topologies", default=",".join(f"{n}:{k}" for n, k in TOPOLOGIES),
                    help="preset:nodes,... (default: all five)")
    ap.add_argument("--max-slices", type=int, default=None,
                    help="what if NVLS held more slices than ring.MAX_SLICES (64)")
    ap.add_argument("--tree-chunks", type=int, default=None,
                    help="what if the tree cut a channel's pipeline in more chunks than nccl_tree.TREE_CHUNKS (16)")
    args = ap.parse_args()
    if args.max_slices is not None:  # a what-if on the module constant the builders and the tuner read
        for module in (_ring, _tuner):
            module.MAX_SLICES = args.max_slices
    if args.tree_chunks is not None:
        _nccl_tree.TREE_CHUNKS = args.tree_chunks
    topologies = [(name, int(nodes)) for name, nodes in (t.split(":") for t in args.topologies.split(","))]
    sizes = [int(parse_bytes(s)) for s in args.sizes.split(",")]
    print(f"{'topology':12} {'bytes':>11} {'choice':14} {'ch':>3} {'engine_ms':>10} {'tuner_ms':>10} "
          f"{'eng/tun':>8} {'busbw_eng':>9} {'busbw_tun':>9} {'nccl_ms':>9} {'eng/nccl':>8} {'ops':>7} {'sim_s':>6}")
    for name, nodes in topologies:
        cluster = load_topology(name, {"nodes": nodes})
        fabric = fabric_of(cluster)
        p = len(cluster.ranks)
        for nbytes in sizes:
            n = nbytes // 2
            for algo in args.algos.split(","):
                for proto in args.protocols.split(","):
                    sched, choice = collective_schedule(cluster, fabric, "allreduce", n, 2, "bf16", algo, proto)
                    t0 = time.perf_counter()
                    t = simulate(sched, cluster).makespan
                    wall = time.perf_counter() - t0
                    pred = predict("allreduce", list(range(p)), n, choice, fabric, elem_bytes=2, dtype="bf16")
                    bus = 2 * (p - 1) / p * nbytes / 1e9
                    nccl = nccl_model(cluster, fabric, list(range(p)), nbytes, choice)
                    print(f"{name + ' x' + str(nodes):12} {nbytes:>11} {choice.algo + '/' + proto:14} "
                          f"{choice.channels:>3} {t * 1e3:>10.4f} {pred * 1e3:>10.4f} {t / pred:>8.3f} "
                          f"{bus / t:>9.1f} {bus / pred:>9.1f} {nccl * 1e3:>9.4f} {t / nccl:>8.3f} {len(sched.ops):>7} "
                          f"{wall:>6.2f}")


if __name__ == "__main__":
    main()
