"""One operation of a schedule (:class:`Op`, a named tuple) and its kinds; :mod:`simulator.schedule.core` describes
what each field means to the executors.

Ops are made by one constructor per kind (:func:`send_op`, :func:`recv_op`, :func:`compute_op`, :func:`launch_op`):
each takes the fields its kind has and fills the others with their defaults, and none of them checks anything (the
:class:`~simulator.schedule.core.Schedule` methods check their arguments before they make ops). They build the
tuple directly (``tuple.__new__``), five times faster than ``Op(...)`` with keywords: schedules of large rings hold
millions of ops. Ids follow a few layouts, named here rather than written as arithmetic at every use: a transfer's
recv follows its send (:func:`recv_of`, :func:`send_of`); a block of transfers holds transfer k's send at
``first + 2k`` (:func:`transfer_send`, :func:`transfer_of`); a builder that appends ops in groups of equal width
(a tree step's send, recv and reduction per rank) names them with an :class:`OpGrid`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import numpy as np

__all__ = ["COMPUTE_KINDS", "OP_KINDS", "P2P_STREAMS", "STREAMED", "Op", "OpGrid", "compute_op", "is_recv", "launch_op",
           "recv_of", "recv_op", "send_of", "send_op", "transfer_of", "transfer_send"]

OP_KINDS = ("compute", "merge", "send", "recv", "launch")
STREAMED = -1.0  # a transfer's floor_s: it continues a stream of steps whose first paid the connection's latency
COMPUTE_KINDS = frozenset({"compute", "merge"})
# how a GPU rank's sends and receives outside collectives map to NCCL kernels and streams (the engine's stream
# order, simulator.schedule.colpass.stream_ordered): "batched", the ends it issues back to back one kernel on one
# stream per rank (PyTorch's batch_isend_irecv: the group's communicator); "per-peer", each end its own kernel on a
# stream per pair of ranks (an unbatched isend / irecv: ProcessGroupNCCL's 2-rank communicator)
P2P_STREAMS = ("batched", "per-peer")


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


_new = tuple.__new__
_I = TypeVar("_I", int, Any)  # an op id, or an array of them


def send_op(oid: int, rank: int, name: str, deps: tuple[int, ...], nbytes: float, peer: int,
            args: tuple[str, ...] = (), lo: int = 0, hi: int = -1, free: tuple[str, ...] = (), coll: str = "",
            floor_s: float = 0.0, rate_cap: float = 0.0, not_before_s: float = 0.0) -> Op:
    """The send of a transfer to ``peer`` (its recv is :func:`recv_of` ``oid``): ``args`` (slice ``lo:hi``) read,
    ``free`` released once sent; ``floor_s`` and ``rate_cap`` as :class:`Op` says."""
    return _new(Op, (oid, rank, "send", name, deps, 0.0, nbytes, "fp32", peer, oid + 1, not_before_s, "", "", args,
                     lo, hi, (), free, False, coll, None, "", False, floor_s, rate_cap, ()))


def recv_op(oid: int, rank: int, name: str, deps: tuple[int, ...], nbytes: float, peer: int,
            args: tuple[str, ...] = (), lo: int = 0, hi: int = -1, alloc: tuple[tuple[str, float], ...] = (),
            coll: str = "", into: bool = False, not_before_s: float = 0.0) -> Op:
    """The recv of a transfer from ``peer`` (its send is :func:`send_of` ``oid``): writes ``args`` (into slice
    ``lo:hi`` of buffers it holds when ``into``), allocating ``alloc``."""
    return _new(Op, (oid, rank, "recv", name, deps, 0.0, nbytes, "fp32", peer, oid - 1, not_before_s, "", "", args,
                     lo, hi, alloc, (), False, coll, None, "", into, 0.0, 0.0, ()))


def compute_op(oid: int, rank: int, name: str, deps: tuple[int, ...], flops: float, nbytes: float, dtype: str,
               fn: str = "", out: str = "", args: tuple[str, ...] = (), lo: int = 0, hi: int = -1,
               alloc: tuple[tuple[str, float], ...] = (), free: tuple[str, ...] = (), fused: bool = False,
               coll: str = "", kind: str = "compute", not_before_s: float = 0.0, dims: tuple[float, ...] = ()) -> Op:
    """A kernel ``fn`` on ``rank`` (``kind`` compute or merge): ``flops`` and ``nbytes`` on the roofline (no launch
    overhead when ``fused``), reading ``args`` and writing ``out``; ``dims`` its shape on its profile's axes."""
    return _new(Op, (oid, rank, kind, name, deps, flops, nbytes, dtype, None, None, not_before_s, fn, out, args, lo,
                     hi, alloc, free, fused, coll, None, "", False, 0.0, 0.0, dims))


def launch_op(oid: int, rank: int, name: str, deps: tuple[int, ...], fn: str = "", out: str = "", coll: str = "",
              root: int | None = None, redop: str = "", floor_s: float = 0.0) -> Op:
    """The start of a communication operation on ``rank`` (a collective's: ``fn``, ``redop``, ``root``, ``out``)."""
    return _new(Op, (oid, rank, "launch", name, deps, 0.0, 0.0, "fp32", None, None, 0.0, fn, out, (), 0, -1, (), (),
                     False, coll, root, redop, False, floor_s, 0.0, ()))


def recv_of(send: _I) -> _I:
    """The id of the recv that matches send ``send`` (ids or arrays of them): the op after it."""
    return send + 1


def send_of(recv: _I) -> _I:
    """The id of the send that matches recv ``recv``: the op before it."""
    return recv - 1


def transfer_send(first: _I, k: _I) -> _I:
    """The send's id of transfer ``k`` of a block of transfers from id ``first`` (its recv: :func:`recv_of` it)."""
    return first + 2 * k


def transfer_of(offset: _I) -> _I:
    """The transfer an op at ``offset`` within a block of transfers belongs to (send and recv alternate)."""
    return offset >> 1


def is_recv(offset: _I) -> _I:
    """Whether the op at ``offset`` within a block of transfers is a recv (1) or a send (0)."""
    return offset & 1


@dataclass(frozen=True)
class OpGrid:
    """Ops appended in groups of ``width`` consecutive ids from ``base``: group k's op in slot i has id
    ``base + width * k + i`` (e.g. a tree step: per rank, its send up (slot 0), the recv (1), the parent's
    reduction (2))."""

    base: int
    width: int

    def id(self, k: _I, slot: int = 0) -> _I:
        """The id of group ``k``'s op in ``slot`` (``k`` an int or an array)."""
        return self.base + self.width * k + slot

    def ids(self, m: int, slot: int = 0) -> Any:
        """The ids of the first ``m`` groups' ops in ``slot``, as an array."""
        return self.base + self.width * np.arange(m) + slot

    def after(self, m: int) -> int:
        """The first id after ``m`` groups."""
        return self.base + self.width * m
