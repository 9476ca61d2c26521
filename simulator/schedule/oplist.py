"""A schedule's ops as segments: op tuples appended one at a time, and blocks of many ops appended at once.

A lockstep step (every rank attends, every rank passes its shard on) is one block: an array per field that varies
(ranks, sizes, dependencies as CSR), the fields its ops share held once, a kernel or a name as an index into a
small table. A block costs tens of bytes an op where an :class:`~simulator.schedule.op.Op` tuple costs hundreds, and the
engine reads its columns (:meth:`OpList.columns`) without making a tuple per op (only one per distinct kernel cost,
and for its error messages). To every other reader the ops are a sequence of :class:`~simulator.schedule.op.Op`
(``ops[i]``,
iteration, :meth:`OpList.take`): a block's ops are made on demand, the ops the one-at-a-time calls
(``add_compute``, ``add_transfer``) append for the same arguments, deps as tuples.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, pairwise, repeat
from operator import eq, itemgetter
from typing import Any, NamedTuple, overload

import numpy as np
import pandas as pd

from simulator.schedule.colpass import fill_transfers, spans
from simulator.schedule.op import (
    OP_KINDS,
    Op,
    compute_op,
    is_recv,
    recv_of,
    recv_op,
    send_op,
    transfer_of,
    transfer_send,
)

__all__ = ["COST", "KIND_INDEX", "Columns", "ComputeBlock", "Indexed", "OpBlock", "OpList", "TransferBlock", "csr",
           "indexed"]

KIND_INDEX = {kind: i for i, kind in enumerate(OP_KINDS)}
_COST_FIELDS = ("flops", "nbytes", "dtype", "fused", "fn", "dims")  # what a kernel's duration depends on
COST = itemgetter(*map(Op._fields.index, _COST_FIELDS))
_RANK, _KIND, _DEPS, _NBYTES, _MATCH = itemgetter(1), itemgetter(2), itemgetter(4), itemgetter(6), itemgetter(9)
_NOT_BEFORE, _COLL, _FLOOR, _RATE_CAP = itemgetter(10), itemgetter(19), itemgetter(23), itemgetter(24)
_ALLOC, _FREE = itemgetter(16), itemgetter(17)
_SEND, _RECV, _MERGE = KIND_INDEX["send"], KIND_INDEX["recv"], KIND_INDEX["merge"]
Kernel = tuple[str, float, float, tuple[float, ...]]  # a compute op's name, FLOPs, bytes and dims
_KERNEL_FIELD = {"name": 0, "flops": 1, "nbytes": 2}  # an Op field's place in a Kernel
_ID_MAX = 2**31 - 1  # ids and ranks are int32 in the columns


class Indexed(NamedTuple):
    """Values given as a small table and, per op, an index into it (``table[which[k]]`` is op k's)."""

    table: Sequence[Any]
    which: np.ndarray


def indexed(values: Sequence[Any] | Indexed) -> Indexed:
    """``values`` (one per op) as a table of the distinct ones and an index (C-level passes)."""
    if isinstance(values, Indexed):
        return values
    table = list(dict.fromkeys(values))
    pos = {v: i for i, v in enumerate(table)}
    return Indexed(table, np.fromiter(map(pos.__getitem__, values), dtype=np.int64, count=len(values)))


def csr(deps: Sequence[tuple[int, ...]] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dependencies, one tuple per op or an (ops, k) array padded with -1, as (starts, flat): op k's are
    ``flat[starts[k]:starts[k + 1]]`` in the order given."""
    if isinstance(deps, np.ndarray):
        if deps.ndim != 2 or (deps.size and deps.dtype.kind not in "iu"):
            raise ValueError("dependencies as an array must be integers, (ops, k), padded with -1")
        given = deps >= 0
        flat = deps[given].astype(np.int64, copy=False)
        counts = np.zeros(len(deps), dtype=np.int64)
        for j in range(deps.shape[1]):  # column by column (a handful): a reduction along rows is slower
            counts += given[:, j]
        if (deps < -1).any():  # a negative id other than the padding names no op: kept, so that the check finds it
            flat, counts = deps[deps != -1].astype(np.int64, copy=False), (deps != -1).sum(axis=1)
    else:
        counts = np.fromiter(map(len, deps), dtype=np.int64, count=len(deps))
        flat = np.fromiter(chain.from_iterable(deps), dtype=np.int64, count=int(counts.sum()))
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return starts, flat


_DICT_BELOW = 96  # fewer values than this are numbered faster by a dict than by pandas' hash table


def factorize(values: np.ndarray) -> np.ndarray:
    """Each value's code, the distinct values numbered 0, 1, ... in order of first appearance (``pd.factorize``'s
    codes; numbers with no NaN): a dict for a few values, pandas' hash table for more."""
    if len(values) >= _DICT_BELOW:
        return pd.factorize(values)[0]
    seen: dict[Any, int] = {}
    return np.fromiter((seen.setdefault(v, len(seen)) for v in values.tolist()), dtype=np.int64, count=len(values))


def _csr_ok(starts: np.ndarray, flat: np.ndarray, m: int) -> bool:
    """Whether ``starts`` bounds ``m`` ops' entries of ``flat``: m + 1 of them, from 0 to its end, never falling."""
    return (len(starts) == m + 1 and int(starts[0]) == 0 and int(starts[-1]) == len(flat)
            and bool((np.diff(starts) >= 0).all()))


def _gather(starts: np.ndarray, flat: np.ndarray, js: np.ndarray) -> list[tuple[int, ...]]:
    """The deps of ops ``js`` (CSR ``starts``, ``flat``) as tuples: a gather of just theirs."""
    counts = starts[js + 1] - starts[js]
    ids = flat[spans(starts[js], counts)].tolist()
    bounds = [0, *np.cumsum(counts).tolist()]
    return [tuple(ids[a:b]) for a, b in pairwise(bounds)]


@dataclass(eq=False)
class Columns:
    """Every op's fields the engine reads, an array each by op id (:meth:`OpList.columns`). A send's fields
    (``nbytes``, ``rate_cap``, ``coll``) are 0 on every other op; ``floor`` is a send's or a launch's."""

    kind: np.ndarray  # uint8, index into OP_KINDS
    rank: np.ndarray  # int32 (as every id column: a schedule has fewer than 2^31 ops)
    match: np.ndarray  # a transfer end's other end; -1 elsewhere (and where a tuple's names no op)
    nbytes: np.ndarray
    floor: np.ndarray
    rate_cap: np.ndarray
    coll: np.ndarray  # bool: the send is part of a collective
    not_before: np.ndarray
    dep_count: np.ndarray
    parents: np.ndarray  # every op's deps, op after op
    cost: np.ndarray  # a compute op's cost, an index into cost_keys; -1 elsewhere
    cost_keys: dict[tuple[Any, ...], int]  # distinct (flops, nbytes, dtype, fused, fn, dims) -> index, by first use
    no_match: int = -1  # the first send or recv that names no other end (its id), or -1
    # ids of the sends and recvs given as tuples (a block's ends name each other by construction), to be checked
    loose: list[np.ndarray] = field(default_factory=list)
    # a kernel table's cost ids, by (the table's id, dtype, fused, fn)
    tables: dict[tuple[int, str, bool, str], tuple[Sequence[Any], np.ndarray]] = field(default_factory=dict)

    @staticmethod
    def empty(n: int, edges: int) -> Columns:
        """Columns of ``n`` ops with ``edges`` dependencies, to be filled (zeros: untouched pages cost nothing; a
        segment writes every op's ``match`` and ``cost``)."""
        return Columns(np.zeros(n, np.uint8), np.zeros(n, np.int32), np.empty(n, np.int32), np.zeros(n),
                       np.zeros(n), np.zeros(n), np.zeros(n, bool), np.zeros(n), np.zeros(n, np.int32),
                       np.zeros(edges, np.int32), np.empty(n, np.int32), {})

    def costs_of(self, kernels: Sequence[Kernel], dtype: str, fused: bool, fn: str) -> np.ndarray:
        """The cost id of each kernel of a table (once per table: lockstep steps share theirs)."""
        memo = (id(kernels), dtype, fused, fn)
        known = self.tables.get(memo)
        if known is None or known[0] is not kernels:
            keys = self.cost_keys
            ids = np.array([keys.setdefault((k[1], k[2], dtype, fused, fn, k[3]), len(keys)) for k in kernels],
                           dtype=np.int64)
            known = self.tables[memo] = (kernels, ids)
        return known[1]


@dataclass(eq=False)
class ComputeBlock:
    """Compute ops with consecutive ids from ``first``, the k-th on ``rank[k]`` running ``kernels[which[k]]``
    (name, FLOPs, bytes, dims) after ``dep_flat[dep_start[k]:dep_start[k + 1]]``, the other fields shared."""

    first: int
    rank: np.ndarray
    which: np.ndarray
    kernels: Sequence[Kernel]
    dep_start: np.ndarray
    dep_flat: np.ndarray
    dtype: str
    fn: str
    out: str
    args: tuple[str, ...]
    allocs: Sequence[tuple[tuple[str, float], ...]]  # the block's allocations: one for all, or a table
    fused: bool
    alloc_which: np.ndarray | None = None  # op k allocates allocs[alloc_which[k]] (None: allocs[0])

    def __len__(self) -> int:
        return len(self.rank)

    def take(self, js: np.ndarray) -> list[Op]:
        """The block's ops at offsets ``js`` as tuples."""
        kernels, dtype, fn, out, args, fused = self.kernels, self.dtype, self.fn, self.out, self.args, self.fused
        allocs = (repeat(self.allocs[0], len(js)) if self.alloc_which is None
                  else map(self.allocs.__getitem__, self.alloc_which[js].tolist()))
        return [compute_op(self.first + j, rank, k[0], d, k[1], k[2], dtype, fn, out, args, 0, -1, alloc, (), fused, "",
                           "compute", 0.0, k[3])
                for j, rank, k, d, alloc in zip(js.tolist(), self.rank[js].tolist(),
                                                map(kernels.__getitem__, self.which[js].tolist()),
                                                _gather(self.dep_start, self.dep_flat, js), allocs, strict=True)]

    def field(self, name: str, js: np.ndarray) -> list[Any]:
        """Field ``name`` of the ops at offsets ``js`` (a kernel's name and bytes off its table)."""
        if name in _KERNEL_FIELD:
            column = [k[_KERNEL_FIELD[name]] for k in self.kernels]
            return list(map(column.__getitem__, self.which[js].tolist()))
        if name == "rank":
            return self.rank[js].tolist()  # type: ignore[no-any-return]
        if name == "alloc":  # (a memory timeline's: no op made)
            return (list(repeat(self.allocs[0], len(js))) if self.alloc_which is None
                    else list(map(self.allocs.__getitem__, self.alloc_which[js].tolist())))
        if name == "free":
            return list(repeat((), len(js)))
        return [getattr(op, name) for op in self.take(js)]

    def edges(self) -> int:
        return len(self.dep_flat)

    def fill(self, cols: Columns, at: int) -> None:
        """Write the block's columns into ``cols`` (its deps from ``at`` in ``cols.parents``)."""
        ids = slice(self.first, self.first + len(self))
        cols.kind[ids] = KIND_INDEX["compute"]
        cols.rank[ids] = self.rank
        cols.match[ids] = -1
        cols.dep_count[ids] = np.diff(self.dep_start)
        cols.parents[at:at + len(self.dep_flat)] = self.dep_flat
        costs = cols.costs_of(self.kernels, self.dtype, self.fused, self.fn)
        cols.cost[ids] = costs[self.which]

    def shifted(self, ids: int, ranks: int) -> ComputeBlock:
        """The block with its op ids (its own and its deps') moved up by ``ids`` and its ranks by ``ranks``
        (:meth:`~simulator.schedule.core.Schedule.combine`); its tables are shared."""
        return dataclasses.replace(self, first=self.first + ids, rank=self.rank + ranks, dep_flat=self.dep_flat + ids)

    def holders(self) -> np.ndarray:
        held = np.array([bool(a) for a in self.allocs], dtype=bool)
        which = np.zeros(len(self), dtype=np.int64) if self.alloc_which is None else self.alloc_which
        return self.first + np.flatnonzero(held[which]) if len(held) else np.zeros(0, np.int64)


@dataclass(eq=False)
class TransferBlock:
    """Transfers with consecutive ids from ``first``: the k-th's send (id ``first + 2k``) on ``src[k]`` after its
    ``send`` deps, its recv (``first + 2k + 1``) on ``dst[k]`` after its ``recv`` deps, of ``nbytes[k]`` bytes, named
    ``names[name[k]]``; the other fields shared (as :meth:`~simulator.schedule.core.Schedule.add_transfers` gives
    them)."""

    first: int
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    names: Sequence[str]
    name: np.ndarray
    send_start: np.ndarray
    send_flat: np.ndarray
    recv_start: np.ndarray
    recv_flat: np.ndarray
    args: tuple[str, ...]
    dst_args: tuple[str, ...]
    alloc: tuple[tuple[str, float], ...]
    coll: str

    def __len__(self) -> int:
        return 2 * len(self.src)

    def take(self, js: np.ndarray) -> list[Op]:
        """The block's ops at offsets ``js`` (sends even, recvs odd) as tuples."""
        ks = transfer_of(js)
        recv = is_recv(js).astype(bool)
        sdeps = iter(_gather(self.send_start, self.send_flat, ks[~recv]))
        rdeps = iter(_gather(self.recv_start, self.recv_flat, ks[recv]))
        names, args, dargs, alloc, coll, first = self.names, self.args, self.dst_args, self.alloc, self.coll, self.first
        out: list[Op] = []
        for j, src, dst, size, name in zip(js.tolist(), self.src[ks].tolist(), self.dst[ks].tolist(),
                                           self.nbytes[ks].tolist(), map(names.__getitem__, self.name[ks].tolist()),
                                           strict=True):
            oid = first + j
            if is_recv(j):
                out.append(recv_op(oid, dst, name, next(rdeps), size, src, dargs, 0, -1, alloc, coll))
            else:
                out.append(send_op(oid, src, name, next(sdeps), size, dst, args, 0, -1, (), coll))
        return out

    def field(self, name: str, js: np.ndarray) -> list[Any]:
        """Field ``name`` of the ops at offsets ``js`` (a transfer's name and bytes off its columns)."""
        if name == "name":
            return list(map(self.names.__getitem__, self.name[transfer_of(js)].tolist()))
        if name == "nbytes":
            return self.nbytes[transfer_of(js)].tolist()  # type: ignore[no-any-return]
        if name == "rank":  # a send's on its source, a recv's on its destination
            return np.where(is_recv(js).astype(bool), self.dst[transfer_of(js)], self.src[transfer_of(js)]).tolist()
        if name == "alloc":  # a recv allocates the block's buffers, a send nothing (a memory timeline's: no op made)
            return [self.alloc if r else () for r in is_recv(js).tolist()]
        if name == "free":
            return list(repeat((), len(js)))
        return [getattr(op, name) for op in self.take(js)]

    def edges(self) -> int:
        return len(self.send_flat) + len(self.recv_flat)

    def fill(self, cols: Columns, at: int) -> None:
        """Write the block's columns into ``cols`` (its deps from ``at`` in ``cols.parents``)."""
        fill_transfers(self.first, self.src, self.dst, self.nbytes, self.send_start, self.send_flat, self.recv_start,
                       self.recv_flat, at, cols.kind, cols.rank, cols.match, cols.nbytes, cols.dep_count,
                       cols.parents, cols.cost, _SEND, _RECV)
        if self.coll:
            cols.coll[self.first:self.first + len(self):2] = True

    def shifted(self, ids: int, ranks: int) -> TransferBlock:
        """The block with its op ids (its own and its deps') moved up by ``ids`` and its ranks by ``ranks``."""
        return dataclasses.replace(self, first=self.first + ids, src=self.src + ranks, dst=self.dst + ranks,
                                   send_flat=self.send_flat + ids, recv_flat=self.recv_flat + ids)

    def holders(self) -> np.ndarray:
        return (recv_of(transfer_send(self.first, np.arange(len(self) // 2, dtype=np.int64))) if self.alloc
                else np.zeros(0, np.int64))


_DEFAULTS = {"name": "", **Op._field_defaults}  # a field an OpBlock does not give
_OWN = frozenset({"id", "rank", "kind", "deps", "peer", "match"})  # OpBlock's own columns; the rest are its fields


def _values(value: Any, js: np.ndarray) -> Iterable[Any]:
    """A field's values at offsets ``js``: a shared value repeated, an array's entries, an Indexed's table entries."""
    if isinstance(value, Indexed):
        return map(value.table.__getitem__, value.which[js].tolist())
    if isinstance(value, np.ndarray):
        return value[js].tolist()
    return repeat(value, len(js))


@dataclass(eq=False)
class OpBlock:
    """Ops of any kinds with consecutive ids from ``first``, a column per field: the k-th is a ``OP_KINDS[kind[k]]``
    on ``rank[k]`` after ``dep_flat[dep_start[k]:dep_start[k + 1]]`` (earlier ops, of the block or before it); a send
    or recv's other end is ``match[k]`` (an op of the block; -1 on other kinds), its peer that end's rank. Every other
    :class:`~simulator.schedule.op.Op` field is in ``fields``: a value all the ops share, an array (one per op) or an
    :class:`Indexed`; a field not given has its default. For builders whose steps interleave kinds (a tree's
    pipeline: a send up, its recv, the parent's reduction, rank after rank), so that a block keeps their op order."""

    first: int
    kind: np.ndarray
    rank: np.ndarray
    dep_start: np.ndarray
    dep_flat: np.ndarray
    match: np.ndarray
    fields: dict[str, Any]

    def __len__(self) -> int:
        return len(self.rank)

    def field(self, name: str, js: np.ndarray) -> list[Any]:
        """Field ``name`` of the ops at offsets ``js``."""
        if name == "id":
            return (self.first + js).tolist()
        if name == "rank":
            return self.rank[js].tolist()
        if name == "kind":
            return list(map(OP_KINDS.__getitem__, self.kind[js].tolist()))
        if name == "deps":
            return _gather(self.dep_start, self.dep_flat, js)
        if name in ("peer", "match"):
            mate = self.match[js]
            vals = (self.rank[np.maximum(mate - self.first, 0)] if name == "peer" else mate).tolist()
            return [v if m >= 0 else None for v, m in zip(vals, mate.tolist(), strict=True)]
        return list(_values(self.fields.get(name, _DEFAULTS[name]), js))

    def numbers(self, name: str, js: np.ndarray, dtype: type) -> np.ndarray:
        """Field ``name`` of the ops at offsets ``js`` as an array of ``dtype`` (``bool``: whether each is set)."""
        value = self.fields.get(name, _DEFAULTS[name])
        if isinstance(value, np.ndarray):
            if dtype is bool and value.dtype.kind not in "biuf":  # strings: whether each is set
                return np.fromiter(map(bool, value[js].tolist()), dtype=bool, count=len(js))
            return value[js].astype(dtype, copy=False)
        if isinstance(value, Indexed):
            return np.array([dtype(v) for v in value.table], dtype=dtype)[value.which[js]]
        return np.full(len(js), dtype(value), dtype=dtype)

    def take(self, js: np.ndarray) -> list[Op]:
        """The block's ops at offsets ``js`` as tuples."""
        return [Op._make(t) for t in zip(*(self.field(name, js) for name in Op._fields), strict=True)]

    def edges(self) -> int:
        return len(self.dep_flat)

    def fill(self, cols: Columns, at: int) -> None:
        """Write the block's columns into ``cols`` (its deps from ``at`` in ``cols.parents``)."""
        m = len(self)
        ids = slice(self.first, self.first + m)
        cols.kind[ids] = self.kind
        cols.rank[ids] = self.rank
        cols.match[ids] = self.match
        cols.dep_count[ids] = np.diff(self.dep_start)
        cols.parents[at:at + len(self.dep_flat)] = self.dep_flat
        cols.not_before[ids] = self.numbers("not_before_s", np.arange(m), float)
        sends = np.flatnonzero(self.kind == _SEND)
        cols.nbytes[self.first + sends] = self.numbers("nbytes", sends, float)
        cols.rate_cap[self.first + sends] = self.numbers("rate_cap", sends, float)
        cols.coll[self.first + sends] = self.numbers("coll", sends, bool)
        floored = np.flatnonzero((self.kind == _SEND) | (self.kind == KIND_INDEX["launch"]))
        cols.floor[self.first + floored] = self.numbers("floor_s", floored, float)
        comp = np.flatnonzero(self.kind <= _MERGE)
        keys = cols.cost_keys
        cost = np.full(m, -1, dtype=np.int64)
        # one key per group of ops with the same cost columns, read off the group's first op (or one per op)
        firsts, inverse = self._cost_groups(comp) or (comp, np.arange(len(comp)))
        ids_of = np.fromiter(map(keys.setdefault, zip(*(self.field(f, firsts) for f in _COST_FIELDS), strict=True),
                                 _NextIndex(keys)), dtype=np.int64, count=len(firsts))
        cost[comp] = ids_of[inverse]
        cols.cost[ids] = cost

    def _cost_groups(self, comp: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The ops ``comp`` grouped by their cost columns (equal numbers, the same entry of a table), the groups in
        order of first op: (each group's first op, each op's group). Ops in different groups may still have equal
        costs (two entries of a table that are equal): the keys they give then coincide, as they would op by op.
        None where a column is not plain numbers or table entries (or holds a NaN, which is no key's equal)."""
        group = np.zeros(len(comp), np.int64)
        for name in _COST_FIELDS:
            value = self.fields.get(name, _DEFAULTS[name])
            if isinstance(value, Indexed):
                code = np.asarray(value.which)[comp].astype(np.int64, copy=False)
            elif isinstance(value, np.ndarray):
                col = value[comp]
                if col.dtype.kind not in "biuf" or (col.dtype.kind == "f" and np.isnan(col).any()):
                    return None
                code = factorize(col)
            else:
                continue
            # the columns' codes combined, numbered again by first op (hashing, no sort) so that they stay small
            group = factorize(group * (int(code.max(initial=0)) + 1) + code)
        new = np.ones(len(group), dtype=bool)  # numbered by first op: a group's first op raises the running max
        new[1:] = group[1:] > np.maximum.accumulate(group)[:-1]
        return comp[new], group

    def shifted(self, ids: int, ranks: int) -> OpBlock:
        """The block with its op ids (its own, its deps' and its ends' matches) moved up by ``ids`` and its ranks
        (a rooted collective's ``root`` too) by ``ranks``."""
        fields = dict(self.fields)
        if fields.get("root") is not None:
            fields["root"] = _shift_root(fields["root"], ranks)
        return OpBlock(self.first + ids, self.kind, self.rank + ranks, self.dep_start, self.dep_flat + ids,
                       np.where(self.match >= 0, self.match + ids, self.match), fields)

    def holders(self) -> np.ndarray:
        held = self._truthy("alloc") | self._truthy("free")
        return self.first + np.flatnonzero(held)

    def _truthy(self, name: str) -> np.ndarray:
        """Whether field ``name`` of each op is set (a table's entries tested once each)."""
        value, m = self.fields.get(name, _DEFAULTS[name]), len(self)
        if isinstance(value, Indexed):
            table = np.fromiter(map(bool, value.table), dtype=bool, count=len(value.table))
            return table[value.which] if m else np.zeros(0, bool)
        if isinstance(value, np.ndarray):
            return np.fromiter(map(bool, value.tolist()), dtype=bool, count=m)
        return np.full(m, bool(value))

    def check(self) -> None:
        """Refuse a block whose columns are not one entry per op, whose deps name a later op (or none), or whose
        transfer ends do not name each other (its ranks are the schedule's to check)."""
        m = len(self)
        if not (len(self.kind) == len(self.match) == m and _csr_ok(self.dep_start, self.dep_flat, m)):
            raise ValueError("a block's columns are not one entry per op (or its deps not CSR)")
        for name, value in self.fields.items():
            if name in _OWN or name not in _DEFAULTS:
                raise ValueError(f"a block's field {name!r} is not one of Op's (or is a column of its own)")
            if isinstance(value, list):
                raise ValueError(f"a block's field {name!r} is a list: give one value for all (a tuple for tuple "
                                 f"fields), an array (one per op) or an Indexed")
            per_op = value.which if isinstance(value, Indexed) else value if isinstance(value, np.ndarray) else None
            if per_op is not None and (per_op.ndim != 1 or len(per_op) != m):
                raise ValueError(f"a block's field {name!r} does not have one entry per op")
            if isinstance(value, Indexed) and m and (value.which.dtype.kind not in "iu" or value.which.min() < 0
                                                     or value.which.max() >= len(value.table)):
                raise ValueError(f"a block's field {name!r} indexes outside its table (or not by integers)")
        if not m:
            return
        if self.kind.max() >= len(OP_KINDS):
            raise ValueError("a block's op of an unknown kind")
        own = np.repeat(np.arange(self.first, self.first + m), np.diff(self.dep_start))
        if len(self.dep_flat) and (self.dep_flat.min() < 0 or (self.dep_flat >= own).any()):
            raise ValueError("a dependency does not name an earlier op")
        ends = (self.kind == _SEND) | (self.kind == _RECV)
        mate = self.match - self.first
        if (self.match[~ends] != -1).any() or ((mate[ends] < 0) | (mate[ends] >= m)).any():
            raise ValueError("a block's send or recv does not name its other end in the block")
        k = np.flatnonzero(ends)
        if (mate[mate[k]] != k).any() or (self.kind[mate[k]] == self.kind[k]).any() or (
                self.rank[mate[k]] == self.rank[k]).any():
            raise ValueError("a block's transfer ends do not name each other (a send and a recv on two ranks)")
        sends = np.flatnonzero(self.kind == _SEND)
        if len(sends) and min(self.field("nbytes", sends)) < 0:
            raise ValueError("a block's transfer of negative size")


Block = ComputeBlock | TransferBlock | OpBlock


def _shift_root(value: Any, ranks: int) -> Any:
    """An OpBlock's ``root`` field (one rank for all, one per op, or one of a table; None where not rooted) with
    its ranks moved up by ``ranks``."""
    def one(r: Any) -> Any:
        return None if r is None else r + ranks
    if isinstance(value, Indexed):
        return Indexed([one(r) for r in value.table], value.which)
    if isinstance(value, np.ndarray):
        return value + ranks if value.dtype.kind in "iu" else np.array([one(r) for r in value.tolist()],
                                                                        dtype=value.dtype)
    return one(value)


def _shifted_ops(ops: list[Op], ids: int, ranks: int) -> list[Op]:
    """Op tuples with their ids (their own, their deps' and matches) moved up by ``ids`` and their ranks (peers and
    roots too) by ``ranks``: ``op._replace`` of each, without its keyword machinery."""
    new = tuple.__new__
    return [new(Op, (op[0] + ids, op[1] + ranks, op[2], op[3], tuple([d + ids for d in op[4]]) if op[4] else (),
                     op[5], op[6], op[7], None if op[8] is None else op[8] + ranks,
                     None if op[9] is None else op[9] + ids, *op[10:20], None if op[20] is None else op[20] + ranks,
                     *op[21:]))
            for op in ops]


def _list_fill(ops: list[Op], first: int, cols: Columns, at: int, deps_of: list[tuple[int, ...]]) -> None:
    """A segment of op tuples' columns written into ``cols`` (C-level passes over the tuples)."""
    n = len(ops)
    ids = slice(first, first + n)
    kind = np.fromiter(map(KIND_INDEX.__getitem__, map(_KIND, ops)), dtype=np.uint8, count=n)
    cols.kind[ids] = kind
    cols.match[ids], cols.cost[ids] = -1, -1
    rank = np.fromiter(map(_RANK, ops), dtype=np.int64, count=n)
    if n and (rank.min() < 0 or rank.max() > _ID_MAX):
        raise ValueError(f"op {first + int(np.argmax((rank < 0) | (rank > _ID_MAX)))} has a rank out of range")
    cols.rank[ids] = rank
    ends = np.flatnonzero((kind == _SEND) | (kind == _RECV))
    cols.loose.append(first + ends)
    mates = list(map(_MATCH, map(ops.__getitem__, ends.tolist())))
    if None in mates:
        if cols.no_match < 0:
            cols.no_match = first + int(ends[mates.index(None)])
    else:
        mate = np.array(mates, dtype=np.int64)
        mate[(mate < 0) | (mate >= len(cols.match))] = -1  # names no op: the engine says so
        cols.match[first + ends] = mate
    sends = np.flatnonzero(kind == _SEND)
    send_ops = list(map(ops.__getitem__, sends.tolist()))
    cols.nbytes[first + sends] = np.fromiter(map(_NBYTES, send_ops), dtype=float, count=len(sends))
    cols.rate_cap[first + sends] = np.fromiter(map(_RATE_CAP, send_ops), dtype=float, count=len(sends))
    cols.coll[first + sends] = np.fromiter(map(bool, map(_COLL, send_ops)), dtype=bool, count=len(sends))
    floored = np.flatnonzero((kind == _SEND) | (kind == KIND_INDEX["launch"]))
    cols.floor[first + floored] = np.fromiter(map(_FLOOR, map(ops.__getitem__, floored.tolist())), dtype=float,
                                              count=len(floored))
    cols.not_before[ids] = np.fromiter(map(_NOT_BEFORE, ops), dtype=float, count=n)
    comp = np.flatnonzero(kind <= _MERGE)
    keys = cols.cost_keys
    cols.cost[first + comp] = np.fromiter(map(keys.setdefault, map(COST, map(ops.__getitem__, comp.tolist())),
                                              _NextIndex(keys)), dtype=np.int64, count=len(comp))
    counts = np.fromiter(map(len, deps_of), dtype=np.int64, count=n)
    cols.dep_count[ids] = counts
    total = int(counts.sum())
    parents = np.fromiter(chain.from_iterable(deps_of), dtype=np.int64, count=total)
    if total and (parents.min() < 0 or parents.max() > _ID_MAX):
        raise ValueError("a dependency does not name an op of the schedule")
    cols.parents[at:at + total] = parents


class _NextIndex:
    """Yields ``len(keys)`` each time: the index a key not yet in ``keys`` gets (setdefault ignores it otherwise)."""

    def __init__(self, keys: dict[Any, int]) -> None:
        self.keys = keys

    def __iter__(self) -> _NextIndex:
        return self

    def __next__(self) -> int:
        return len(self.keys)


class OpList(Sequence[Op]):
    """The ops of a schedule, by id: segments of op tuples and blocks (a sequence of :class:`Op` to its readers)."""

    def __init__(self, ops: Iterable[Op] = ()) -> None:
        self._segs: list[list[Op] | Block] = []
        self._starts: list[int] = []
        self._n = 0
        self.extend(list(ops))

    def __len__(self) -> int:
        return self._n

    def _tail(self) -> list[Op]:
        if not self._segs or not isinstance(self._segs[-1], list):
            self._segs.append([])
            self._starts.append(self._n)
        tail = self._segs[-1]
        assert isinstance(tail, list)
        return tail

    def append(self, op: Op) -> None:
        self._tail().append(op)
        self._n += 1

    def extend(self, ops: Iterable[Op]) -> None:
        ops = ops if isinstance(ops, list) else list(ops)
        if ops:
            self._tail().extend(ops)
            self._n += len(ops)

    def add_block(self, block: Block) -> None:
        """Append a block (its ``first`` must be the next id; its columns are checked for their lengths and CSR
        bounds, as the engine's compiled passes read them unchecked)."""
        if block.first != self._n:
            raise ValueError(f"a block of ops from id {block.first}, where the next id is {self._n}")
        if isinstance(block, OpBlock):
            block.check()  # its columns, deps and ends (Schedule.add_ops checks its ranks)
            m, shaped, spans = len(block), True, []
        elif isinstance(block, ComputeBlock):
            m = len(block.rank)
            shaped = len(block.which) == m and (block.alloc_which is None or len(block.alloc_which) == m)
            spans = [(block.dep_start, block.dep_flat)]
        else:
            m = len(block.src)
            shaped = len(block.dst) == len(block.nbytes) == len(block.name) == m
            spans = [(block.send_start, block.send_flat), (block.recv_start, block.recv_flat)]
        if not shaped or not all(_csr_ok(starts, flat, m) for starts, flat in spans):
            raise ValueError("a block's columns are not one entry per op (or its deps not CSR)")
        if len(block):
            self._segs.append(block)
            self._starts.append(self._n)
            self._n += len(block)

    def _find(self, i: int) -> tuple[int, int]:
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("op index out of range")
        s = bisect_right(self._starts, i) - 1
        return s, i - self._starts[s]

    @overload
    def __getitem__(self, i: int) -> Op: ...
    @overload
    def __getitem__(self, i: slice) -> list[Op]: ...

    def __getitem__(self, i: int | slice) -> Op | list[Op]:
        if isinstance(i, slice):
            return self.take(np.arange(*i.indices(self._n), dtype=np.int64))
        s, j = self._find(i)
        seg = self._segs[s]
        return seg[j] if isinstance(seg, list) else seg.take(np.array([j]))[0]

    def take(self, ids: Sequence[int] | np.ndarray) -> list[Op]:
        """The ops of ``ids``, in that order, as tuples (a block's made together: cheaper than one at a time)."""
        return self._gather(ids, lambda seg, local: (list(map(seg.__getitem__, local.tolist()))
                                                     if isinstance(seg, list) else seg.take(local)))

    def field(self, name: str, ids: Sequence[int] | np.ndarray) -> list[Any]:
        """Field ``name`` (an :class:`Op` field) of the ops of ``ids``, in that order, without making the ops where
        a block holds it as a column or a table (a timeline's names and bytes)."""
        if name not in Op._fields:
            raise ValueError(f"ops have no field {name!r}")
        return self._gather(ids, lambda seg, local: ([getattr(seg[j], name) for j in local.tolist()]
                                                     if isinstance(seg, list) else seg.field(name, local)))

    def _gather(self, ids: Sequence[int] | np.ndarray, get: Callable[[Any, np.ndarray], list[Any]]) -> list[Any]:
        """``get(segment, offsets)`` for the ids of each segment, put back in the order of ``ids``."""
        idx = np.asarray(ids)
        if len(idx) and idx.dtype.kind not in "iu":
            raise TypeError(f"op indices must be integers, not {idx.dtype}")
        idx = idx.astype(np.int64, copy=False)
        if len(idx) and (idx.min() < -self._n or idx.max() >= self._n):
            raise IndexError("op index out of range")
        idx = np.where(idx < 0, idx + self._n, idx)
        seg_of = np.searchsorted(np.array(self._starts, dtype=np.int64), idx, side="right") - 1
        by_seg = np.argsort(seg_of, kind="stable")  # the ids grouped by segment
        cuts = np.flatnonzero(np.diff(seg_of[by_seg])) + 1
        out: list[Any] = [None] * len(idx)
        for where in np.split(by_seg, cuts) if len(idx) else ():
            s = int(seg_of[where[0]])
            got = get(self._segs[s], idx[where] - self._starts[s])
            for w, value in zip(where.tolist(), got, strict=True):
                out[w] = value
        return out

    def __setitem__(self, i: int, op: Op) -> None:
        if not isinstance(i, int | np.integer):
            raise TypeError("ops are replaced one at a time (no slice assignment)")
        s, j = self._find(int(i))
        seg = self._segs[s]
        if not isinstance(seg, list):  # a block's ops become tuples to change one
            seg = self._segs[s] = seg.take(np.arange(len(seg)))
        seg[j] = op

    def append_shifted(self, other: OpList, ids: int, ranks: int) -> None:
        """Append ``other``'s ops with their ids moved up by ``ids`` (``len(self)``: they follow on) and their ranks
        by ``ranks``: each block shifted as columns, each run of tuples op by op (what ``Schedule.combine`` does)."""
        if ids != self._n:
            raise ValueError(f"ops moved to ids from {ids}, where the next id is {self._n}")
        for seg in other._segs:
            if isinstance(seg, list):
                self.extend(seg if ids == ranks == 0 else _shifted_ops(seg, ids, ranks))
            elif len(seg):
                self._segs.append(seg if ids == ranks == 0 else seg.shifted(ids, ranks))
                self._starts.append(self._n)
                self._n += len(seg)

    def __iter__(self) -> Iterator[Op]:
        for seg in self._segs:
            yield from (seg if isinstance(seg, list) else seg.take(np.arange(len(seg))))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, list | OpList):  # as a list: equal to a list (or an OpList) of the same ops
            return NotImplemented
        return len(self) == len(other) and all(map(eq, self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"OpList({len(self)} ops in {len(self._segs)} segments)"

    def columns(self) -> Columns:
        """Every op's engine fields as arrays by op id (blocks' read off their arrays, tuples' by C-level passes)."""
        deps = {s: list(map(_DEPS, seg)) for s, seg in enumerate(self._segs) if isinstance(seg, list)}
        edges = [sum(map(len, deps[s])) if s in deps else seg.edges()  # type: ignore[union-attr]
                 for s, seg in enumerate(self._segs)]
        cols = Columns.empty(self._n, sum(edges))
        at = 0
        for s, (seg, start) in enumerate(zip(self._segs, self._starts, strict=True)):
            if isinstance(seg, list):
                _list_fill(seg, start, cols, at, deps.pop(s))
            else:
                seg.fill(cols, at)
            at += edges[s]
        cols.tables.clear()
        return cols

    def holders(self) -> list[int]:
        """Ids of the ops that allocate or free buffers, in op-id order."""
        out: list[int] = []
        for seg, start in zip(self._segs, self._starts, strict=True):
            if isinstance(seg, list):
                ids = set(compress(range(start, start + len(seg)), map(_ALLOC, seg)))
                ids.update(compress(range(start, start + len(seg)), map(_FREE, seg)))
                out += sorted(ids)
            else:
                out += seg.holders().tolist()
        return out
