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

import numpy as np

from simulator.algorithms.base import (
    Layout,
    add_attend,
    add_finalize,
    attend_kernel,
    kernel_cost_of,
    new_decode_schedule,
)
from simulator.schedule.core import Schedule
from simulator.schedule.op import recv_of, transfer_send
from simulator.schedule.oplist import Indexed
from simulator.workloads.shape import DecodeShape

__all__ = ["build_ring", "build_ring_q"]


def build_ring(shape: DecodeShape, layout: Layout, overlap: bool = True) -> Schedule:
    """Ring Attention decode: the KV shards rotate around the ring (``layout.ring_order()``); in each of P steps
    every rank attends the query to the shard it holds and merges it into its running state, then passes the
    shard on. ``overlap`` double-buffers (the next shard's transfer runs during this step's attention); without
    it, each step attends, then exchanges in place through a staging buffer. Every rank ends with the output.

    Each step's ops of one kind are appended at once, as arrays over the ranks (one block of the schedule): a
    rank's ids are those of one op-at-a-time build in rank order."""
    p = layout.ranks
    sched = new_decode_schedule("ring", shape, p)
    bounds = sched.meta["shards"]
    order = np.array(layout.ring_order(), dtype=np.int64)  # ring position -> rank; each passes to the next position
    pos = np.empty(p, dtype=np.int64)
    pos[order] = np.arange(p)
    nxt_of = order[(pos + 1) % p]  # rank -> the rank it passes shards to
    # per shard, computed once (a step repeats them for every rank): its bytes, names and kernels
    sizes = [shape.kv_bytes(hi - lo) for lo, hi in bounds]
    kv_size = np.array(sizes, dtype=float)
    kv_name = [f"kv[{shard}]" for shard in range(p)]
    attends = [attend_kernel(sched, shape, shard) for shard in range(p)]
    copies = [("kv-copy", *kernel_cost_of(shape, "copy", hi - lo)) for lo, hi in bounds]
    max_kv = max(sizes)
    dtype = shape.dtype
    first_alloc = (("acc", shape.state_bytes),)
    ranks = np.arange(p, dtype=np.int64)
    none = np.full(p, -1, dtype=np.int64)
    have = none  # op after which rank r's current buffer holds its step's shard (-1: none)
    sent = none  # rank r's send of the previous step (its buffer is in use until done)
    attend = none  # rank r's latest attention

    for step in range(p):
        held = order[(pos - step) % p]  # the shard each rank holds at this step
        new_have, new_sent = none.copy(), none.copy()
        if overlap and step < p - 1:
            # posted before this step's attention (in program order too), so that the shard travels while the
            # rank computes: a host thread that issues ops in order (as a CPU rank does) overlaps them as well
            cur, nxt = (f"kv{step % 2}",), (f"kv{(step + 1) % 2}",)
            # one transfer per rank, all at once: rank r sends the shard it holds to nxt_of[r]; the receive
            # buffer's previous shard (step - 1) has been attended to and sent on
            first = sched.add_transfers(ranks, nxt_of, kv_size[held], Indexed(kv_name, held), have[:, None],
                                        np.stack((attend[nxt_of], sent[nxt_of]), axis=1), args=cur, dst_args=nxt,
                                        alloc=((nxt[0], max_kv),) if step == 0 else ())
            new_have[nxt_of], new_sent = recv_of(transfer_send(first, ranks)), transfer_send(first, ranks)
        first = sched.add_kernel_step(ranks, Indexed(attends, held), np.stack((have, attend), axis=1), dtype=dtype,
                                      fn="attend", out="acc", args=("q", f"kv{step % 2}" if overlap else "kv0"),
                                      alloc=first_alloc if step == 0 else ())
        attend = first + ranks
        if step == p - 1:
            break
        if not overlap:  # attend, then exchange in place: send the shard, then copy the staged one over kv0
            first = sched.add_transfers(ranks, nxt_of, kv_size[held], Indexed(kv_name, held), attend[:, None],
                                        attend[nxt_of][:, None], args=("kv0",), dst_args=("kvin",))
            new_have[nxt_of], new_sent = recv_of(transfer_send(first, ranks)), transfer_send(first, ranks)
            # once this rank's own send has left
            first = sched.add_kernel_step(ranks, Indexed(copies, order[(pos - step - 1) % p]),
                                          np.stack((new_have, new_sent), axis=1), dtype=dtype, fn="copy", out="kv0",
                                          args=("kvin",))
            new_have = first + ranks
        have, sent = new_have, new_sent
    sched.meta["outputs"] = [(r, "out") for r in range(p)]
    for r in range(p):
        add_finalize(sched, shape, r, (int(attend[r]),))
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
