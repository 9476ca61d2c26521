"""Schedules as plain data: per-rank ops with explicit dependencies, sizes and buffers.

An algorithm builds a :class:`Schedule`; executors (the simpy engine, the numeric executor, the real
``torch.distributed`` runner) run it. No simpy here: a schedule can be printed, tested and exported on its own.

Op kinds:

* ``compute`` / ``merge``: a kernel on the rank's device (roofline time from ``flops`` and ``nbytes``);
* ``send`` / ``recv``: the two ends of one point-to-point transfer of ``nbytes`` (``peer`` is the other rank,
  ``match`` the id of the other end). A transfer starts when both ends are ready (rendezvous, as NCCL send/recv)
  and completes both ends when the last byte arrives.

An op becomes ready when all of its ``deps`` (op ids) are done and the clock has reached ``not_before_s``. Compute
ops of one rank run one at a time in the order they become ready (one compute stream); transfers run
concurrently with compute, which is how overlap is expressed. Deps may only name earlier ops, so every schedule
is a DAG by construction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["COMPUTE_KINDS", "OP_KINDS", "Op", "Schedule"]

OP_KINDS = ("compute", "merge", "send", "recv")
COMPUTE_KINDS = frozenset({"compute", "merge"})


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of one rank. Sizes in FLOPs and bytes; ``not_before_s`` in seconds."""

    id: int
    rank: int
    kind: str
    name: str
    deps: tuple[int, ...] = ()
    flops: float = 0.0
    nbytes: float = 0.0
    dtype: str = "fp32"
    peer: int | None = None
    match: int | None = None
    not_before_s: float = 0.0


@dataclass
class Schedule:
    """Per-rank ops. ``placement[r]`` names the cluster node of rank ``r`` (default: the cluster's ranks)."""

    ranks: int
    ops: list[Op] = field(default_factory=list)
    placement: tuple[str, ...] | None = None
    name: str = ""

    def _check(self, rank: int, deps: Iterable[int]) -> tuple[int, ...]:
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} out of range 0..{self.ranks - 1}")
        deps_t = tuple(deps)
        for d in deps_t:
            if not 0 <= d < len(self.ops):
                raise ValueError(f"dependency {d} does not name an earlier op")
        return deps_t

    def add_compute(self, rank: int, name: str, *, flops: float = 0.0, nbytes: float = 0.0,
                    dtype: str = "fp32", deps: Iterable[int] = (), kind: str = "compute",
                    not_before_s: float = 0.0) -> int:
        """Append a compute (or ``merge``) op on ``rank``; returns its id."""
        if kind not in COMPUTE_KINDS:
            raise ValueError(f"kind must be one of {sorted(COMPUTE_KINDS)}, got {kind!r}")
        op = Op(len(self.ops), rank, kind, name, self._check(rank, deps), flops=float(flops),
                nbytes=float(nbytes), dtype=dtype, not_before_s=not_before_s)
        self.ops.append(op)
        return op.id

    def add_transfer(self, src: int, dst: int, nbytes: float, name: str, *, send_deps: Iterable[int] = (),
                     recv_deps: Iterable[int] = (), not_before_s: float = 0.0) -> tuple[int, int]:
        """Append a matched send (on ``src``) and recv (on ``dst``); returns ``(send_id, recv_id)``."""
        if nbytes < 0:
            raise ValueError(f"nbytes must not be negative, got {nbytes}")
        sd, rd = self._check(src, send_deps), self._check(dst, recv_deps)
        sid = len(self.ops)
        self.ops.append(Op(sid, src, "send", name, sd, nbytes=float(nbytes), peer=dst, match=sid + 1,
                           not_before_s=not_before_s))
        self.ops.append(Op(sid + 1, dst, "recv", name, rd, nbytes=float(nbytes), peer=src, match=sid,
                           not_before_s=not_before_s))
        return sid, sid + 1

    def rank_ops(self, rank: int) -> list[Op]:
        """The ops of ``rank`` in program order."""
        return [op for op in self.ops if op.rank == rank]

    def placement_on(self, cluster_ranks: Sequence[str]) -> tuple[str, ...]:
        """Node name of every rank on a cluster whose GPUs are ``cluster_ranks``."""
        if self.placement is not None:
            return self.placement
        if self.ranks > len(cluster_ranks):
            raise ValueError(f"schedule needs {self.ranks} ranks; the cluster has {len(cluster_ranks)} GPUs")
        return tuple(cluster_ranks[: self.ranks])

    def __str__(self) -> str:
        lines = [f"Schedule {self.name or ''} ({self.ranks} ranks, {len(self.ops)} ops)".replace("  ", " ")]
        for r in range(self.ranks):
            lines.append(f"rank {r}:")
            for op in self.rank_ops(r):
                size = f"{op.flops:.4g} flop " if op.flops else ""
                size += f"{op.nbytes:.4g} B" if op.nbytes or op.kind in ("send", "recv") else ""
                peer = f" {'->' if op.kind == 'send' else '<-'} {op.peer}" if op.peer is not None else ""
                deps = f" after {list(op.deps)}" if op.deps else ""
                lines.append(f"  #{op.id} {op.kind} {op.name}{peer} {size}{deps}".rstrip())
        return "\n".join(lines)
