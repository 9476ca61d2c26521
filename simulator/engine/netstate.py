"""The flow network as one compiled object (numba ``structref``): :mod:`simulator.engine.flowcore`'s arrays with
the bookkeeping around them (free slots, private cap links, the arrays' growth, the next finish), so that compiled
code, the engine's event loop (:mod:`simulator.engine.eventcore`), can start, finish and re-rate flows without
returning to Python. :class:`simulator.engine.network.FlowNetwork` is its Python face.

A flow lives in a *slot* (its column in the arrays): :func:`net_add` takes the lowest free slot (a finished flow's
slot is reused first, last freed first) and returns it; :func:`net_remove` frees it. Arrays grow by doubling (slots,
links, the finish heap, the fresh list) and a route longer than the slots' width re-lays the incidence lists out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numba import types
from numba.experimental import structref

from simulator.engine import flowcore as fc
from simulator.engine.borrow import borrow as _b
from simulator.support.arraycopy import put1, put2
from simulator.support.jitcache import njit

__all__ = ["NET_STATE", "NetState", "net_add", "net_allocate", "net_allocations", "net_capacity", "net_load",
           "net_new", "net_next", "net_rate", "net_remove"]


@structref.register
class NetStateType(types.StructRef):
    def preprocess_fields(self, fields: tuple[tuple[str, types.Type], ...]) -> tuple[tuple[str, types.Type], ...]:
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class NetState(structref.StructRefProxy):
    """A compiled flow network's state (read and changed only by the compiled functions of this module)."""

    if TYPE_CHECKING:  # its fields, as the compiled functions see them
        def __getattr__(self, name: str) -> Any: ...

        def __setattr__(self, name: str, value: Any) -> None: ...


_I, _F, _B = types.int64, types.float64, types.boolean
_I1, _F1, _I2, _F2 = _I[::1], _F[::1], _I[:, ::1], _F[:, ::1]  # contiguous arrays, 1 and 2 dimensions
_FIELDS: tuple[tuple[str, types.Type], ...] = (  # declared: compiled code can be compiled for the state's type ahead
    ("li", _I2), ("lf", _F2), ("marks", _I2), ("si", _I2), ("sf", _F2), ("route", _I2), ("wts", _F2),  # flowcore's
    ("inc", _I2), ("fresh", _I1), ("ek", _F1), ("ev", _I1), ("es", _I1), ("sc", _I1),  # arrays
    ("free", _I1), ("nfree", _I),  # a stack of free slots (the lowest on top at first)
    ("spare", _I1), ("nspare", _I),  # a stack of private cap links no flow holds
    ("nlinks", _I), ("added", _I), ("eta_size", _I), ("dirty", _B), ("has_next", _B), ("active", _I),
    ("allocations", _I), ("next_when", _F), ("due", _I1), ("unweighted", _F1),
    ("work", _I1), ("fwork", _F1),  # scratch room for the allocations (flowcore.work_size), kept between them
)
structref.define_proxy(NetState, NetStateType, [name for name, _ in _FIELDS])
NET_STATE = NetStateType(_FIELDS)  # the type net_new returns (a test holds them equal)


@njit(cache=True, inline="always")
def _new_links(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    li = np.zeros((fc.NLI, size), np.int64)
    li[fc.HEAD, :] = -1
    li[fc.TEPOCH, :] = -1
    return li, np.zeros((fc.NLF, size)), np.zeros((2, size), np.int64)


@njit(cache=True)
def net_new(capacity: np.ndarray) -> NetState:
    """A network of ``len(capacity)`` links (bytes/s each) and no flow."""
    n = len(capacity)
    li, lf, marks = _new_links(max(64, 2 * n))
    put1(lf[fc.CAP], capacity, n)
    maxr = 8
    net = NetState(li, lf, marks, np.zeros((fc.NSI, 0), np.int64), np.zeros((fc.NSF, 0)),
                   np.zeros((0, maxr), np.int64), np.ones((0, maxr)), np.full((2, 0), -1, np.int64),
                   np.zeros(0, np.int64), np.zeros(256), np.zeros(256, np.int64), np.zeros(256, np.int64),
                   np.zeros(fc.NSC, np.int64), np.zeros(0, np.int64), 0, np.zeros(16, np.int64), 0,
                   n, 0, 0, False, False, 0, 0, np.inf, np.zeros(0, np.int64), np.ones(0), np.zeros(0, np.int64),
                   np.zeros(0))
    _grow_slots(net, 64)
    return net


@njit(cache=True, inline="always")
def _grow_links(net: NetState, size: int) -> None:
    li, lf, marks = _new_links(size)
    put2(li, net.li)
    put2(lf, net.lf)
    put2(marks, net.marks)
    net.li, net.lf, net.marks = li, lf, marks


@njit(cache=True, inline="always")
def _grow_slots(net: NetState, size: int) -> None:
    old = net.si.shape[1]
    maxr = net.route.shape[1]
    si = np.zeros((fc.NSI, size), np.int64)
    put2(si, net.si)
    sf = np.zeros((fc.NSF, size))
    put2(sf, net.sf)
    route = np.zeros((size, maxr), np.int64)
    put2(route, net.route)
    wts = np.ones((size, maxr))
    put2(wts, net.wts)
    inc = np.full((2, size * maxr), -1, np.int64)
    put2(inc, net.inc)
    fresh = np.zeros(max(size + 1, len(net.fresh)), np.int64)
    put1(fresh, net.fresh, len(net.fresh))
    net.si, net.sf, net.route, net.wts, net.inc, net.fresh = si, sf, route, wts, inc, fresh
    free = np.zeros(net.nfree + size - old, np.int64)
    put1(free, net.free, net.nfree)
    for i in range(size - old):  # popped from the top: the lowest new slot first
        free[net.nfree + i] = size - 1 - i
    net.free = free
    net.nfree += size - old


@njit(cache=True, inline="always")
def _grow_route(net: NetState, length: int) -> None:
    maxr = net.route.shape[1]
    new = max(length, 2 * maxr)
    net.inc = fc.relayout(net.li, net.inc, maxr, new)
    route = np.zeros((net.route.shape[0], new), np.int64)
    put2(route, net.route)
    wts = np.ones((net.wts.shape[0], new))
    put2(wts, net.wts)
    net.route, net.wts = route, wts


@njit(cache=True, inline="always")
def _grow_eta(net: NetState, size: int) -> None:
    old = len(net.ek)
    ek, ev, es = np.zeros(size), np.zeros(size, np.int64), np.zeros(size, np.int64)
    put1(ek, net.ek, old)
    put1(ev, net.ev, old)
    put1(es, net.es, old)
    net.ek, net.ev, net.es = ek, ev, es


@njit(cache=True)
def net_add(net: NetState, key: int, links: np.ndarray, weights: np.ndarray, weighted: bool, nbytes: float,
            now: float, cap: float) -> int:
    """Start draining flow ``key`` over ``links`` at ``now`` (rate 0 until the next allocation); ``cap`` > 0: at
    most that many bytes/s (a private link of that capacity ends its route); ``weighted``: ``weights[i]`` bytes of
    link i's capacity per byte. Returns the flow's slot. (Link ids are not checked: the caller does.)"""
    kind = fc.WEIGHTED if weighted else 0
    if net.nfree == 0:
        _grow_slots(net, 2 * net.si.shape[1])
    n = len(links) + (1 if cap > 0.0 else 0)
    if n > net.route.shape[1]:
        _grow_route(net, n)
    net.nfree -= 1
    slot = net.free[net.nfree]
    private = -1
    if cap > 0.0:
        if net.nspare > 0:
            net.nspare -= 1
            private = net.spare[net.nspare]
        else:
            private = net.nlinks
            if private >= net.li.shape[1]:
                _grow_links(net, 2 * net.li.shape[1])
            net.nlinks += 1
        kind |= fc.CAPPED if weighted else fc.CAPPED | fc.CAPPED_PLAIN
    else:
        cap = 0.0
    net.added += 1
    if net.added >= len(net.fresh):  # (a slot may be listed again after a reuse)
        fresh = np.zeros(2 * len(net.fresh), np.int64)
        put1(fresh, net.fresh, len(net.fresh))
        net.fresh = fresh
    fc.add(slot, _b(links), _b(weights), private, kind, key, nbytes, now, cap, _b(net.li), _b(net.lf), _b(net.si),
           _b(net.sf), _b(net.route), _b(net.wts), _b(net.inc), _b(net.marks), _b(net.fresh), _b(net.sc))
    net.active += 1
    net.has_next = False
    net.dirty = True
    return slot


@njit(cache=True)
def net_remove(net: NetState, slot: int) -> None:
    """Stop the flow in ``slot`` (finished); the flows it shared links with get new rates at the next allocation."""
    route = net.route
    private = route[slot, net.si[fc.RLEN, slot] - 1] if net.si[fc.KIND, slot] & fc.CAPPED else -1
    fc.remove(slot, _b(net.li), _b(net.lf), _b(net.si), _b(net.sf), _b(route), _b(net.inc), _b(net.marks), _b(net.sc))
    if net.nfree >= len(net.free):
        free = np.zeros(2 * len(net.free) + 16, np.int64)
        put1(free, net.free, net.nfree)
        net.free = free
    net.free[net.nfree] = slot
    net.nfree += 1
    net.active -= 1
    net.has_next = False
    net.dirty = True
    if private >= 0:
        if net.nspare >= len(net.spare):
            spare = np.zeros(2 * len(net.spare), np.int64)
            put1(spare, net.spare, net.nspare)
            net.spare = spare
        net.spare[net.nspare] = private
        net.nspare += 1


@njit(cache=True, inline="always")
def _work(net: NetState) -> None:
    """Scratch room for an allocation (or a finish prediction) as the arrays are now (grown by half again)."""
    ints, floats = fc.work_size(net.li, net.si, net.inc, net.ek)
    if len(net.work) < ints:
        net.work = np.empty(ints + ints // 2, np.int64)
    if len(net.fwork) < floats:
        net.fwork = np.empty(floats + floats // 2)


@njit(cache=True)
def net_allocate(net: NetState, now: float, want_changed: bool) -> tuple[bool, np.ndarray]:
    """Re-rate the flows around the links touched since the last call (max-min, one connected component at a
    time). Returns whether flows came or went since then, and the links whose load may have changed (empty unless
    ``want_changed``)."""
    if not net.dirty:
        return False, np.empty(0, np.int64)
    net.dirty = False
    if net.eta_size + net.active >= len(net.ek):  # room for a new finish of every flow
        _grow_eta(net, 2 * (net.eta_size + net.active) + 16)
    _work(net)
    did, changed, when, due, eta_size = fc.allocate(now, want_changed, _b(net.li), _b(net.lf), _b(net.si),
                                                    _b(net.sf), _b(net.route), _b(net.wts), _b(net.inc),
                                                    _b(net.marks), _b(net.fresh), _b(net.ek), _b(net.ev), _b(net.es),
                                                    _b(net.sc), _b(net.work), _b(net.fwork))
    net.eta_size = eta_size
    net.added = 0
    net.next_when = when
    net.due = due
    net.has_next = True
    if did:
        net.allocations += 1
    return did, changed


@njit(cache=True)
def net_next(net: NetState) -> tuple[float, np.ndarray]:
    """Earliest predicted finish and the keys of the flows due then, in key order (``(inf, [])`` when idle)."""
    if not net.has_next:
        _work(net)
        when, due = fc.next_finish(_b(net.si), _b(net.ek), _b(net.ev), _b(net.es), _b(net.sc), _b(net.work))
        net.next_when = when
        net.due = due
        net.has_next = True
    return net.next_when, net.due


@njit(cache=True)
def net_load(net: NetState, link: int) -> float:
    """Bytes/s of ``link``'s capacity in use (0 for a link not in use)."""
    if not 0 <= link < net.nlinks:
        return 0.0
    return fc.load(link, net.li, net.sf, net.wts, net.inc, net.route.shape[1])


@njit(cache=True)
def net_rate(net: NetState, slot: int) -> float:
    """Bytes/s the flow in ``slot`` drains at (as of the last allocation)."""
    return net.sf[fc.RATE, slot]


@njit(cache=True)
def net_capacity(net: NetState) -> np.ndarray:
    """Bytes/s of every link in use (the private cap links after the given ones)."""
    return net.lf[fc.CAP, :net.nlinks].copy()


@njit(cache=True)
def net_allocations(net: NetState) -> int:
    """Allocations that re-rated flows."""
    return net.allocations
