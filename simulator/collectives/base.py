"""Shared machinery of collective decompositions: a builder that tracks each rank's dependency frontier.

A collective operates on one flat buffer ``buf`` of ``n`` elements held by every participating rank. It expands
into sends, receives and elementwise reductions on the schedule. Received operands land in transport buffers
(``tmp`` names, not counted as user memory: NCCL reduces straight from its own channel buffers) and the reduction
runs inside the communication kernel (``fused``: no kernel launch), as NCCL does.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from simulator.schedule.core import Schedule
from simulator.schedule.op import OP_KINDS

__all__ = ["REDUCE_OPS", "CollBuilder", "chunk_bounds", "rotated_to"]

_LAUNCH = OP_KINDS.index("launch")

REDUCE_OPS = ("sum", "max")


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous element ranges of ``n`` elements (numpy.array_split sizes: the first ``n % parts``
    ranges hold one element more). Arithmetic only: memory does not grow with ``n``."""
    if parts < 1:
        raise ValueError(f"parts must be positive, got {parts}")
    q, extra = divmod(n, parts)
    edges = [k * q + min(k, extra) for k in range(parts + 1)]
    return list(itertools.pairwise(edges))


def rotated_to(ranks: Sequence[int], root: int) -> list[int]:
    """``ranks`` in their order, rotated to start at ``root`` (a ring or tree around a root).

    >>> rotated_to([4, 5, 6, 7], 6)
    [6, 7, 4, 5]
    """
    i = list(ranks).index(root)
    return [*ranks[i:], *ranks[:i]]


@dataclass
class CollBuilder:
    """Builds one collective on ``sched``. ``front[r]`` lists the ops after which rank r's buffer is current."""

    sched: Schedule
    buf: str
    n: int
    elem_bytes: int
    dtype: str
    op: str
    tag: str
    front: dict[int, tuple[int, ...]] = field(default_factory=dict)
    _tmp: int = 0
    wire: float = 1.0  # bytes on the wire per payload byte (a protocol's line format)
    hop_s: Callable[[int, int], float] | None = None  # a protocol's per-hop latency from rank a to rank b
    offset: int = 0  # this builder works on elements offset .. offset + n of ``buf`` (one channel's share)
    cap: float = 0.0  # a channel's payload bytes/s at most (0: no cap; NCCL's per-channel caps, collectives.caps)
    slice_bytes: float = 512 * 1024  # NCCL's step of payload (the protocol's, collectives.protocols.step_payload)
    grain: float | None = None  # payload bytes a rank passes on at a time inside a server (protocols.forward_grain)
    crosses: Callable[[int, int], bool] | None = None  # whether a connection from rank a to b leaves the server
    # over arrays of ranks a and b, whether each connection leaves the server (what hop_s and crosses read), and
    # hop_s's two values (inside a server, across): for builders that take a whole tree's connections at once
    net_of: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
    hop_pair: tuple[float, float] = (0.0, 0.0)

    def view(self, lo: int, hi: int) -> CollBuilder:
        """A builder over elements ``lo:hi`` of this one's range that shares its frontier (one channel, one chunk)."""
        return dataclasses.replace(self, n=hi - lo, offset=self.offset + lo, front=self.front)

    @classmethod
    def start(cls, sched: Schedule, ranks: Sequence[int], buf: str, n: int, elem_bytes: int, dtype: str,
              op: str, tag: str, deps: Mapping[int, Iterable[int]], kind: str = "allreduce",
              root: int | None = None, launch_s: float = 0.0) -> CollBuilder:
        if op not in REDUCE_OPS:
            raise ValueError(f"reduce op must be one of {REDUCE_OPS}, got {op!r}")
        if len(ranks) < 2:  # nothing to communicate: no communication operation is launched
            return cls(sched, buf, n, elem_bytes, dtype, op, tag, {r: tuple(deps.get(r, ())) for r in ranks})
        m = len(ranks)  # a launch per rank, appended as one block (the ops add_launch would append, in order)
        first = sched.add_ops(np.full(m, _LAUNCH, np.uint8), np.asarray(ranks, dtype=np.int64),
                              [tuple(deps.get(r, ())) for r in ranks], np.full(m, -1, np.int64),
                              name=f"{tag}.launch", coll=tag, fn=kind, out=buf, root=root,
                              redop="" if kind == "broadcast" else op, floor_s=launch_s)
        front: dict[int, tuple[int, ...]] = {r: (first + k,) for k, r in enumerate(ranks)}
        return cls(sched, buf, n, elem_bytes, dtype, op, tag, front)

    def nbytes(self, lo: int, hi: int) -> float:
        return float((hi - lo) * self.elem_bytes)

    def send_reduce(self, src: int, dst: int, lo: int, hi: int) -> None:
        """``dst.buf[lo:hi] op= src.buf[lo:hi]``; the reduction becomes rank dst's frontier."""
        self.step([(src, dst, lo, hi)], reduce=True)

    def send_copy(self, src: int, dst: int, lo: int, hi: int) -> None:
        """``dst.buf[lo:hi] = src.buf[lo:hi]``; the receive becomes rank dst's frontier."""
        self.step([(src, dst, lo, hi)], reduce=False)

    def step(self, moves: Sequence[tuple[int, int, int, int]], reduce: bool) -> None:
        """Concurrent moves ``(src, dst, lo, hi)``: every one waits on the frontiers from before the step.

        All transfers of the step are appended before any reduction, so op-id order stays a valid serial order
        (every send reads its buffer as it was before the step). A reduction into a slice that the same rank is
        sending in this step also waits for that send (write after read). Several moves into one rank (a tree
        node with two children) land in separate transport buffers; their reductions run one after the other.
        A rank's sends of this step join its frontier: its next step starts once they have left (one step at a
        time per rank, as in NCCL's and MPI's algorithms). They replace the frontier from before the step, which
        each of them waits for: a frontier names a rank's latest ops only, not its history (a ring's P - 1 steps
        would otherwise give its last ops P deps each, O(P^2) per rank), and the engine readies every op at the
        same instant, by the same op, as with the history named (an op named again ends before the ops that wait
        for it).
        """
        if self.offset:
            moves = [(src, dst, lo + self.offset, hi + self.offset) for src, dst, lo, hi in moves]
        before = {r: self.front[r] for move in moves for r in move[:2]}  # the ranks moving (not all: O(step))
        received: list[tuple[int, int, int, int, str]] = []  # (recv id, dst, lo, hi, tmp)
        sends: dict[int, list[tuple[int, int, int]]] = {}  # src -> (send id, lo, hi)
        for src, dst, lo, hi in moves:
            snd, recv, tmp = self._transfer(src, dst, lo, hi, reduce, before[src], before[dst])
            sends.setdefault(src, []).append((snd, lo, hi))
            received.append((recv, dst, lo, hi, tmp))
        for src, items in sends.items():  # its sends, which wait for all of before[src]: it needs no repeating
            if self.front[src] == before[src]:
                self.front[src] = tuple(snd for snd, _, _ in items)
        for recv, dst, lo, hi, tmp in received:
            if not reduce:
                self.front[dst] = (*self.front[dst], recv) if self.front[dst] != before[dst] else (recv,)
                continue
            war = [snd for snd, slo, shi in sends.get(dst, ()) if slo < hi and lo < shi]
            self.front[dst] = (self._reduction(dst, lo, hi, tmp, (recv, *self.front[dst], *war)),)

    def move(self, src: int, dst: int, lo: int, hi: int, reduce: bool, send_deps: Iterable[int],
             recv_deps: Iterable[int]) -> tuple[int, int, int]:
        """One move of elements ``lo:hi`` (of this builder's range) with the dependencies given, not the frontier's
        (a pipeline's slices each follow their own chain): ``(send id, receive id, the op after which dst holds
        the slice)`` -- the receive, or with ``reduce`` the reduction it feeds. The frontier is left alone."""
        lo, hi = lo + self.offset, hi + self.offset
        snd, recv, tmp = self._transfer(src, dst, lo, hi, reduce, tuple(send_deps), tuple(recv_deps))
        return snd, recv, self._reduction(dst, lo, hi, tmp, (recv, *recv_deps)) if reduce else recv

    def transport(self) -> str:
        """A new transport buffer's name (a received operand, reduced from there)."""
        self._tmp += 1
        return f"{self.tag}.tmp{self._tmp}" if not self.offset else f"{self.tag}.tmp{self.offset}.{self._tmp}"

    def _transfer(self, src: int, dst: int, lo: int, hi: int, reduce: bool, send_deps: tuple[int, ...],
                  recv_deps: tuple[int, ...]) -> tuple[int, int, str]:
        """A transfer of buffer elements ``lo:hi`` (absolute), into ``dst``'s buffer or, with ``reduce``, into a
        transport buffer of its own (named here): (send id, receive id, transport buffer or "")."""
        tmp = self.transport() if reduce else ""
        snd, recv = self.sched.add_transfer(
            src, dst, self.nbytes(lo, hi) * self.wire, self.tag, send_deps=send_deps, recv_deps=recv_deps,
            args=(self.buf,), dst_args=(tmp,) if reduce else None, lo=lo, hi=hi, coll=self.tag,
            into=not reduce, floor_s=self.hop_s(src, dst) if self.hop_s else 0.0, rate_cap=self.cap * self.wire)
        return snd, recv, tmp

    def _reduction(self, dst: int, lo: int, hi: int, tmp: str, deps: tuple[int, ...]) -> int:
        """``dst.buf[lo:hi] op= tmp``, fused into the communication kernel (NCCL reduces from its channel buffers)."""
        elems = hi - lo
        return self.sched.add_compute(dst, f"{self.tag}.reduce", flops=elems, nbytes=3.0 * elems * self.elem_bytes,
                                      dtype=self.dtype, deps=deps, fn=f"reduce-{self.op}", out=self.buf,
                                      args=(tmp,), lo=lo, hi=hi, fused=True, coll=self.tag)
