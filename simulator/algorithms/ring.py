"""Ring Attention decode (Liu, Zaharia & Abbeel, arXiv:2310.01889, Alg. 1) and the ``ring-q`` variant.

``ring``: every rank holds the query and its KV shard. In P steps each rank attends to the shard it holds and
passes it on to the next rank (P - 1 shard transfers); every rank ends with the output.

* ``overlap: true`` double-buffers: while attending to the shard in one buffer, the rank receives the next shard
  into the other (a receive buffer the size of the largest shard). A receive waits until its buffer's previous
  shard has been consumed.
* ``overlap: false`` alternates: attend, then exchange in place (send the shard, receive the next through the
  transport's staging and copy it over, as MPI_Sendrecv_replace does); no receive buffer.

``ring-q``: the KV stays put; rank 0 attends with the query, then the query and the running state (o, l, m) hop
rank to rank, each merging its own shard: P - 1 sequential small transfers; the last rank has the output.
"""

from __future__ import annotations

from simulator.algorithms.base import (
    Layout,
    add_attend,
    add_finalize,
    attend_kernel,
    kernel_cost_of,
    new_decode_schedule,
)
from simulator.schedule import Schedule
from simulator.workloads.shape import DecodeShape

__all__ = ["build_ring", "build_ring_q"]


def _ids(a: int | None, b: int | None = None) -> tuple[int, ...]:
    """The ops given (at most two), without the Nones (called for every op of a large ring: no generator)."""
    if a is None:
        return () if b is None else (b,)
    return (a,) if b is None else (a, b)


def build_ring(shape: DecodeShape, layout: Layout, overlap: bool = True) -> Schedule:
    """Ring Attention decode: the KV shards rotate around the ring (``layout.ring_order()``); in each of P steps
    every rank attends the query to the shard it holds and merges it into its running state, then passes the
    shard on. ``overlap`` double-buffers (the next shard's transfer runs during this step's attention); without
    it, each step attends, then exchanges in place through a staging buffer. Every rank ends with the output."""
    p = layout.ranks
    sched = new_decode_schedule("ring", shape, p)
    bounds = sched.meta["shards"]
    order = layout.ring_order()  # ring position -> rank; each rank passes shards to the next position
    nxt_of, pos = [0] * p, [0] * p
    for i, r in enumerate(order):
        nxt_of[r], pos[r] = order[(i + 1) % p], i
    # per shard, computed once (a step repeats them for every rank): its bytes, names and attention kernel
    kv_size = [shape.kv_bytes(hi - lo) for lo, hi in bounds]
    kv_name = [f"kv[{shard}]" for shard in range(p)]
    attends = [attend_kernel(sched, shape, shard) for shard in range(p)]
    copies = [kernel_cost_of(shape, "copy", hi - lo) for lo, hi in bounds]
    max_kv = max(kv_size)
    dtype = shape.dtype
    first_alloc = (("acc", shape.state_bytes),)
    have: list[int | None] = [None] * p  # op after which rank r's current buffer holds its step's shard
    sent: list[int | None] = [None] * p  # rank r's send of the previous step (its buffer is in use until done)
    attend: list[int | None] = [None] * p  # rank r's latest attention
    ranks = range(p)

    for step in range(p):
        held = [order[(pos[r] - step) % p] for r in range(p)]  # the shard each rank holds at this step
        new_have: list[int | None] = [None] * p
        new_sent: list[int | None] = [None] * p
        if overlap and step < p - 1:
            # posted before this step's attention (in program order too), so that the shard travels while the
            # rank computes: a host thread that issues ops in order (as a CPU rank does) overlaps them as well
            cur, nxt = (f"kv{step % 2}",), (f"kv{(step + 1) % 2}",)
            # one transfer per rank, all at once: rank r sends the shard it holds to nxt_of[r]; the receive
            # buffer's previous shard (step - 1) has been attended to and sent on
            first = sched.add_transfers(ranks, nxt_of, [kv_size[h] for h in held], [kv_name[h] for h in held],
                                        [_ids(h) for h in have], [_ids(attend[d], sent[d]) for d in nxt_of],
                                        args=cur, dst_args=nxt, alloc=((nxt[0], max_kv),) if step == 0 else ())
            for r in ranks:
                new_have[nxt_of[r]], new_sent[r] = first + 2 * r + 1, first + 2 * r
        costs = [attends[h] for h in held]
        first = sched.add_computes(ranks, [c[0] for c in costs], [c[1] for c in costs], [c[2] for c in costs],
                                   [c[3] for c in costs], [_ids(have[r], attend[r]) for r in ranks], dtype=dtype,
                                   fn="attend", out="acc", args=("q", f"kv{step % 2}" if overlap else "kv0"),
                                   alloc=first_alloc if step == 0 else ())
        attend = list(range(first, first + p))
        if step == p - 1:
            break
        if not overlap:  # attend, then exchange in place
            for r in range(p):
                dst, shard = nxt_of[r], held[r]
                snd, recv = sched.add_transfer(r, dst, kv_size[shard], kv_name[shard], send_deps=_ids(attend[r]),
                                               recv_deps=_ids(attend[dst]), args=("kv0",), dst_args=("kvin",))
                new_have[dst], new_sent[r] = recv, snd
            for r in range(p):  # copy the staged shard over kv0 once this rank's own send has left
                flops, nbytes, dims = copies[order[(pos[r] - step - 1) % p]]
                new_have[r] = sched.add_compute(r, "kv-copy", flops=flops, nbytes=nbytes, dtype=dtype, fn="copy",
                                                dims=dims, deps=_ids(new_have[r], new_sent[r]), out="kv0",
                                                args=("kvin",))
        have, sent = new_have, new_sent
    sched.meta["outputs"] = [(r, "out") for r in range(p)]
    for r in range(p):
        add_finalize(sched, shape, r, _ids(attend[r]))
    return sched


def build_ring_q(shape: DecodeShape, layout: Layout) -> Schedule:
    """Ring with the query moving instead of the KV cache: the query and running state hop rank to rank (P - 1
    sequential small hops), each rank merging its own shard's partial; the last rank holds the output."""
    p = layout.ranks
    sched = new_decode_schedule("ring-q", shape, p, q_on=[0])
    prev = add_attend(sched, shape, 0, 0, "kv0", [], first=True)
    for r in range(1, p):
        _, recv = sched.add_transfer(r - 1, r, shape.q_bytes + shape.state_bytes, "q+state", send_deps=[prev],
                                     args=("q", "acc"), alloc=[("q", shape.q_bytes), ("acc", shape.state_bytes)],
                                     free_src=("q", "acc"))
        prev = add_attend(sched, shape, r, r, "kv0", [recv], first=False)
    add_finalize(sched, shape, p - 1, [prev])
    sched.meta["outputs"] = [(p - 1, "out")]
    return sched
