"""Ring collectives (NCCL's ring algorithm): allreduce = reduce-scatter + allgather, 2(P-1) steps of n/P.

Reduce and broadcast are pipelines along the ring, towards or from the root, in the protocol's steps
(:func:`simulator.collectives.protocols.step_payload`: Simple's is ``PIPELINE_SLICE_BYTES``, a 4 MiB channel
buffer in 8 steps = 512 KiB), in at most ``CHAIN_CHUNKS`` chunks of three ops a stage (:mod:`.steps`); LL and
LL128 pass a warp's lines on as they arrive inside a server, a hop between servers a whole step. NVLS cuts
its pipeline in slices of a step, at most ``MAX_SLICES`` (:func:`ring_slices`).

A ring's lockstep steps (the allreduce's, reduce-scatter's, allgather's; a pairwise all-to-all's) are built over
arrays and appended as one block of columns (:func:`lockstep`): the ops ``CollBuilder.step`` appends one step at a
time, at a fraction of a microsecond an op.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from simulator.collectives.base import CollBuilder, chunk_bounds, rotated_to
from simulator.collectives.steps import chunk_steps, grain_steps, parts
from simulator.schedule.core import STREAMED
from simulator.schedule.oplist import KIND_INDEX, Indexed

__all__ = ["CHAIN_CHUNKS", "MAX_SLICES", "PIPELINE_SLICE_BYTES", "lockstep", "ring_allreduce", "ring_broadcast",
           "ring_reduce", "ring_slices", "ring_steps"]

PIPELINE_SLICE_BYTES = 512 * 1024
MAX_SLICES = 64
_SEND, _RECV, _COMPUTE = KIND_INDEX["send"], KIND_INDEX["recv"], KIND_INDEX["compute"]
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
    ring_steps(b, ranks, 0, p - 1, reduce=True)  # reduce-scatter: after step k, rank i holds chunk (i - k - 1)
    ring_steps(b, ranks, 1, p - 1, reduce=False)  # allgather: rank i forwards the complete chunk (i + 1 - k)


def ring_steps(b: CollBuilder, ranks: Sequence[int], first: int, steps: int, reduce: bool) -> None:
    """``steps`` lockstep steps around the ring ``ranks`` of ``b``'s P chunks (``chunk_bounds``): at step k,
    ``ranks[i]`` passes chunk ``(i + first - k) mod P`` to ``ranks[i + 1]`` (with ``reduce``, which adds it to its
    own), as :func:`lockstep` builds them."""
    p = len(ranks)
    k = np.arange(max(steps, 0))
    lockstep(b, ranks, np.ones(len(k), np.int64), (np.arange(p)[None, :] + first - k[:, None]) % p, reduce)


def lockstep(b: CollBuilder, ranks: Sequence[int], shift: np.ndarray, chunk: np.ndarray, reduce: bool) -> None:
    """Lockstep steps over ``ranks`` and ``b``'s P chunks (``chunk_bounds``): at step k, ``ranks[i]`` passes chunk
    ``chunk[k, i]`` to ``ranks[(i + shift[k]) mod P]`` (with ``reduce``, which adds it to its own: never into the
    chunk it sends in the same step, so no reduction waits for a send, as a ring's); every rank sends once a step
    and receives once (``0 < shift[k] < P``). The ops :meth:`CollBuilder.step` appends for these
    steps, one step after the other, with the same ids, fields and deps, built over arrays and appended as one
    block (``tests/test_collective_build.py`` compares the two). Per step: the P transfers (a send, its recv),
    then with ``reduce`` the P reductions (after the receive and the receiver's own send of the step); a rank's
    next step after its reduction, or its send and receive."""
    p, steps = len(ranks), len(shift)
    if p < 2 or steps < 1:
        return
    sched = b.sched
    ring = np.asarray(ranks, dtype=np.int64)
    i = np.arange(p)
    to = (i[None, :] + shift[:, None]) % p  # (step, move): the receiver's index
    width = 3 * p if reduce else 2 * p  # ops a step
    base = len(sched.ops) + width * np.arange(steps)  # each step's first op
    send = base[:, None] + 2 * i  # (step, move)
    recv = send + 1
    edges = np.asarray(chunk_bounds(b.n, p), dtype=np.int64) + b.offset
    lo, hi = edges[chunk, 0], edges[chunk, 1]
    # what each move's ends wait for: in step 0 the frontier they start with, later their previous step's
    start = [b.front[r] for r in ranks]
    w = max(2, *map(len, start))
    after = np.full((steps, p, w), -1, np.int64)  # after[k, j]: deps of ranks[j]'s ops in step k
    for j, deps in enumerate(start):
        after[0, j, :len(deps)] = deps
    came = (i[None, :] - shift[:-1, None]) % p  # (step, rank's index): the move it received by
    rows = np.arange(steps - 1)[:, None]
    if reduce:
        red = base[:, None] + 2 * p + i  # (step, move): the receiver's reduction
        after[1:, :, 0] = red[rows, came]
    else:
        after[1:, :, 0] = send[:-1]
        after[1:, :, 1] = recv[rows, came]
    steps_i = np.arange(steps)[:, None]
    nxt = ring[to]  # (step, move): the receiving rank
    nbytes = ((hi - lo) * b.elem_bytes).astype(float) * b.wire
    src = np.broadcast_to(ring, nxt.shape)
    if b.net_of is not None:
        hop = np.where(b.net_of(src, nxt), b.hop_pair[1], b.hop_pair[0])
    elif b.hop_s is not None:
        hop_s = b.hop_s
        hop = np.array([[hop_s(a, c) for a, c in zip(ranks, row, strict=True)] for row in nxt.tolist()], dtype=float)
    else:
        hop = np.zeros(nxt.shape)
    cap = float(b.cap * b.wire)
    shape = (steps, p)
    zeros = np.zeros(shape)
    cols: dict[str, np.ndarray] = {  # (step, move, end): a transfer's send and recv
        "kind": _ends(np.full(shape, _SEND, np.uint8), np.full(shape, _RECV, np.uint8)),
        "rank": _ends(src, nxt), "match": _ends(recv, send),
        "deps": np.stack([after, after[steps_i, to]], axis=2),  # a send after its rank's, a recv after its
        "nbytes": _ends(nbytes, nbytes), "flops": _ends(zeros, zeros), "floor_s": _ends(hop, zeros),
        "rate_cap": _ends(np.full(shape, cap), zeros), "lo": _ends(lo, lo), "hi": _ends(hi, hi)}
    if not reduce:
        flat = {name: v.reshape(-1, w) if name == "deps" else v.reshape(-1) for name, v in cols.items()}
        kinds = flat.pop("kind")
        sched.add_ops(kinds, flat.pop("rank"), flat.pop("deps"), flat.pop("match"), name=b.tag, coll=b.tag,
                      args=(b.buf,), into=kinds == _RECV, **flat)
        got = recv[-1, (i - shift[-1]) % p].tolist()
        for j, r in enumerate(ranks):
            b.front[r] = (int(send[-1, j]), got[j])
        return
    # the transport buffers a reducing step's receives land in, named as CollBuilder.transport names them
    first_tmp = b._tmp + 1
    b._tmp += steps * p
    args_table: list[tuple[str, ...]] = [(b.buf,)]
    args_table += [(f"{b.tag}.tmp{t}" if not b.offset else f"{b.tag}.tmp{b.offset}.{t}",)
                   for t in range(first_tmp, b._tmp + 1)]
    tmp = (1 + np.arange(steps * p)).reshape(shape)
    cols["args"] = _ends(np.zeros(shape, np.int64), tmp)
    elems = hi - lo
    red_deps = np.full((steps, p, w), -1, np.int64)
    red_deps[:, :, 0] = recv  # after the receive and the receiver's own send of the step
    red_deps[:, :, 1] = send[steps_i, to]
    reds = {"kind": np.full(shape, _COMPUTE, np.uint8), "rank": nxt,
            "match": np.full(shape, -1, np.int64), "deps": red_deps, "nbytes": 3.0 * elems * b.elem_bytes,
            "flops": elems.astype(float), "floor_s": zeros, "rate_cap": zeros, "lo": lo, "hi": hi, "args": tmp}
    col = {name: _then(cols[name], reds[name]) for name in cols}
    kinds = col.pop("kind")
    comp = (kinds == _COMPUTE).astype(np.int64)
    sched.add_ops(kinds, col.pop("rank"), col.pop("deps"), col.pop("match"),
                  name=Indexed([b.tag, f"{b.tag}.reduce"], comp), dtype=Indexed(["fp32", b.dtype], comp),
                  fn=Indexed(["", f"reduce-{b.op}"], comp), out=Indexed(["", b.buf], comp),
                  args=Indexed(args_table, col.pop("args")), fused=comp.astype(bool), coll=b.tag, **col)
    last = red[-1, (i - shift[-1]) % p].tolist()
    for j, r in enumerate(ranks):
        b.front[r] = (last[j],)


def _ends(send: np.ndarray, recv: np.ndarray) -> np.ndarray:
    """(step, move) columns of a transfer's two ends as one (step, move, 2) column."""
    return np.stack([send, recv], axis=2)


def _then(pairs: np.ndarray, reductions: np.ndarray) -> np.ndarray:
    """A reducing step's ops in order: its P transfers' two ends (``pairs``: (step, move, 2, ...)), then its P
    reductions (``reductions``: (step, move, ...)), step after step, as one column."""
    steps, p = pairs.shape[:2]
    tail = pairs.shape[3:]
    return np.concatenate([pairs.reshape(steps, 2 * p, *tail), reductions.reshape(steps, p, *tail)],
                          axis=1).reshape(steps * 3 * p, *tail)


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
