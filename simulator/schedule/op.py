"""One operation of a schedule (:class:`Op`, a named tuple) and its kinds; :mod:`simulator.schedule.core` describes
what each field means to the executors."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["COMPUTE_KINDS", "OP_KINDS", "STREAMED", "Op"]

OP_KINDS = ("compute", "merge", "send", "recv", "launch")
STREAMED = -1.0  # a transfer's floor_s: it continues a stream of steps whose first paid the connection's latency
COMPUTE_KINDS = frozenset({"compute", "merge"})


class Op(NamedTuple):
    """One operation of one rank. Sizes in FLOPs and bytes; ``not_before_s`` in seconds.

    A named tuple (immutable, and cheap to create: schedules of large rings hold millions of ops).
    """

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
    fn: str = ""
    out: str = ""
    args: tuple[str, ...] = ()
    lo: int = 0
    hi: int = -1
    alloc: tuple[tuple[str, float], ...] = ()
    free: tuple[str, ...] = ()
    fused: bool = False
    coll: str = ""
    root: int | None = None
    redop: str = ""
    into: bool = False
    floor_s: float = 0.0  # a launch's or a transfer's fixed latency is at least this (a protocol's, see engine);
    # STREAMED (negative): a transfer that continues its connection's stream of pipeline steps pays none
    rate_cap: float = 0.0  # a send's flow never exceeds this many bytes/s (0: no cap; a channel's, see collectives)
    dims: tuple[float, ...] = ()  # a compute op's shape on its kernel profile's axes (simulator.kernels.profiles)
