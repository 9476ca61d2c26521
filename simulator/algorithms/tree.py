"""Tree Attention decode (Shyam et al., arXiv:2408.04093, Alg. 3) and an explicit k-ary reduction, ``tree-p2p``.

``tree``: every rank attends to its own shard (local partial state (o, l, m)); ``allreduce(max)`` of m gives the
global max M; every rank rescales o and l to M; ``allreduce(sum)`` of (o, l); out = o / l on every rank. All in
place: m and (o, l) are views of the running state, so the only memory is KV, q, o, l, m:
2btd + 2bd + 2bn_h elements (Eq. 9). ``allreduce`` picks the collective (default ``auto``).

``tree-p2p``: k-ary reduction (``arity``, default 2) of whole (o, l, m) states to rank 0 by point-to-point sends and
merges, then a broadcast of the output down the same tree. ``topology_aware: true`` reduces inside each node to
its first rank, then across those node leaders, and broadcasts back the other way.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.algorithms.base import (
    Layout,
    add_attend,
    add_finalize,
    add_kernel,
    add_kernels,
    attend_kernel,
    new_decode_schedule,
)
from simulator.collectives import allreduce, check_algorithm, collective
from simulator.collectives.tuner import choose
from simulator.schedule.core import Schedule
from simulator.workloads.shape import DecodeShape

__all__ = ["build_tree", "build_tree_p2p"]


def build_tree(shape: DecodeShape, layout: Layout, allreduce_algo: str = "auto") -> Schedule:
    """Tree Attention decode (the paper's reference code): every rank computes its local partial state, then an
    allreduce(max) of m, a local rescale, and an allreduce(sum) of (o, l) over ``allreduce_algo``; every rank
    ends with the output.

    On one NVSwitch server with NVLink SHARP (``layout.fabric.nvls``), where ``auto`` picks NVLS for the (o, l)
    allreduce as NCCL would, the server's switch joins as one more rank (``sched.meta["compute_ranks"]`` stays the
    GPU count; it holds no memory and no output) and the allreduces may run in the switch.
    ``sched.meta["allreduce"]`` says what each allreduce ran with (``max: ring/LL, sum: nvls/Simple``)."""
    p = layout.ranks
    sched = new_decode_schedule("tree", shape, p)
    sched.meta["compute_ranks"] = p
    ranks = layout.ring_order()  # the order ring collectives pass data in
    n_ol = shape.batch * shape.model_dim + shape.ml_elems
    switch = _nvls_switch(sched, layout, ranks, allreduce_algo, n_ol, shape)
    # every rank's ops of one kind appended at once (the same ops as add_attend / add_kernel per rank, in order)
    costs = [attend_kernel(sched, shape, r) for r in ranks]
    first = sched.add_computes(ranks, [c[0] for c in costs], [c[1] for c in costs], [c[2] for c in costs],
                               [c[3] for c in costs], [()] * p, dtype=shape.dtype, fn="attend", out="acc",
                               args=("q", "kv0"), alloc=(("acc", shape.state_bytes),))
    local = [(first + k,) for k in range(p)]
    packed = dict(zip(ranks, ((i,) for i in add_kernels(sched, shape, ranks, "pack-m", 0, local, out="m",
                                                        args=("acc",), fused=True)), strict=True))  # a view of acc.m
    common = {"algo": allreduce_algo, "elem_bytes": shape.elem_bytes, "dtype": shape.dtype, "fabric": layout.fabric}
    chosen = []
    if layout.fabric is not None:
        check_algorithm(allreduce_algo)
        front, c_max = collective(sched, "allreduce", ranks, "m", shape.ml_elems, layout.fabric, algo=allreduce_algo,
                                  op="max", elem_bytes=shape.elem_bytes, dtype=shape.dtype, tag="allreduce-max",
                                  deps=packed, switch_rank=switch)
        chosen.append(f"max: {c_max.algo}/{c_max.protocol}")
    else:
        front = allreduce(sched, ranks, layout.hosts, "m", shape.ml_elems, op="max", tag="allreduce-max",
                          deps=packed, **common)  # type: ignore[arg-type]
    scaled = dict(zip(ranks, ((i,) for i in add_kernels(sched, shape, ranks, "rescale", n_ol,
                                                        [tuple(front[r]) for r in ranks], out="ol",
                                                        args=("acc", "m"))), strict=True))
    if layout.fabric is not None:
        front, c_sum = collective(sched, "allreduce", ranks, "ol", n_ol, layout.fabric, algo=allreduce_algo,
                                  op="sum", elem_bytes=shape.elem_bytes, dtype=shape.dtype, tag="allreduce-sum",
                                  deps=scaled, switch_rank=switch)
        chosen.append(f"sum: {c_sum.algo}/{c_sum.protocol}")
        sched.meta["allreduce"] = ", ".join(chosen)
    else:
        front = allreduce(sched, ranks, layout.hosts, "ol", n_ol, op="sum", tag="allreduce-sum", deps=scaled,
                          **common)  # type: ignore[arg-type]
    add_kernels(sched, shape, ranks, "finalize-flat", shape.batch * shape.model_dim, [tuple(front[r]) for r in ranks],
                name="finalize", out="out", args=("ol", "m"))
    sched.meta["outputs"] = [(r, "out") for r in ranks]
    return sched


def _nvls_switch(sched: Schedule, layout: Layout, ranks: list[int], algo: str, n_ol: int,
                 shape: DecodeShape) -> int | None:
    """Add the server's NVSwitch as rank ``layout.ranks`` where ``algo`` may be NVLS and NCCL's rule picks it for
    the (o, l) allreduce (the larger one); the schedule is then placed explicitly (GPUs, then the switch)."""
    fabric = layout.fabric
    if (fabric is None or fabric.cluster is None or not fabric.nvls or algo != "auto" or len(ranks) < 2
            or len(fabric.groups(ranks)) != 1):
        return None
    if choose("allreduce", ranks, n_ol, fabric, elem_bytes=shape.elem_bytes, dtype=shape.dtype).algo != "nvls":
        return None
    server = fabric.hosts[ranks[0]]
    switch = sched.ranks
    sched.ranks += 1
    sched.placement = (*fabric.cluster.ranks[:switch], fabric.switch[server])
    return switch


def _kary_rounds(members: Sequence[int], arity: int) -> list[list[tuple[int, int]]]:
    """Rounds of (child, parent) edges of a k-ary reduction of ``members`` to ``members[0]``."""
    rounds, stride, n = [], 1, len(members)
    while stride < n:
        rounds.append([(members[v + i * stride], members[v]) for v in range(0, n, stride * arity)
                       for i in range(1, arity) if v + i * stride < n])
        stride *= arity
    return rounds


def build_tree_p2p(shape: DecodeShape, layout: Layout, arity: int = 2, topology_aware: bool = False) -> Schedule:
    """Explicit k-ary reduction of the partial states (o, l, m) to rank 0 by point-to-point transfers, merged at each
    parent, then the output broadcast back down the same edges. ``topology_aware`` reduces inside each server
    first, then across servers' leaders."""
    p = layout.ranks
    sched = new_decode_schedule("tree-p2p", shape, p)
    last = {r: add_attend(sched, shape, r, r, "kv0", [], first=True) for r in range(p)}
    if topology_aware:
        groups = layout.groups()
        per_group = _zip_rounds([_kary_rounds(g, arity) for g in groups])
        phases = [[edge for edges in rnd for edge in edges] for rnd in per_group]
        phases += _kary_rounds([g[0] for g in groups], arity)
    else:
        phases = _kary_rounds(list(range(p)), arity)
    for k, edges in enumerate(phases):
        before = dict(last)
        for i, (child, parent) in enumerate(edges):
            name = f"in{k}.{i}"
            _, recv = sched.add_transfer(child, parent, shape.state_bytes, "state", send_deps=[before[child]],
                                         recv_deps=[before[parent]], args=("acc",), dst_args=(name,),
                                         alloc=[(name, shape.state_bytes)])
            last[parent] = add_kernel(sched, shape, parent, "merge", 0, kind="merge", deps=[recv, last[parent]],
                                      out="acc", args=(name,), free=(name,))
    last[0] = add_finalize(sched, shape, 0, [last[0]])
    for edges in reversed(phases):  # broadcast the output back down the same edges
        before = dict(last)
        for child, parent in edges:
            _, last[child] = sched.add_transfer(parent, child, shape.q_bytes, "out", send_deps=[before[parent]],
                                                recv_deps=[before[child]], args=("out",),
                                                alloc=[("out", shape.q_bytes)])
    sched.meta["outputs"] = [(r, "out") for r in range(p)]
    return sched


def _zip_rounds(per_group: list[list[list[tuple[int, int]]]]) -> list[list[list[tuple[int, int]]]]:
    """Round k of every group together (the groups reduce concurrently)."""
    depth = max((len(r) for r in per_group), default=0)
    return [[g[k] for g in per_group if k < len(g)] for k in range(depth)]
