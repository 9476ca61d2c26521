"""Ring collectives (NCCL's ring algorithm): allreduce = reduce-scatter + allgather, 2(P-1) steps of n/P.

Reduce and broadcast are pipelines along the ring, towards or from the root, in the protocol's steps
(:func:`simulator.collectives.protocols.step_payload`: Simple's is ``PIPELINE_SLICE_BYTES``, a 4 MiB channel
buffer in 8 steps = 512 KiB), in at most ``CHAIN_CHUNKS`` chunks of three ops a stage (:mod:`.steps`); LL and
LL128 pass a warp's lines on as they arrive inside a server, a hop between servers a whole step. NVLS cuts
its pipeline in slices of a step, at most ``MAX_SLICES`` (:func:`ring_slices`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from simulator.collectives.base import CollBuilder, chunk_bounds, rotated_to
from simulator.collectives.steps import chunk_steps, grain_steps, parts
from simulator.schedule.core import STREAMED

__all__ = ["CHAIN_CHUNKS", "MAX_SLICES", "PIPELINE_SLICE_BYTES", "ring_allreduce", "ring_broadcast", "ring_reduce",
           "ring_slices"]

PIPELINE_SLICE_BYTES = 512 * 1024
MAX_SLICES = 64
CHAIN_CHUNKS = 16  # a broadcast's or reduce's chunks at most a channel (each chunk's steps: three ops, .steps)


def ring_slices(b: CollBuilder) -> list[tuple[int, int]]:
    """The pipeline slices of ``b``'s elements (relative to its range): its protocol's step (``b.slice_bytes``;
    ``PIPELINE_SLICE_BYTES`` where no protocol set it), at most ``MAX_SLICES`` of them."""
    count = min(MAX_SLICES, max(1, math.ceil(b.n * b.elem_bytes / b.slice_bytes)))
    return [(lo, hi) for lo, hi in chunk_bounds(b.n, count) if hi > lo]


def ring_allreduce(b: CollBuilder, ranks: Sequence[int]) -> None:
    p = len(ranks)
    if p < 2 or b.n == 0:
        return
    chunks = chunk_bounds(b.n, p)
    for k in range(p - 1):  # reduce-scatter: after step k, rank i holds chunk (i - k - 1) summed over k + 2 ranks
        b.step([(ranks[i], ranks[(i + 1) % p], *chunks[(i - k) % p]) for i in range(p)], reduce=True)
    for k in range(p - 1):  # allgather: rank i forwards the complete chunk (i + 1 - k)
        b.step([(ranks[i], ranks[(i + 1) % p], *chunks[(i + 1 - k) % p]) for i in range(p)], reduce=False)


def ring_broadcast(b: CollBuilder, ranks: Sequence[int], root: int) -> None:
    _chain(b, rotated_to(ranks, root), reduce=False)


def ring_reduce(b: CollBuilder, ranks: Sequence[int], root: int) -> None:
    _chain(b, rotated_to(ranks, root)[::-1], reduce=True)  # towards the root: last rank first


def _chain(b: CollBuilder, chain: Sequence[int], reduce: bool) -> None:
    """A pipeline of NCCL's steps down ``chain`` (its first rank's data; with ``reduce``, each next rank adds its
    own): a rank forwards step j once it holds it, while it receives step j + 1 (NCCL's steps in flight); each
    connection carries its steps in order. With LL and LL128 the steps are the grains a rank passes on as they arrive
    (:func:`.steps.grain_steps`), and a hop between servers holds back a whole NCCL step (its first op of a chunk).
    The steps are cut into at most ``CHAIN_CHUNKS`` chunks, each chunk's steps over a stage (a connection, a rank's
    reductions) its first, middle and last ops (:mod:`.steps`): the steps' pipeline at a size that does not grow
    with the message. The pipeline's first step pays the protocol's per-hop latency (the fill), the later ones
    stream behind it (``STREAMED``); a chunk's last ops carry its data."""
    if len(chain) < 2 or b.n == 0:
        return
    sched, hop = b.sched, b.hop_s
    start = {r: b.front[r] for r in chain}
    sent: dict[int, tuple[int, ...]] = {r: () for r in chain}  # a rank's last send (the previous part's)
    got: dict[int, tuple[int, ...]] = {r: () for r in chain}  # its last receive
    reduced: dict[int, tuple[int, ...]] = {r: () for r in chain}  # its last reduction
    held: dict[int, tuple[int, ...]] = {r: () for r in chain}  # the op after which it holds its last chunk
    steps, chunks, head = grain_steps(b.n * b.elem_bytes, b.slice_bytes, b.grain, CHAIN_CHUNKS)
    crosses = b.crosses if head > 1 else None  # a network connection's first op holds ``head`` steps
    cap = b.cap * b.wire
    for k, (a, z, g) in enumerate(chunk_steps(b.n, steps, chunks)):
        if z == a:
            continue
        lo, hi = a + b.offset, z + b.offset
        net_parts = parts(g, head)
        for i, part in enumerate(parts(g)):
            have = start[chain[0]]  # the first rank holds every step from the start
            for src, dst in itertools.pairwise(chain):
                share = (net_parts[i] if crosses is not None and crosses(src, dst) else part).steps / g
                nbytes, elems = b.nbytes(lo, hi) * b.wire * share, (hi - lo) * share
                if part.middle:  # after its own first part only
                    send_deps, recv_deps = sent[src], got[dst]
                else:
                    send_deps, recv_deps = (*have, *sent[src]), (*start[dst], *got[dst])
                tmp = b.transport() if reduce and part.last else ""
                args = (b.buf,) if part.last else ()
                snd, rcv = sched.add_transfer(
                    src, dst, nbytes, b.tag, send_deps=send_deps, recv_deps=recv_deps, args=args,
                    dst_args=(tmp,) if tmp else args, lo=lo, hi=hi, coll=b.tag, into=part.last and not reduce,
                    floor_s=(hop(src, dst) if hop is not None else 0.0) if k == 0 and part.first else STREAMED,
                    rate_cap=cap)
                sent[src], got[dst] = (snd,), (rcv,)
                done = rcv
                if reduce:  # after the receive and the rank's previous reduction (a middle: its first's only)
                    deps = reduced[dst] if part.middle else (rcv, *start[dst], *reduced[dst])
                    done = sched.add_compute(dst, f"{b.tag}.reduce", flops=elems, nbytes=3.0 * elems * b.elem_bytes,
                                             dtype=b.dtype, deps=deps, fn=f"reduce-{b.op}" if tmp else "",
                                             out=b.buf if tmp else "", args=(tmp,) if tmp else (), lo=lo, hi=hi,
                                             fused=True, coll=b.tag)
                    reduced[dst] = (done,)
                if part.last:
                    held[dst] = (done,)
                have = (done,)
    for r in chain:
        b.front[r] = (*held[r], *sent[r]) or start[r]
