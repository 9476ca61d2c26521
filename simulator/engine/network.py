"""Flow-level network model: max-min fair rates by progressive filling (no simpy here).

Each active flow drains over a fixed set of directed links at its max-min fair rate: repeatedly take the link with
the smallest fair share ``remaining capacity / unfrozen flows``, freeze its flows at that share, and subtract it
from every other link they cross (Bertsekas & Gallager, *Data Networks*, Sec. 6.5.2). With a heap keyed by share
this costs O(sum of route lengths x log links); it stops once every flow has its rate.

Rates of flows that share no link, directly or through other flows, are independent, so a change (flows starting
or finishing) only re-runs the filling on the connected components of flows around the links it touched, each on
its own (a flow alone on its links simply gets its narrowest link, as most of a ring's flows do); the links'
flow counts are kept per link. Progress is lazy: a flow's remaining bytes are brought up to date only when its rate
changes; a heap of predicted finish times gives the next completion.

:class:`FlowNetwork` keeps its flows and links in arrays and runs that work compiled
(:mod:`simulator.engine.flowcore`, numba): a reallocation over a few hundred flows costs microseconds. Its filling
pops links in the order :func:`_fill` (the reference, :func:`max_min_rates`) does, with the same floating-point
operations, so an unweighted component's rates are the reference's floats exactly.

A flow may carry a rate cap (bytes/s): a private virtual link of that capacity that only it crosses. Progressive
filling over it is max-min fairness with a per-flow upper bound, exactly (the cap is one more constraint; a capped
flow frees what it cannot use for the flows it shares links with). A communication library's per-channel
bandwidth limits (NCCL's ``perChMax*Bw``, :mod:`simulator.collectives.caps`) are such caps.

A flow may also load some of its links more than once per byte: ``weights``, one per link of its route, say how
many bytes of a link's capacity one byte of the flow uses (a loopback transport whose cost per byte depends on the
message size, :mod:`simulator.cluster.size_curve`). Progressive filling then raises every unfrozen flow's rate
together and freezes the flows of the first link whose remaining capacity their weighted rates use up (max-min
fairness in the flows' rates, each link's use the weighted sum); a component with no weighted flow is filled by the
unweighted code, so its floats do not change.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from simulator.engine import flowcore as fc

__all__ = ["FlowNetwork", "load_compiled", "max_min_rates"]

F = TypeVar("F", bound=Hashable)  # a flow's key
Weights = tuple[float, ...] | None  # per link of a route (without the cap link): bytes of capacity per byte
ROUTES_KEPT = 1 << 16  # routes kept as arrays (all forgotten at once when full)


def max_min_rates(routes: Mapping[Hashable, Sequence[int]], capacity: Sequence[float]) -> dict[Hashable, float]:
    """Max-min fair rate (bytes/s) of every flow; ``routes[f]`` lists link ids, ``capacity[l]`` bytes/s."""
    users: dict[int, list[Hashable]] = {}
    count: dict[int, int] = {}
    for f, links in routes.items():
        for link in links:
            users.setdefault(link, []).append(f)
            count[link] = count.get(link, 0) + 1
    return _fill(len(routes), routes, users, count, capacity)


def _fill(flows: int, routes: Mapping[F, Sequence[int]], users: Mapping[int, Iterable[F]], count: dict[int, int],
          capacity: Sequence[float]) -> dict[F, float]:
    """Progressive filling of ``flows`` flows over the links of ``count`` (link -> the flows crossing it, counted
    as often as they cross it; consumed); ``users[link]`` names them. Stops once every flow has its rate.

    Links leave the heap in (share, version, link) order, a total order: the rates do not depend on the order of
    ``count`` or of the flows in ``users[link]`` (the flows frozen by one link all subtract the same share)."""
    rem = {link: float(capacity[link]) for link in count}
    version = dict.fromkeys(count, 0)
    heap = [(rem[link] / count[link], 0, link) for link in count]
    heapq.heapify(heap)
    rate: dict[F, float] = {}
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        share, ver, link = pop(heap)
        if ver != version[link] or count[link] == 0:
            continue
        for f in users[link]:
            if f in rate:
                continue
            rate[f] = share
            for other in routes[f]:
                left = rem.get(other)
                if left is None:  # a link not counted: it binds no one
                    continue
                left -= share
                rem[other] = left
                c = count[other] - 1
                count[other] = c
                v = version[other] + 1
                version[other] = v
                if c > 0:
                    push(heap, ((left if left >= 0.0 else 0.0) / c, v, other))  # max(left, 0.0), inlined
        if len(rate) == flows:  # the links left in the heap have no unfrozen flow
            break
    return rate


class FlowNetwork:
    """Active flows; call :meth:`add` / :meth:`remove`, then :meth:`allocate` once per instant.

    The state lives in arrays and the work is compiled (:mod:`simulator.engine.flowcore`): this class maps each
    flow's key to a slot (reused once the flow is gone), gives capped flows their private links, checks the input
    and grows the arrays."""

    def __init__(self, capacity: Sequence[float]) -> None:
        n = len(capacity)
        self._given = n  # the links routes may name
        self._links = n  # links in use: the given ones, then the private cap links handed out so far
        self._li = np.zeros((fc.NLI, 0), np.int64)
        self._lf = np.zeros((fc.NLF, 0))
        self._marks = np.zeros((2, 0), np.int64)
        self._grow_links(max(64, 2 * n))
        self._lf[fc.CAP, :n] = np.asarray(capacity, dtype=float)
        self._maxr = 8  # route positions per slot (grown for a longer route)
        self._si = np.zeros((fc.NSI, 0), np.int64)
        self._sf = np.zeros((fc.NSF, 0))
        self._route = np.zeros((0, self._maxr), np.int64)
        self._wts = np.ones((0, self._maxr))
        self._inc = np.full((2, 0), -1, np.int64)
        self._fresh = np.zeros(0, np.int64)
        self._free: list[int] = []
        self._grow_slots(64)
        self._eta = (np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._grow_eta(256)
        self._sc = np.zeros(fc.NSC, np.int64)
        self._slot: dict[int, int] = {}  # flow key -> slot
        self._spare_caps: list[int] = []  # ids of cap links no flow holds now (reused before new ones)
        self._cap_link: dict[int, int] = {}  # flow -> its private cap link
        self.allocations = 0
        self._next: tuple[float, list[int]] | None = None  # next_finish's answer, until a flow comes or goes
        self._dirty = False  # a flow came or went since the last allocation
        self._eta_size = 0  # entries in the finish heap (as of the last allocation: at least as many as now)
        self._added = 0  # flows added since the last allocation (each may be listed once as fresh)
        self._routes: dict[tuple[int, ...], np.ndarray] = {}  # a route as an array, for the compiled code
        self._unweighted = np.ones(0)

    @property
    def capacity(self) -> list[float]:
        """Bytes/s of every link in use (the private cap links after the given ones)."""
        return self._lf[fc.CAP, :self._links].tolist()

    # -- growth ---------------------------------------------------------------------------------------------------
    def _grow_links(self, size: int) -> None:
        old = self._li.shape[1]
        li = np.zeros((fc.NLI, size), np.int64)
        li[:, :old] = self._li
        li[fc.HEAD, old:] = -1
        li[fc.TEPOCH, old:] = -1
        lf = np.zeros((fc.NLF, size))
        lf[:, :old] = self._lf
        marks = np.zeros((2, size), np.int64)
        marks[:, :old] = self._marks
        self._li, self._lf, self._marks = li, lf, marks

    def _grow_slots(self, size: int) -> None:
        old = self._si.shape[1]
        maxr = self._maxr
        si = np.zeros((fc.NSI, size), np.int64)
        si[:, :old] = self._si
        sf = np.zeros((fc.NSF, size))
        sf[:, :old] = self._sf
        route = np.zeros((size, maxr), np.int64)
        route[:old] = self._route
        wts = np.ones((size, maxr))
        wts[:old] = self._wts
        inc = np.full((2, size * maxr), -1, np.int64)
        inc[:, :old * maxr] = self._inc
        fresh = np.zeros(max(size + 1, len(self._fresh)), np.int64)
        fresh[:len(self._fresh)] = self._fresh
        self._si, self._sf, self._route, self._wts, self._inc, self._fresh = si, sf, route, wts, inc, fresh
        self._free.extend(range(size - 1, old - 1, -1))  # popped from the end: the lowest slot first

    def _grow_route(self, length: int) -> None:
        new = max(length, 2 * self._maxr)
        self._inc = fc.relayout(self._li, self._inc, self._maxr, new)
        route = np.zeros((len(self._route), new), np.int64)
        route[:, :self._maxr] = self._route
        wts = np.ones((len(self._wts), new))
        wts[:, :self._maxr] = self._wts
        self._route, self._wts, self._maxr = route, wts, new

    def _grow_eta(self, size: int) -> None:
        old = self._eta[0]
        eta = (np.zeros(size), np.zeros(size, np.int64), np.zeros(size, np.int64))
        for new, kept in zip(eta, self._eta, strict=True):
            new[:len(old)] = kept
        self._eta = eta

    # -- flows --------------------------------------------------------------------------------------------------
    def add(self, flow: int, links: Iterable[int], nbytes: float, now: float, cap: float = 0.0,
            weights: Weights = None) -> None:
        """Start draining ``flow`` at time ``now`` (rate 0 until the next :meth:`allocate`); ``cap`` > 0: the flow
        never goes faster (bytes/s), through a private link of that capacity appended to its route; ``weights``
        (one per link, > 0): bytes of each link's capacity one byte of the flow uses (None: 1 each)."""
        route = links if type(links) is tuple else tuple(links)
        arr = self._routes.get(route)
        if arr is None:
            if route and (min(route) < 0 or max(route) >= self._given):  # (the compiled code does not check)
                raise ValueError(f"flow {flow}: route {route} names a link outside 0..{self._given - 1}")
            arr = np.array(route, dtype=np.int64)
            if len(self._routes) >= ROUTES_KEPT:
                self._routes.clear()
            self._routes[route] = arr
        kind = 0
        warr = self._unweighted
        if weights is not None:
            weights = tuple(map(float, weights))
            if len(weights) != len(route) or not all(0.0 < w < math.inf for w in weights):
                raise ValueError(f"flow {flow}: needs one finite weight > 0 per link of its route {route}, got "
                                 f"{weights}")
            kind = fc.WEIGHTED
            warr = np.array(weights)
        if flow in self._slot:
            raise ValueError(f"flow {flow} is already active")
        if not self._free:
            self._grow_slots(2 * self._si.shape[1])
        if len(route) + (cap > 0.0) > self._maxr:
            self._grow_route(len(route) + 1)
        slot = self._free.pop()
        private = -1
        if cap > 0.0:
            if self._spare_caps:
                private = self._spare_caps.pop()
            else:
                private = self._links
                if private >= self._li.shape[1]:
                    self._grow_links(2 * self._li.shape[1])
                self._links += 1
            self._cap_link[flow] = private
            kind |= fc.CAPPED if weights is not None else fc.CAPPED | fc.CAPPED_PLAIN
        else:
            cap = 0.0
        self._slot[flow] = slot
        self._added += 1
        if self._added >= len(self._fresh):  # (a slot may be listed again after a reuse)
            self._fresh = np.concatenate((self._fresh, np.zeros(len(self._fresh), np.int64)))
        fc.add(slot, arr, warr, private, kind, flow, float(nbytes), float(now), float(cap), self._li, self._lf,
               self._si, self._sf, self._route, self._wts, self._inc, self._marks, self._fresh, self._sc)
        self._next = None
        self._dirty = True

    def remove(self, flow: int) -> None:
        """Stop ``flow`` (finished); the flows it shared links with get new rates at the next allocation."""
        slot = self._slot.pop(flow)
        fc.remove(slot, self._li, self._lf, self._si, self._sf, self._route, self._inc, self._marks, self._sc)
        self._free.append(slot)
        self._next = None
        self._dirty = True
        private = self._cap_link.pop(flow, None)
        if private is not None:
            self._spare_caps.append(private)

    def allocate(self, now: float, changed_links: bool = True) -> set[int]:
        """Recompute the max-min fair rates of the flows around the links touched since the last call, one
        connected component at a time (components share no link, so their rates are independent).

        Returns the links whose load may have changed (the touched ones and those of the recomputed flows; an
        empty set when ``changed_links`` is false, for a caller that does not read them).
        """
        if not self._dirty:  # no flow came or went since the last call
            return set()
        self._dirty = False
        if self._eta_size + len(self._slot) >= len(self._eta[0]):  # room for a new finish of every flow
            self._grow_eta(2 * (self._eta_size + len(self._slot)) + 16)
        did, changed, when, due, self._eta_size = fc.allocate(
            float(now), bool(changed_links), self._li, self._lf, self._si, self._sf, self._route, self._wts, self._inc,
            self._marks, self._fresh, *self._eta, self._sc)
        self._added = 0
        self._next = (when, due.tolist())
        if not did:
            return set()
        self.allocations += 1
        return set(changed.tolist()) if changed_links else set()

    def rate(self, flow: int) -> float:
        """Bytes/s ``flow`` drains at now (as of the last :meth:`allocate`)."""
        return float(self._sf[fc.RATE, self._slot[flow]])

    def load(self, link: int) -> float:
        """Bytes/s of ``link``'s capacity in use now (a flow that crosses it twice counts twice; a weighted flow
        its rate times its weight there)."""
        if not 0 <= link < self._links:
            return 0.0
        return float(fc.load(link, self._li, self._sf, self._wts, self._inc, self._maxr))

    def next_finish(self) -> tuple[float, list[int]]:
        """Earliest predicted finish time and every flow predicted to finish then (``(inf, [])`` when idle): the
        flows predicted within ``FINISH_RTOL`` of the earliest, in key order."""
        if self._next is None:
            when, due = fc.next_finish(self._si, *self._eta, self._sc)
            self._next = (float(when), due.tolist())
        return self._next


def load_compiled() -> float:
    """Load the compiled flow network into this process (numba's cache; on a fresh install it is compiled and
    cached first, about half a minute): run before forking a pool, so that its workers inherit it or read the cache
    rather than each compile it. Returns the seconds it took."""
    t0 = time.perf_counter()
    net = FlowNetwork([1.0] * 9)
    net.add(0, (0, 1), 1.0, 0.0, cap=0.5)
    net.add(1, (1,), 1.0, 0.0, weights=(2.0,))
    net.add(2, tuple(range(9)), 1.0, 0.0)  # a route wider than the first arrays: their re-layout
    net.allocate(0.0)
    net.load(1)
    net.remove(0)
    net.next_finish()
    return time.perf_counter() - t0
