"""Ring collectives (NCCL's ring algorithm): allreduce = reduce-scatter + allgather, 2(P-1) steps of n/P.

Reduce and broadcast are pipelines along the ring, towards or from the root, in slices of the protocol's step
(:func:`simulator.collectives.protocols.step_payload`: Simple's is ``PIPELINE_SLICE_BYTES``, a 4 MiB channel
buffer in 8 steps = 512 KiB), at most ``MAX_SLICES``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence

from simulator.collectives.base import CollBuilder, chunk_bounds, rotated_to

__all__ = ["MAX_SLICES", "PIPELINE_SLICE_BYTES", "ring_allreduce", "ring_broadcast", "ring_reduce",
           "ring_slices"]

PIPELINE_SLICE_BYTES = 512 * 1024
MAX_SLICES = 64


def ring_slices(b: CollBuilder) -> list[tuple[int, int]]:
    """The pipeline slices of ``b``'s elements (relative to its range): its protocol's step (``b.slice_bytes``;
    ``PIPELINE_SLICE_BYTES`` where no protocol set it), at most ``MAX_SLICES`` of them."""
    count = min(MAX_SLICES, max(1, math.ceil(b.n * b.elem_bytes / b.slice_bytes)))
    return [(lo, hi) for lo, hi in chunk_bounds(b.n, count) if hi > lo]


@contextlib.contextmanager
def _fill_only(b: CollBuilder) -> Iterator[None]:
    """A pipeline pays the protocol's per-hop latency on its first slice only (the fill): NCCL keeps several
    steps in flight per connection (``NCCL_STEPS``), so later slices' latency hides behind earlier slices' bytes."""
    hop = b.hop_s
    try:
        yield
    finally:
        b.hop_s = hop


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
    """A pipeline of slices down ``chain`` (its first rank's data; with ``reduce``, each next rank adds its own):
    a rank forwards slice k once it holds it, while it receives slice k + 1 (NCCL's steps in flight); each
    connection carries its slices in order (a rank's sends one after the other, its receives too)."""
    if len(chain) < 2 or b.n == 0:
        return
    start = {r: b.front[r] for r in chain}
    sent: dict[int, tuple[int, ...]] = {r: () for r in chain}  # a rank's last send
    got: dict[int, tuple[int, ...]] = {r: () for r in chain}  # its last receive
    held: dict[int, tuple[int, ...]] = {r: () for r in chain}  # the op after which it holds its last slice
    with _fill_only(b):
        for lo, hi in ring_slices(b):
            have = start[chain[0]]  # the first rank holds every slice from the start
            for src, dst in itertools.pairwise(chain):
                snd, rcv, done = b.move(src, dst, lo, hi, reduce, send_deps=(*have, *sent[src]),
                                        recv_deps=(*start[dst], *got[dst]))
                sent[src], got[dst], held[dst] = (snd,), (rcv,), (done,)
                have = (done,)
            b.hop_s = None
    for r in chain:
        b.front[r] = (*held[r], *sent[r]) or start[r]
