"""``ring-q``: pass-Q ring attention (Yang et al., "Context Parallelism for Scalable Million-Token Inference",
arXiv:2411.01783, Sec. 3.3: pass-Q), any layout, on a cached prefix too (forward), forward and backward.

Each rank keeps its K and V (its cache: a cached prefix's share and the new tokens') and passes the queries on
instead. Step 0: each rank attends its own queries to its own K/V, starting its running state (o, l, m). At step
s = 1..P-1 each rank holds the queries of the rank s places before it on the ring and attends them to its K/V, a
fresh partial state; the partial goes straight back to the queries' owner, which merges it into its running state
(``attn-merge``, in step order, after the ring) and finalizes its output. The partials' return is an all-to-all
(every rank sends one partial to every other whose queries see its keys), sent piece by piece as each partial is
ready rather than after the ring as the paper's single All2All: the same bytes, overlapped with the later steps.
A fully masked block is skipped (nothing to return); the queries still go round.

The ops of a rank come in the order a program issues them: at each step, post the next queries' send and
receive, attend, send the fresh partial to its owner and post the receive of its own queries' partial; after the
last step, merge the partials received, in step order (the paper's order: the ring, then the partials' exchange and
the merges; here each partial leaves as soon as its block ends). A GPU posts a point-to-point end only after the
kernels issued before it (:mod:`simulator.engine.core`: stream order), so each step's queries go out after the
step before's block, never behind a merge waiting for a partial still in flight; a rank holds the partials it
received (up to P - 1) until the ring ends. (Merging each partial a step after it was sent instead, measured on
2 DGX H100 at 128K tokens, zigzag: 39.1 ms forward against 32.7, at about half the partials' peak memory.)

* ``overlap: true``: the next queries' transfer is posted before the step's attention (double buffering, two
  alternating receive buffers, as ``ring``); ``false``: attend, then pass on.

Backward (``backward: true``, after the forward): each owner computes delta = rowsum(out dO), then its queries'
bundle (q, dO, lse, delta) goes round again; each rank adds the visiting rows' block gradient to its own dK, dV,
which never move, while the visiting rows' dQ travels with them (sent after the block that adds to it) and, after
the last step, one hop more brings it home: P - 1 bundle transfers and P dQ transfers per rank (``ring`` with the
roles of queries and keys swapped).

Transfers per rank: P - 1 query shards (q of its rows, ``dtype``) and, per block with unmasked pairs on another
rank, one partial state back (o, l, m of the owner's rows). With n new tokens, C cached, GQA ratio g = heads /
kv_heads, pass-Q moves (P - 1) n heads d (queries) plus up to (P - 1) n (heads d + 2 heads) (partials) elements,
pass-KV (``ring``) (P - 1) 2 (C + n) kv_heads d: :func:`simulator.algorithms.prefill.rule.pass_volumes`.
"""

from __future__ import annotations

import numpy as np

from simulator.algorithms.base import Layout
from simulator.algorithms.prefill.base import add_delta, add_final, kv_runs, kv_tokens, new_prefill_schedule, tokens
from simulator.algorithms.prefill.ring import _Blocks, _pad, _Ring
from simulator.kernels.launches import launch_matrix, prefix_launch_matrix
from simulator.schedule.core import Schedule
from simulator.schedule.op import OP_KINDS, recv_of, transfer_send
from simulator.schedule.oplist import Indexed
from simulator.workloads.layouts import pair_matrix
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["build_prefill_ring_q"]


def _q_buf(step: int) -> str:
    return "q" if step == 0 else f"qr{step % 2}"


_SEND, _RECV, _COMPUTE = OP_KINDS.index("send"), OP_KINDS.index("recv"), OP_KINDS.index("compute")


def build_prefill_ring_q(shape: PrefillShape, layout: Layout, overlap: bool = True) -> Schedule:
    ring = _Ring(layout)
    p = ring.p
    sched = new_prefill_schedule("ring-q", shape, p)
    runs = sched.meta["runs"]
    tok = np.array([tokens(sched, r) for r in range(p)], dtype=np.int64)
    if shape.cached:
        pairs = pair_matrix(runs, shape.causal, kv_runs(sched))
        launches = prefix_launch_matrix(shape.layout, runs, kv_runs(sched), shape.causal)
        ktok = np.array([kv_tokens(sched, r) for r in range(p)], dtype=np.int64)
        blocks = _Blocks(shape, tok, pairs, launches, ktok)
    else:
        pairs = pair_matrix(runs, shape.causal)
        blocks = _Blocks(shape, tok, pairs, launch_matrix(shape.layout, runs, shape.causal))
    ranks = np.arange(p, dtype=np.int64)
    none = np.full(p, -1, dtype=np.int64)
    q_size = np.array([shape.q_bytes(int(t)) for t in tok])
    state = np.array([shape.state_bytes(int(t)) for t in tok])
    max_q, max_state = float(q_size.max()), float(state.max())
    q_names = [f"q[{o}]" for o in range(p)]
    have, sent = none, none  # the receive that brought rank r the queries it holds (-1: its own); its last send
    last = none.copy()  # rank r's last attention block
    acc = none.copy()  # the last op that wrote rank r's running state (its own block, then each merge)
    received: list[tuple[int, np.ndarray, np.ndarray]] = []  # each step's partials (step, owners, receives)

    def post(step: int, after: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every rank sends the queries it holds on to the next (after ``after``), received once the receiver is
        done with that buffer's previous queries (its last block and its previous send)."""
        held = ring.shards_at(step)
        first = sched.add_transfers(ranks, ring.next, q_size[held], Indexed(q_names, held), after,
                                    _pad(last[ring.next], sent[ring.next]), args=(_q_buf(step),),
                                    dst_args=(_q_buf(step + 1),),
                                    alloc=((_q_buf(step + 1), max_q),) if step < 2 else ())
        new_have = np.empty(p, dtype=np.int64)
        new_have[ring.next] = recv_of(transfer_send(first, ranks))
        return new_have, transfer_send(first, ranks)

    for step in range(p):
        held = ring.shards_at(step)  # whose queries each rank holds
        new_have, new_sent = have, sent
        if overlap and step < p - 1:
            new_have, new_sent = post(step, have[:, None])
        live = np.flatnonzero(pairs[held, ranks] > 0)  # a fully masked block: nothing to attend or return
        done = none.copy()
        out = "acc" if step == 0 else f"st{step}"
        if len(live):
            owners = held[live]
            first = sched.add_kernel_step(
                live, Indexed(blocks.table, blocks.which(False, "kv", owners, live)), _pad(have[live], last[live]),
                dtype=shape.dtype, fn="attn-fwd", out=out, args=(_q_buf(step), "kv"),
                alloc=Indexed([((out, float(x)),) for x in state], owners))
            done[live] = last[live] = first + np.arange(len(live))
        if step == 0:
            acc = done.copy()
        if not overlap and step < p - 1:
            new_have, new_sent = post(step, _pad(have, done))
        if step > 0 and len(live):
            received.append((step, held[live], _send_partials(sched, step, live, held[live], done[live], state,
                                                              max_state)))
        have, sent = new_have, new_sent
    for step, owners, recvs in received:  # after the ring, each owner merges its partials in step order
        _merge_partials(sched, shape, step, owners, recvs, acc, tok)
    finals = [add_final(sched, shape, r, int(tok[r]), [int(acc[r])] if acc[r] >= 0 else []) for r in range(p)]
    sched.meta["outputs"] = [(r, "out") for r in range(p)]
    if shape.backward:
        deltas = np.array([add_delta(sched, shape, r, int(tok[r]), [finals[r]]) for r in range(p)], dtype=np.int64)
        _backward(sched, shape, ring, overlap, blocks, pairs, tok, deltas)
    return sched


def _send_partials(sched: Schedule, step: int, holders: np.ndarray, owners: np.ndarray, blocks: np.ndarray,
                   state: np.ndarray, max_state: float) -> np.ndarray:
    """Each holder's fresh partial goes back to its owner (released once sent): per partial a send after its block
    and the owner's receive; returns the receives' ids."""
    m = len(holders)
    ids = len(sched.ops) + 2 * np.arange(m)
    slot = np.tile(np.arange(2), m)  # 0 send, 1 recv
    st, rt = f"st{step}", f"rt{step}"
    sched.add_ops(np.tile(np.array([_SEND, _RECV], dtype=np.int64), m), np.stack([holders, owners], axis=1).reshape(-1),
                  np.stack([blocks, np.full(m, -1)], axis=1).reshape(-1, 1),
                  np.stack([ids + 1, ids], axis=1).reshape(-1),
                  name=Indexed([f"partial[{o}]" for o in range(int(owners.max()) + 1)], np.repeat(owners, 2)),
                  nbytes=np.repeat(state[owners], 2), dtype="fp32", args=Indexed([(st,), (rt,)], slot),
                  alloc=Indexed([(), ((rt, max_state),)], slot), free=Indexed([(st,), ()], slot))
    return ids + 1


def _merge_partials(sched: Schedule, shape: PrefillShape, step: int, owners: np.ndarray, recvs: np.ndarray,
                    acc: np.ndarray, tok: np.ndarray) -> None:
    """Each owner merges a step's partial into its running state after the previous merge (``acc``, updated)."""
    m = len(owners)
    ids = len(sched.ops) + np.arange(m)
    rows = tok[owners]
    elems = shape.batch * rows * shape.heads
    rt = f"rt{step}"
    sched.add_ops(np.full(m, _COMPUTE, dtype=np.int64), owners, np.stack([recvs, acc[owners]], axis=1),
                  np.full(m, -1, dtype=np.int64), name="attn-merge",
                  nbytes=np.array([shape.merge_extra(int(r), False)[0] for r in rows], dtype=float),
                  flops=4.0 * elems * (shape.head_dim + 2), dtype=shape.dtype, fn="attn-merge", out="acc",
                  args=(rt,), free=(rt,))
    acc[owners] = ids


_BUNDLE = ("q", "dout", "lse", "delta")  # what a rank's queries carry round in the backward


def _bundle(step: int) -> tuple[str, ...]:
    return _BUNDLE if step == 0 else tuple(f"{b}b{step % 2}" for b in _BUNDLE)


def _backward(sched: Schedule, shape: PrefillShape, ring: _Ring, overlap: bool, blocks: _Blocks, pairs: np.ndarray,
              tok: np.ndarray, deltas: np.ndarray) -> None:
    """The backward rotation (module docstring): bundles posted as the forward's queries were, dQ sent after each
    block, dK and dV accumulated in place."""
    p = ring.p
    ranks = np.arange(p, dtype=np.int64)
    none = np.full(p, -1, dtype=np.int64)
    q_size = np.array([shape.q_bytes(int(t)) for t in tok])
    bundle_size = np.array([2 * shape.q_bytes(int(t)) + 2 * shape.row_bytes(int(t)) for t in tok])
    max_q, max_row = float(q_size.max()), max(shape.row_bytes(int(t)) for t in tok)
    bundle_names, dq_names = [f"q-bundle[{o}]" for o in range(p)], [f"dq[{o}]" for o in range(p)]
    allocs = Indexed([((f"dq{0}", shape.q_bytes(int(tok[r]))), ("dkv", shape.kv_bytes(kv_tokens(sched, r))))
                      for r in range(p)], ranks)
    have, sent, dq_have, dq_sent = none, none, none, none
    last = deltas.copy()  # rank r's last op (its delta first: its own bundle is complete)

    def post(step: int, after: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        held = ring.shards_at(step)
        first = sched.add_transfers(ranks, ring.next, bundle_size[held], Indexed(bundle_names, held), after,
                                    _pad(last[ring.next], sent[ring.next]), args=_bundle(step),
                                    dst_args=_bundle(step + 1),
                                    alloc=tuple(zip(_bundle(step + 1), (max_q, max_q, max_row, max_row), strict=True))
                                    if step < 2 else ())
        new_have = np.empty(p, dtype=np.int64)
        new_have[ring.next] = recv_of(transfer_send(first, ranks))
        return new_have, transfer_send(first, ranks)

    for step in range(p):
        held = ring.shards_at(step)
        q, dout, lse, delta = _bundle(step)
        dq = f"dq{step % 2}"
        new_have, new_sent = have, sent
        if overlap and step < p - 1:
            new_have, new_sent = post(step, _pad(have, last) if step == 0 else have[:, None])
        live = np.flatnonzero(pairs[held, ranks] > 0)
        done = none.copy()
        if step == 0 and len(live) < p:
            raise AssertionError("every rank's queries see its own keys")
        if len(live):
            first = sched.add_kernel_step(
                live, Indexed(blocks.table, blocks.which(True, "kv" if step == 0 else "q-visit", held[live], live)),
                _pad(have[live], last[live], dq_have[live]), dtype=shape.dtype, fn="attn-bwd", out=dq,
                args=(q, "kv", lse, delta, dout, "dkv"), alloc=Indexed(allocs.table, allocs.which[live])
                if step == 0 else ())
            done[live] = last[live] = first + np.arange(len(live))
        if not overlap and step < p - 1:
            new_have, new_sent = post(step, _pad(have, done))
        if p > 1:  # the visiting rows' dQ goes on with them
            dnxt = f"dq{(step + 1) % 2}"
            first = sched.add_transfers(ranks, ring.next, q_size[held], Indexed(dq_names, held), _pad(done, dq_have),
                                        _pad(dq_sent[ring.next], last[ring.next]), args=(dq,), dst_args=(dnxt,),
                                        alloc=((dnxt, max_q),) if step == 0 else ())
            new_dq = np.empty(p, dtype=np.int64)
            new_dq[ring.next] = recv_of(transfer_send(first, ranks))
            dq_have, dq_sent = new_dq, transfer_send(first, ranks)
        have, sent = new_have, new_sent
    sched.meta["grads"] = [(r, f"dq{p % 2}" if p > 1 else "dq0", "dkv") for r in range(p)]
