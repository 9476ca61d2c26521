"""What every decode schedule builder receives, and the ops they share (attend, finalize)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from simulator.collectives.fabric import Fabric
from simulator.kernels.table import kernel_cost, kernel_dims
from simulator.schedule.core import Schedule
from simulator.workloads.shape import DecodeShape, shard_bounds

__all__ = ["Layout", "add_attend", "add_finalize", "add_kernel", "add_kernels", "attend_kernel", "kernel_cost_of",
           "new_decode_schedule"]


@dataclass(frozen=True)
class Layout:
    """The ranks a schedule runs on: ``hosts[r]`` is the server (node) index of rank r.

    ``fabric``: the cluster as collectives see it (channels, protocols, NCCL's choice); None runs them as one
    channel without protocol costs.
    """

    hosts: tuple[int, ...]
    fabric: Fabric | None = field(default=None, compare=False)

    @property
    def ranks(self) -> int:
        return len(self.hosts)

    def groups(self) -> list[list[int]]:
        """Ranks grouped by server, in rank order."""
        by_host: dict[int, list[int]] = {}
        for r, h in enumerate(self.hosts):
            by_host.setdefault(h, []).append(r)
        return list(by_host.values())

    def ring_order(self) -> list[int]:
        """A ring through every rank that crosses between servers rail to rail, as NCCL builds its rings.

        Servers are visited in order, every other one backwards (a snake): ``n0.gpu0..7, n1.gpu7..0, n2.gpu0..7``,
        so each server-to-server hop joins GPUs of the same local index, i.e. of the same NIC rail. (With an odd
        number of servers the hop that closes the ring is the one that crosses rails.)
        """
        return [r for i, g in enumerate(self.groups()) for r in (g if i % 2 == 0 else g[::-1])]


def new_decode_schedule(name: str, shape: DecodeShape, ranks: int, *, q_on: Iterable[int] | None = None) -> Schedule:
    """A schedule whose rank r starts with its contiguous KV shard (``kv0``) and, on ``q_on`` ranks, the query."""
    bounds = shard_bounds(shape.context, ranks)
    sched = Schedule(ranks, name=name, meta={"shards": bounds, "shape": shape})
    q_ranks = set(range(ranks) if q_on is None else q_on)
    for r, (lo, hi) in enumerate(bounds):
        sched.initial[r] = {"kv0": shape.kv_bytes(hi - lo)}
        if r in q_ranks:
            sched.initial[r]["q"] = shape.q_bytes
    return sched


def add_attend(sched: Schedule, shape: DecodeShape, rank: int, shard: int, kv_buf: str, deps: Iterable[int],
               *, first: bool, q_buf: str = "q") -> int:
    """Partial attention of the query against shard ``shard`` (held in ``kv_buf``), merged into ``acc``.

    One fused kernel, as FlashAttention/flash-decoding keep the online-softmax state across KV blocks; the first
    one allocates the running state (o, l, m).
    """
    lo, hi = sched.meta["shards"][shard]
    return add_kernel(sched, shape, rank, "attend", hi - lo, name=f"attend[{shard}]", deps=deps, out="acc",
                      args=(q_buf, kv_buf), alloc=[("acc", shape.state_bytes)] if first else ())


def attend_kernel(sched: Schedule, shape: DecodeShape, shard: int) -> tuple[str, float, float, tuple[float, ...]]:
    """The name, FLOPs, bytes and dims of :func:`add_attend`'s kernel on shard ``shard`` (for builders that emit
    the same attention for many ranks)."""
    lo, hi = sched.meta["shards"][shard]
    return (f"attend[{shard}]", *_cost("attend", shape, hi - lo))


def kernel_cost_of(shape: DecodeShape, fn: str, n: int) -> tuple[float, float, tuple[float, ...]]:
    """FLOPs, bytes and dims of kernel ``fn`` of size ``n`` (as :func:`add_kernel` gives them)."""
    return _cost(fn, shape, n)


def add_finalize(sched: Schedule, shape: DecodeShape, rank: int, deps: Iterable[int]) -> int:
    """out = o / l, in place over o (no new buffer)."""
    return add_kernel(sched, shape, rank, "finalize", shape.batch * shape.model_dim, deps=deps, out="out",
                      args=("acc",))


def add_kernel(sched: Schedule, shape: DecodeShape, rank: int, fn: str, n: int, *, name: str | None = None,
               **options: Any) -> int:
    """A compute op running kernel ``fn`` of size ``n`` (:mod:`simulator.kernels.table`), its cost from the kernel
    table;
    ``options`` are :meth:`Schedule.add_compute`'s (deps, out, args, alloc, free, fused, kind...)."""
    flops, nbytes, dims = _cost(fn, shape, n)
    return sched.add_compute(rank, name or fn, flops=flops, nbytes=nbytes, dtype=shape.dtype, fn=fn, dims=dims,
                             **options)


def add_kernels(sched: Schedule, shape: DecodeShape, ranks: Sequence[int], fn: str, n: int,
                deps: Sequence[tuple[int, ...]], *, name: str | None = None, out: str = "", args: tuple[str, ...] = (),
                fused: bool = False) -> list[int]:
    """:func:`add_kernel` on each of ``ranks`` (the k-th after ``deps[k]``), appended at once
    (:meth:`Schedule.add_computes`): the same ops as one call per rank in that order; returns their ids."""
    flops, nbytes, dims = _cost(fn, shape, n)
    m = len(ranks)
    first = sched.add_computes(ranks, [name or fn] * m, [flops] * m, [nbytes] * m, [dims] * m, deps,
                               dtype=shape.dtype, fn=fn, out=out, args=args, fused=fused)
    return list(range(first, first + m))


@lru_cache(maxsize=4096)
def _cost(fn: str, shape: DecodeShape, n: int) -> tuple[float, float, tuple[float, ...]]:
    """:func:`kernel_cost` and :func:`kernel_dims`, once per (kernel, shape, size): a ring step repeats the same few
    sizes P times."""
    flops, nbytes = kernel_cost(fn, shape, n)
    return flops, nbytes, kernel_dims(fn, shape, n)
