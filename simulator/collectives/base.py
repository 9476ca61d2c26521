"""Shared machinery of collective decompositions: a builder that tracks each rank's dependency frontier.

A collective operates on one flat buffer ``buf`` of ``n`` elements held by every participating rank. It expands
into sends, receives and elementwise reductions on the schedule. Received operands land in transport buffers
(``tmp`` names, not counted as user memory: NCCL reduces straight from its own channel buffers) and the reduction
runs inside the communication kernel (``fused``: no kernel launch), as NCCL does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from simulator.schedule import Schedule

__all__ = ["REDUCE_OPS", "CollBuilder", "chunk_bounds"]

REDUCE_OPS = ("sum", "max")


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous element ranges of ``n`` elements (numpy.array_split sizes)."""
    edges = np.cumsum([0] + [len(a) for a in np.array_split(np.empty(n), parts)])
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges)]


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

    @classmethod
    def start(cls, sched: Schedule, ranks: Sequence[int], buf: str, n: int, elem_bytes: int, dtype: str,
              op: str, tag: str, deps: Mapping[int, Iterable[int]], kind: str = "allreduce",
              root: int | None = None) -> CollBuilder:
        if op not in REDUCE_OPS:
            raise ValueError(f"reduce op must be one of {REDUCE_OPS}, got {op!r}")
        fn = kind if kind == "broadcast" else f"{kind}-{op}"
        if len(ranks) < 2:  # nothing to communicate: no communication operation is launched
            return cls(sched, buf, n, elem_bytes, dtype, op, tag, {r: tuple(deps.get(r, ())) for r in ranks})
        front: dict[int, tuple[int, ...]] = {
            r: (sched.add_launch(r, f"{tag}.launch", deps=deps.get(r, ()), coll=tag, fn=fn, out=buf, root=root),)
            for r in ranks}
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
        time per rank, as in NCCL's and MPI's algorithms).
        """
        before = {r: self.front[r] for move in moves for r in move[:2]}  # the ranks moving (not all: O(step))
        received: list[tuple[int, int, int, int, str]] = []  # (recv id, dst, lo, hi, tmp)
        sends: dict[int, list[tuple[int, int, int]]] = {}  # src -> (send id, lo, hi)
        for src, dst, lo, hi in moves:
            tmp = ""
            if reduce:
                self._tmp += 1
                tmp = f"{self.tag}.tmp{self._tmp}"
            snd, recv = self.sched.add_transfer(
                src, dst, self.nbytes(lo, hi), self.tag, send_deps=before[src], recv_deps=before[dst],
                args=(self.buf,), dst_args=(tmp,) if reduce else None, lo=lo, hi=hi, coll=self.tag,
                recv_fn="" if reduce else "into")
            sends.setdefault(src, []).append((snd, lo, hi))
            received.append((recv, dst, lo, hi, tmp))
        for src, items in sends.items():
            if self.front[src] == before[src]:
                self.front[src] = (*before[src], *(snd for snd, _, _ in items))
        for recv, dst, lo, hi, tmp in received:
            if not reduce:
                self.front[dst] = (*self.front[dst], recv) if self.front[dst] != before[dst] else (recv,)
                continue
            war = [snd for snd, slo, shi in sends.get(dst, ()) if slo < hi and lo < shi]
            elems = hi - lo
            red = self.sched.add_compute(dst, f"{self.tag}.reduce", flops=elems,
                                         nbytes=3.0 * elems * self.elem_bytes, dtype=self.dtype,
                                         deps=(recv, *self.front[dst], *war), fn=f"reduce-{self.op}", out=self.buf,
                                         args=(tmp,), lo=lo, hi=hi, fused=True, coll=self.tag)
            self.front[dst] = (red,)
