"""Flow-level network model: max-min fair rates by progressive filling (no simpy here).

Each active flow drains over a fixed set of directed links. :meth:`FlowNetwork.allocate` gives every flow its
max-min fair rate: repeatedly take the link with the smallest fair share ``remaining capacity / unfrozen flows``,
freeze its flows at that share, and subtract it from every other link they cross (Bertsekas & Gallager, *Data
Networks*, Sec. 6.5.2). With a heap keyed by share this costs O(sum of route lengths x log links).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Mapping, Sequence

__all__ = ["FlowNetwork", "max_min_rates"]

FINISH_RTOL = 1e-12  # flows whose predicted finish is within this relative time of the earliest finish together
RESIDUAL_RTOL = 1e-9  # bytes left below this fraction of a flow's size count as drained (float round-off)


def max_min_rates(routes: Mapping[Hashable, Sequence[int]], capacity: Sequence[float]) -> dict[Hashable, float]:
    """Max-min fair rate (bytes/s) of every flow; ``routes[f]`` lists link ids, ``capacity[l]`` bytes/s."""
    users: dict[int, list[Hashable]] = {}
    for f, links in routes.items():
        for link in links:
            users.setdefault(link, []).append(f)
    rem = {link: float(capacity[link]) for link in users}
    count = {link: len(u) for link, u in users.items()}
    version = dict.fromkeys(users, 0)
    heap = [(rem[link] / count[link], 0, link) for link in users]
    heapq.heapify(heap)
    rate: dict[Hashable, float] = {}
    while heap:
        share, ver, link = heapq.heappop(heap)
        if ver != version[link] or count[link] == 0:
            continue
        for f in users[link]:
            if f in rate:
                continue
            rate[f] = share
            for other in routes[f]:
                rem[other] -= share
                count[other] -= 1
                version[other] += 1
                if count[other] > 0:
                    heapq.heappush(heap, (max(rem[other], 0.0) / count[other], version[other], other))
    return rate


class FlowNetwork:
    """Active flows with remaining bytes; rates recomputed on demand (:meth:`allocate`)."""

    def __init__(self, capacity: Sequence[float]) -> None:
        self.capacity = list(capacity)
        self.routes: dict[int, tuple[int, ...]] = {}
        self.remaining: dict[int, float] = {}
        self.size: dict[int, float] = {}
        self.rate: dict[int, float] = {}
        self.now = 0.0
        self.allocations = 0

    def advance(self, now: float) -> None:
        """Drain every active flow at its current rate up to time ``now``."""
        dt = now - self.now
        if dt > 0:
            rem, rate = self.remaining, self.rate
            for f in rem:
                rem[f] -= rate.get(f, 0.0) * dt
        self.now = now

    def add(self, flow: int, links: Iterable[int], nbytes: float) -> None:
        """Start draining ``flow`` (call :meth:`advance` to the current time first)."""
        self.routes[flow] = tuple(links)
        self.remaining[flow] = float(nbytes)
        self.size[flow] = float(nbytes)

    def allocate(self) -> None:
        """Recompute every flow's max-min fair rate."""
        self.rate = max_min_rates(self.routes, self.capacity)  # type: ignore[assignment,arg-type]
        self.allocations += 1

    def next_finish(self) -> tuple[float, list[int]]:
        """Earliest finish time and the flows that finish then (``(inf, [])`` when idle)."""
        best = float("inf")
        eta: dict[int, float] = {}
        for f, rem in self.remaining.items():
            t = self.now + max(rem, 0.0) / self.rate[f]
            eta[f] = t
            best = min(best, t)
        if not eta:
            return best, []
        tol = FINISH_RTOL * max(best, 1e-30)
        return best, [f for f, t in eta.items() if t - best <= tol]

    def pop_finished(self, due: Iterable[int]) -> list[int]:
        """Remove and return the ``due`` flows plus any other flow with only round-off bytes left."""
        done = set(due)
        done.update(f for f, rem in self.remaining.items() if rem <= RESIDUAL_RTOL * self.size[f])
        out = sorted(done)
        for f in out:
            del self.routes[f], self.remaining[f], self.size[f]
            self.rate.pop(f, None)
        return out
