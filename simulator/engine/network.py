"""Flow-level network model: max-min fair rates by progressive filling (no simpy here).

Each active flow drains over a fixed set of directed links at its max-min fair rate: repeatedly take the link with
the smallest fair share ``remaining capacity / unfrozen flows``, freeze its flows at that share, and subtract it
from every other link they cross (Bertsekas & Gallager, *Data Networks*, Sec. 6.5.2). With a heap keyed by share
this costs O(sum of route lengths x log links); it stops once every flow has its rate.

Rates of flows that share no link, directly or through other flows, are independent, so a change (flows starting
or finishing) only re-runs the filling on the connected components of flows around the links it touched, each on
its own (a flow alone on its links simply gets its narrowest link, as most of a ring's flows do); the links'
flow counts are read off the per-link sets of flows. Progress is lazy: a flow's remaining bytes are brought up to
date only when its rate changes; a heap of predicted finish times gives the next completion, kept until a
prediction that could change it.

Max-min rates depend only on the multiset of the component's flow shapes (a shape: the route and the rate cap),
and flows of one shape get one rate; a pipeline (a collective's chunks, a tree's levels) meets the same components
over and over, so each filled multiset's rates are kept and looked up (the same floats: the filling's order is a
total order over the shapes' links).

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
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from itertools import chain
from typing import Any, TypeVar

__all__ = ["FlowNetwork", "max_min_rates"]

F = TypeVar("F", bound=Hashable)  # a flow's key
Weights = tuple[float, ...] | None  # per link of a route (without the cap link): bytes of capacity per byte
Shape = tuple[tuple[int, ...], float, Weights]  # a flow's route without its cap link, its cap (0: none), weights
FILLED_KEPT = 4096  # components' rates kept for reuse (all forgotten at once when full)
KEYING_TRIAL = 256  # fills after which keying stops unless a fifth of the lookups or more found their rates
FINISH_RTOL = 1e-12  # flows predicted to finish within this relative time of the earliest one finish with it
SLACK = 1.0 - 1e-9  # a link whose flows' caps sum to at most this fraction of its capacity binds none of them


def max_min_rates(routes: Mapping[Hashable, Sequence[int]], capacity: Sequence[float]) -> dict[Hashable, float]:
    """Max-min fair rate (bytes/s) of every flow; ``routes[f]`` lists link ids, ``capacity[l]`` bytes/s."""
    users: dict[int, list[Hashable]] = {}
    count: dict[int, int] = {}
    for f, links in routes.items():
        for link in links:
            users.setdefault(link, []).append(f)
            count[link] = count.get(link, 0) + 1
    return _fill(len(routes), routes, users, count, capacity)


def _shares(count: Mapping[int, int], load: Mapping[int, float], capacity: Sequence[float]
            ) -> tuple[dict[int, float], dict[int, int], list[tuple[float, int, int]]]:
    """A filling's start: each link's remaining capacity, version, and the heap of fair shares (capacity / load)."""
    rem = {link: float(capacity[link]) for link in count}
    heap = [(rem[link] / load[link], 0, link) for link in count]
    heapq.heapify(heap)
    return rem, dict.fromkeys(count, 0), heap


def _fill(flows: int, routes: Mapping[F, Sequence[int]], users: Mapping[int, Iterable[F]], count: dict[int, int],
          capacity: Sequence[float]) -> dict[F, float]:
    """Progressive filling of ``flows`` flows over the links of ``count`` (link -> the flows crossing it, counted
    as often as they cross it; consumed); ``users[link]`` names them. Stops once every flow has its rate.

    Links leave the heap in (share, version, link) order, a total order: the rates do not depend on the order of
    ``count`` or of the flows in ``users[link]`` (the flows frozen by one link all subtract the same share)."""
    rem, version, heap = _shares(count, count, capacity)
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
                if left is None:  # a slack link (FlowNetwork): it binds no one
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


def _fill_weighted(flows: int, routes: Mapping[F, Sequence[int]], weights: Mapping[F, Sequence[float]],
                   users: Mapping[int, Iterable[F]], count: dict[int, int], load: dict[int, float],
                   capacity: Sequence[float]) -> dict[F, float]:
    """:func:`_fill` where flows load links by weight: ``weights[f]`` (one per link of ``routes[f]``; 1 for a flow
    not in it), ``load[link]`` the weights of the flows crossing it summed (consumed, with ``count``). A link's fair
    share is what its remaining capacity gives each of its unfrozen flows at one rate: remaining / load.

    Unlike :func:`_fill`'s, the rates' last bits may depend on the order of the flows in ``users[link]`` (the flows
    frozen by one link subtract different amounts): a component filled afresh and one looked up can differ by a
    few ulps (2.6e-14 relative at most over 6,800 random histories); the same run always gives the same floats."""
    rem, version, heap = _shares(count, load, capacity)
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
            w = weights.get(f)
            for i, other in enumerate(routes[f]):
                left = rem.get(other)
                if left is None:
                    continue
                used = share if w is None else share * w[i]
                left -= used
                rem[other] = left
                c = count[other] - 1
                count[other] = c
                rest = load[other] - (1.0 if w is None else w[i])
                load[other] = rest
                v = version[other] + 1
                version[other] = v
                if c > 0:
                    if rest <= 0.0:  # rounding ate what is left (weights 1e15 times apart): sum them again
                        rest = load[other] = _unfrozen_load(other, users, rate, routes, weights)
                    push(heap, ((left if left >= 0.0 else 0.0) / rest, v, other))
        if len(rate) == flows:
            break
    return rate


def _unfrozen_load(link: int, users: Mapping[int, Iterable[F]], rate: Mapping[F, float],
                   routes: Mapping[F, Sequence[int]], weights: Mapping[F, Sequence[float]]) -> float:
    """The weights with which the flows not yet rated cross ``link``, summed afresh."""
    total = 0.0
    for f in users[link]:
        if f not in rate:
            w = weights.get(f)
            total += sum(1.0 if w is None else w[i] for i, x in enumerate(routes[f]) if x == link)
    return total


class FlowNetwork:
    """Active flows; call :meth:`add` / :meth:`remove`, then :meth:`allocate` once per instant."""

    def __init__(self, capacity: Sequence[float]) -> None:
        self.capacity = list(capacity)
        self.routes: dict[int, tuple[int, ...]] = {}
        self.on_link: dict[int, set[int]] = {}
        self._extra: dict[int, int] = {}  # link -> times its flows cross it beyond once each (rarely any)
        self._repeats: set[int] = set()  # the flows that cross a link more than once
        # flow -> [bytes left at time ``updated``, updated, rate, version, (route without its cap link, cap)]
        self.state: dict[int, list[Any]] = {}
        self._alone: dict[tuple[int, ...], float] = {}  # route -> rate of a flow alone on it (its narrowest link)
        # since the last allocation: links whose flows' rates may have changed (a flow came or went on a tight
        # link, or a link turned tight or slack), new capped flows to rate, links capped flows left (their load)
        self._touched: set[int] = set()
        self._fresh: set[int] = set()
        self._left: set[int] = set()
        self._eta: list[tuple[float, int, int]] = []  # (finish time, version, flow)
        self.allocations = 0
        # a component's flow shapes (a multiset) -> each shape's max-min rate: a pipeline's components recur
        self._filled: dict[frozenset[tuple[Shape, int]], dict[Shape, float]] = {}
        self._keying, self._hits, self._misses = True, 0, 0  # keying stops where lookups mostly miss
        self._caps_on: dict[int, dict[float, int]] = {}  # link -> its capped flows' caps, counted as they cross it
        self._capped: dict[int, int] = {}  # link -> how many capped flows cross it (the others have no cap)
        self._tight_now: dict[int, bool] = {}  # allocate's answers of _tight (the flows do not change during it)
        self._spare_caps: list[int] = []  # ids of cap links no flow holds now (reused before new ones)
        self._cap_link: dict[int, int] = {}  # flow -> its private cap link
        self._weighted: dict[int, tuple[float, ...]] = {}  # flow -> weights of its whole route (cap link: 1)
        # next_finish's last answer (best, tolerance, due flows as a set and sorted), None once it may have changed
        self._next: tuple[float, float, set[int], list[int]] | None = None

    def add(self, flow: int, links: Iterable[int], nbytes: float, now: float, cap: float = 0.0,
            weights: Weights = None) -> None:
        """Start draining ``flow`` at time ``now`` (rate 0 until the next :meth:`allocate`); ``cap`` > 0: the flow
        never goes faster (bytes/s), through a private link of that capacity appended to its route; ``weights``
        (one per link, > 0): bytes of each link's capacity one byte of the flow uses (None: 1 each)."""
        route = links if type(links) is tuple else tuple(links)
        if weights is not None:
            weights = tuple(map(float, weights))
            if len(weights) != len(route) or not all(0.0 < w < math.inf for w in weights):
                raise ValueError(f"flow {flow}: needs one finite weight > 0 per link of its route {route}, got "
                                 f"{weights}")
            self._weighted[flow] = (*weights, 1.0) if cap > 0.0 else weights
        shape = (route, cap, weights)  # what its rate depends on, with the other flows' shapes (not the cap link)
        if cap > 0.0:
            if self._spare_caps:
                private = self._spare_caps.pop()
                self.capacity[private] = float(cap)
            else:
                private = len(self.capacity)
                self.capacity.append(float(cap))
            self._cap_link[flow] = private
            route = (*route, private)
        self.routes[flow] = route
        self.state[flow] = [float(nbytes), now, 0.0, 0, shape]
        if len(set(route)) < len(route):  # a link crossed twice (a loopback's host cores): counted twice
            extra = self._extra
            for link in set(route):
                times = route.count(link)
                if times > 1:
                    extra[link] = extra.get(link, 0) + times - 1
            self._repeats.add(flow)
        on_link = self.on_link
        for link in route:
            users = on_link.get(link)
            if users is None:
                on_link[link] = {flow}
            else:
                users.add(flow)
        if cap > 0.0 and weights is None:  # (a weighted flow counts as uncapped here: its links stay tight)
            caps_on, capped, capacity, touched = self._caps_on, self._capped, self.capacity, self._touched
            if flow in self._repeats:  # a link crossed twice: its cap counted twice, the flow once
                for link in shape[0]:
                    caps = caps_on.setdefault(link, {})
                    caps[cap] = caps.get(cap, 0) + 1
                for link in set(shape[0]):
                    capped[link] = capped.get(link, 0) + 1
                touched.update(link for link in shape[0] if self._link_tight(link))
            else:
                for link in shape[0]:  # _link_tight after the flow came, inlined: a slack link stays slack
                    held = caps_on.get(link)
                    if held is None:
                        caps_on[link] = {cap: 1}
                        capped[link] = n = 1
                        total = cap
                    else:
                        times = held.get(cap, 0) + 1
                        held[cap] = times
                        n = capped[link] + 1
                        capped[link] = n
                        total = cap * times if len(held) == 1 else self._cap_sum(held)
                    if len(on_link[link]) > n or total > capacity[link] * SLACK:
                        touched.add(link)
            self._fresh.add(flow)  # rated even where all its links stay slack
        else:  # its links are tight (the flows on them may change rates): they find it
            self._touched.update(route)

    def remove(self, flow: int) -> None:
        """Stop ``flow`` (finished); the flows it shared links with get new rates at the next allocation."""
        links, cap, weights = self.state[flow][4]
        repeated = flow in self._repeats
        if weights is not None:
            del self._weighted[flow]
        if cap > 0.0 and weights is None:  # the other flows of a tight link may rise (or be freed, once it turns slack)
            self._left.update(links)  # their loads changed
            self._fresh.discard(flow)
            caps_on, capped, capacity, touched, on_link = (self._caps_on, self._capped, self.capacity, self._touched,
                                                           self.on_link)
            if repeated:
                touched.update(link for link in links if self._link_tight(link))
                for link in links:
                    caps = caps_on[link]
                    if caps[cap] > 1:
                        caps[cap] -= 1
                    elif len(caps) == 1:
                        del caps_on[link]
                    else:
                        del caps[cap]
                for link in set(links):
                    if capped[link] > 1:
                        capped[link] -= 1
                    else:
                        del capped[link]
            else:
                for link in links:  # _link_tight before the flow goes, inlined; then its counts go
                    caps = caps_on[link]
                    times, n = caps[cap], capped[link]
                    total = cap * times if len(caps) == 1 else self._cap_sum(caps)
                    if len(on_link[link]) > n or total > capacity[link] * SLACK:
                        touched.add(link)
                    if times > 1:
                        caps[cap] = times - 1
                    elif len(caps) == 1:
                        del caps_on[link]
                    else:
                        del caps[cap]
                    if n > 1:
                        capped[link] = n - 1
                    else:
                        del capped[link]
        else:
            self._touched.update(links)
        route = self.routes.pop(flow)
        if repeated:
            self._repeats.discard(flow)
            extra = self._extra
            for link in set(route):
                times = route.count(link)
                if times > 1:
                    extra[link] -= times - 1
                    if not extra[link]:
                        del extra[link]
        on_link = self.on_link
        for link in route:  # a link may appear twice (a flow that loads it twice as much): discard is idempotent
            users = on_link.get(link)
            if users is not None:
                users.discard(flow)
                if not users:
                    del on_link[link]
        del self.state[flow]
        if self._next is not None and flow in self._next[2]:
            self._next = None
        private = self._cap_link.pop(flow, None)
        if private is not None:
            self._spare_caps.append(private)

    def _link_tight(self, link: int) -> bool:
        """Whether ``link`` may bind its flows: one of them has no cap, or their caps (counted as often as they
        cross it) add up to more than ``SLACK`` of its capacity. A slack link binds none: every flow on it gets at
        most its cap, and all the caps fit (progressive filling never freezes a flow there, by the margin)."""
        users = self.on_link.get(link)
        if not users:
            return False
        caps = self._caps_on.get(link)
        if caps is None or len(users) > self._capped[link]:  # a flow without a cap
            return True
        return self._cap_sum(caps) > self.capacity[link] * SLACK

    @staticmethod
    def _cap_sum(caps: dict[float, int]) -> float:
        """A link's flows' caps, summed (each as often as it is counted), afresh: no drift from additions."""
        total = 0.0
        for cap, times in caps.items():
            total += cap * times
        return total

    def _tight(self, link: int) -> bool:
        """:meth:`_link_tight`, kept for one allocation (its flows do not change during it)."""
        hit = self._tight_now.get(link)
        if hit is None:
            hit = self._tight_now[link] = self._link_tight(link)
        return hit

    def _components(self) -> tuple[list[int], list[tuple[list[int], list[Shape], list[int]]]]:
        """The flows around the links touched since the last allocation, grouped as their rates depend on each
        other: through shared links that may bind (:meth:`_tight`). Flows that share no such link with another
        flow (most of a ring's; a collective's flows held at their channels' caps) come back on their own, rated
        without a search (their narrowest link, their cap link included); the others as connected components over
        their tight links, each as its flows, their shapes (in the same order) and its tight links."""
        solos: list[int] = []
        comps: list[tuple[list[int], list[Shape], list[int]]] = []
        seen_links: set[int] = set()  # tight links of the components found
        placed: set[int] = set()
        on_link, state, tight = self.on_link, self.state, self._tight
        self._tight_now.clear()
        groups = map(on_link.get, self._touched)  # the touched links' flows, then the new capped ones
        for users in chain(groups, (self._fresh,)) if self._fresh else groups:
            if users is None:
                continue
            for flow in users:
                if flow in placed:
                    continue
                start = -1  # a tight link the flow shares, if any: its component is searched from there
                for link in state[flow][4][0]:
                    if len(on_link[link]) > 1 and tight(link):
                        start = link
                        break
                if start < 0:
                    solos.append(flow)
                    placed.add(flow)
                    continue
                members: list[int] = []
                shapes: list[Shape] = []
                links = [start]
                seen_links.add(start)
                for link in links:  # grows while it is walked: a breadth-first search over tight links
                    for f in on_link[link]:
                        if f not in placed:
                            placed.add(f)
                            members.append(f)
                            shape = state[f][4]
                            shapes.append(shape)
                            for other in shape[0]:  # its route but its private cap link (no other flow crosses it)
                                if other not in seen_links and tight(other):
                                    seen_links.add(other)
                                    links.append(other)
                comps.append((members, shapes, links))
        return solos, comps

    def allocate(self, now: float, changed_links: bool = True) -> set[int]:
        """Recompute the max-min fair rates of the flows around the links touched since the last call, one
        connected component at a time (components share no link, so their rates are independent).

        Returns the links whose load may have changed (the touched ones and those of the recomputed flows; an
        empty set when ``changed_links`` is false, for a caller that does not read them).
        """
        if not (self._touched or self._fresh or self._left):
            return set()
        solos, comps = self._components()
        changed = self._touched | self._left if changed_links else set()
        self._touched.clear()
        self._fresh.clear()
        self._left.clear()
        self.allocations += 1
        routes, alone_of = self.routes, self._alone
        solo_rates = []
        weighted = self._weighted
        for f in solos:  # a flow alone on its links gets the narrowest one (_rerate's answer, inlined)
            route = routes[f]
            if changed_links:
                changed.update(route)
            new = None if weighted and f in weighted else alone_of.get(route)  # (weighted: never cached)
            solo_rates.append((f, self._alone_rate(f) if new is None else new))
        self._set_rates(solo_rates, now)
        for flows, shapes, links in comps:
            if changed_links:
                for shape in shapes:
                    changed.update(shape[0])
            self._rerate(flows, shapes, links, now)
        return changed

    def _alone_rate(self, only: int) -> float:
        """The rate of a flow alone on its links: its narrowest one (counted as often as it crosses it)."""
        route = self.routes[only]
        weights = self._weighted.get(only)
        if weights is not None:  # each link's weights, summed over the times the flow crosses it
            used: dict[int, float] = {}
            for link, w in zip(route, weights, strict=True):
                used[link] = used.get(link, 0.0) + w
            return min(self.capacity[link] / w for link, w in used.items())  # not cached: weights vary by size
        if only in self._repeats:
            alone = min(self.capacity[link] / route.count(link) for link in route)
        else:  # each link once: its narrowest (x / 1 == x exactly)
            alone = float(min(map(self.capacity.__getitem__, route)))
        if only not in self._cap_link:  # a cap link's id is reused with another capacity: not cached
            self._alone[route] = alone
        return alone

    def _rerate(self, flows: list[int], shapes: list[Shape], links: list[int], now: float) -> None:
        """New max-min rates of one component's flows (of ``shapes``, over ``links``), progress brought up to
        ``now`` where a rate changes. Max-min rates depend on the multiset of the flows' shapes alone (flows of one
        shape get one rate), and a pipeline's components recur: a multiset already filled is looked up."""
        if self._keying:
            key = frozenset(Counter(shapes).items())
            by_shape = self._filled.get(key)
        else:
            by_shape = None
        if by_shape is None:
            on_link, extra = self.on_link, self._extra
            count = {link: len(on_link[link]) for link in links}
            if extra:
                for link in links:
                    count[link] += extra.get(link, 0)
            for f, (_, cap, _w) in zip(flows, shapes, strict=True):
                if cap > 0.0:
                    count[self._cap_link[f]] = 1
            weighted = self._weighted
            if weighted and any(shape[2] is not None for shape in shapes):
                load = dict.fromkeys(count, 0.0)
                for f in flows:
                    w = weighted.get(f)
                    for i, link in enumerate(self.routes[f]):
                        if link in load:
                            load[link] += 1.0 if w is None else w[i]
                rates = _fill_weighted(len(flows), self.routes, weighted, on_link, count, load, self.capacity)
            else:
                rates = _fill(len(flows), self.routes, on_link, count, self.capacity)
            by_shape = {sh: rates[f] for f, sh in zip(flows, shapes, strict=True)}
            if self._keying:
                self._misses += 1
                if self._misses >= KEYING_TRIAL and self._misses > 4 * self._hits:
                    self._keying = False  # components that do not recur (random flows): no key to pay for
                    self._filled.clear()
                else:
                    if len(self._filled) >= FILLED_KEPT:
                        self._filled.clear()
                    self._filled[key] = by_shape
        else:
            self._hits += 1
        self._set_rates(zip(flows, map(by_shape.__getitem__, shapes), strict=True), now)

    def _set_rates(self, rated: Iterable[tuple[int, float]], now: float) -> None:
        """Flows' new rates: progress brought up to ``now`` and a finish predicted where a rate changes."""
        state, eta = self.state, self._eta
        nxt = self._next
        for f, new in rated:
            st = state[f]
            if new == st[2] and st[3] > 0:
                continue
            st[0] -= st[2] * (now - st[1])
            st[1] = now
            st[2] = new
            st[3] += 1
            when = now + max(st[0], 0.0) / new
            heapq.heappush(eta, (when, st[3], f))
            if nxt is not None and (f in nxt[2] or when - nxt[0] <= nxt[1]):
                self._next = nxt = None  # the earliest finish may have changed

    def rate(self, flow: int) -> float:
        """Bytes/s ``flow`` drains at now (as of the last :meth:`allocate`)."""
        return float(self.state[flow][2])

    def load(self, link: int) -> float:
        """Bytes/s of ``link``'s capacity in use now (a flow that crosses it twice counts twice; a weighted flow
        its rate times its weight there)."""
        total = 0.0
        for f in self.on_link.get(link, ()):
            w = self._weighted.get(f)
            route = self.routes[f]
            times = route.count(link) if w is None else sum(x for r, x in zip(route, w, strict=True) if r == link)
            total += self.state[f][2] * times
        return total

    def next_finish(self) -> tuple[float, list[int]]:
        """Earliest predicted finish time and every flow predicted to finish then (``(inf, [])`` when idle).

        Entries left by flows since re-rated or removed are dropped when they reach the top; the flows due are
        read off the heap in place: every entry within the tolerance of the top has all its ancestors within it
        too, so a walk from the root that stops at later entries finds them all (no pop and push back). The answer
        is kept until a due flow is re-rated or removed or a new prediction falls within the tolerance of it."""
        if self._next is not None:
            return self._next[0], self._next[3]
        heap, state = self._eta, self.state
        while heap:
            _, version, flow = heap[0]
            st = state.get(flow)
            if st is not None and st[3] == version:
                break
            heapq.heappop(heap)
        if not heap:
            return float("inf"), []
        best = heap[0][0]
        tol = FINISH_RTOL * max(best, 1e-30)
        due = []
        n = len(heap)
        stack = [0]
        while stack:
            i = stack.pop()
            when, version, flow = heap[i]
            if when - best <= tol:
                st = state.get(flow)
                if st is not None and st[3] == version:
                    due.append(flow)
                i = 2 * i + 1
                if i < n:
                    stack.append(i)
                    if i + 1 < n:
                        stack.append(i + 1)
        due.sort()
        self._next = (best, tol, set(due), due)
        return best, due
