"""Flow-level network model: max-min fair rates by progressive filling (no simpy here).

Each active flow drains over a fixed set of directed links at its max-min fair rate: repeatedly take the link with
the smallest fair share ``remaining capacity / unfrozen flows``, freeze its flows at that share, and subtract it
from every other link they cross (Bertsekas & Gallager, *Data Networks*, Sec. 6.5.2). With a heap keyed by share
this costs O(sum of route lengths x log links); it stops once every flow has its rate.

Rates of flows that share no link, directly or through other flows, are independent, so a change (flows starting
or finishing) only re-runs the filling on the connected components of flows around the links it touched, each on
its own (a flow alone on its links simply gets its narrowest link, as most of a ring's flows do); the links'
flow counts are kept per link. A component that only lost flows keeps the steps of its last filling that came
before the first step that froze a flow now gone (those steps happen the same way without it: its links share more
among fewer flows) and fills on from there. Progress is lazy: a flow's remaining bytes are brought up to date only
when its rate changes; a heap of predicted finish times gives the next completion.

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
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from simulator.engine import netstate as ns

__all__ = ["FlowNetwork", "max_min_rates"]

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

    The state and the work are compiled (:mod:`simulator.engine.netstate` over :mod:`simulator.engine.flowcore`):
    this class maps each flow's key to its slot and checks the input."""

    def __init__(self, capacity: Sequence[float]) -> None:
        self._given = len(capacity)  # the links routes may name
        self._net = ns.net_new(np.asarray(capacity, dtype=float).reshape(-1))
        self._slot: dict[int, int] = {}  # flow key -> slot
        self._routes: dict[tuple[int, ...], np.ndarray] = {}  # a route as an array, for the compiled code
        self._unweighted = np.ones(0)

    @property
    def capacity(self) -> list[float]:
        """Bytes/s of every link in use (the private cap links after the given ones)."""
        return ns.net_capacity(self._net).tolist()  # type: ignore[no-any-return]

    @property
    def allocations(self) -> int:
        """Allocations that re-rated flows (flows had come or gone since the previous one)."""
        return int(ns.net_allocations(self._net))

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
        warr = self._unweighted
        if weights is not None:
            weights = tuple(map(float, weights))
            if len(weights) != len(route) or not all(0.0 < w < math.inf for w in weights):
                raise ValueError(f"flow {flow}: needs one finite weight > 0 per link of its route {route}, got "
                                 f"{weights}")
            warr = np.array(weights)
        if flow in self._slot:
            raise ValueError(f"flow {flow} is already active")
        self._slot[flow] = ns.net_add(self._net, flow, arr, warr, weights is not None, float(nbytes), float(now),
                                      float(cap))

    def remove(self, flow: int) -> None:
        """Stop ``flow`` (finished); the flows it shared links with get new rates at the next allocation."""
        ns.net_remove(self._net, self._slot.pop(flow))

    def allocate(self, now: float, changed_links: bool = True) -> set[int]:
        """Recompute the max-min fair rates of the flows around the links touched since the last call, one
        connected component at a time (components share no link, so their rates are independent).

        Returns the links whose load may have changed (the touched ones and those of the recomputed flows; an
        empty set when ``changed_links`` is false, for a caller that does not read them).
        """
        did, changed = ns.net_allocate(self._net, float(now), bool(changed_links))
        return set(changed.tolist()) if did and changed_links else set()

    def rate(self, flow: int) -> float:
        """Bytes/s ``flow`` drains at now (as of the last :meth:`allocate`)."""
        return float(ns.net_rate(self._net, self._slot[flow]))

    def load(self, link: int) -> float:
        """Bytes/s of ``link``'s capacity in use now (a flow that crosses it twice counts twice; a weighted flow
        its rate times its weight there)."""
        return float(ns.net_load(self._net, link))

    def next_finish(self) -> tuple[float, list[int]]:
        """Earliest predicted finish time and every flow predicted to finish then (``(inf, [])`` when idle): the
        flows predicted within ``FINISH_RTOL`` of the earliest, in key order."""
        when, due = ns.net_next(self._net)
        return float(when), due.tolist()
