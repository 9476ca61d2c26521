"""The flow network's state as arrays and its per-event work compiled (numba): what :class:`FlowNetwork` runs.

:mod:`simulator.engine.network` keeps the model's description (max-min fairness by progressive filling, per connected
component of flows over the links that may bind them, rate caps as private links, weighted loads, lazy progress and
a heap of predicted finishes); this module is the same algorithm over flat arrays, so that a change costs
microseconds of machine code rather than a walk over Python dicts and sets:

* links (``li`` / ``lf``, one column per link, the private cap links included): the head of the list of the flows'
  *incidences* on the link (a flow crossing a link twice has two), their count, the distinct flows and the distinct
  capped unweighted flows on it, and per-allocation marks;
* flows (``si`` / ``sf``, one column per *slot*; the Python side maps a flow's key to a slot and reuses the slots of
  finished flows): route length, rate version, key, kind bits, bytes left at ``updated``, rate, cap;
  ``route[slot, i]`` its links (its cap link last) and ``wts[slot, i]`` the capacity one byte uses on each;
* incidences: ``inc[NEXT | PREV, slot * maxr + i]``, doubly linked per link (O(1) to add and remove);
* per flow, the number of its freezing and of its step's first (``FIDX``, ``POPST``), so that a component that only
  lost flows is filled on from the last step before them (:func:`_fill`); per link, the allocation a flow last
  came in at (``ADDEP``: its component is filled afresh);
* a heap of predicted finishes ``(when, version, slot)`` in three arrays; a version never repeats on a slot (it
  keeps counting across the flows that reuse it, and a flow's removal bumps it), so a finished flow's entries
  cannot be mistaken for its successor's.

The filling pops links in (share, version, link) order, the order :func:`simulator.engine.network._fill` uses,
with the same floating-point operations in the same order, so its rates are the reference's floats exactly (a
property the tests check); where weights make the result depend on the order in which a link's flows are frozen
(a weighted component), the order is the link's incidence list's, and the last bits may differ from a fill over
another order (a few ulps).

The per-flow and per-component work (:func:`add`, :func:`remove`, :func:`_place`, :func:`_fill`) is compiled without
numba's reference counting (``_nrt=False``): it only reads and writes the arrays it is given, and the counting's
calls at every entry, exit and branch (a null check each, the engine passing borrowed views) were a tenth of the
event loop's time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.support.jitcache import njit

NO_REFCOUNTS: dict[str, Any] = {"_nrt": False}  # njit's option: compiled without numba's reference counting

SLACK = 1.0 - 1e-9  # a link whose flows' caps sum to at most this fraction of its capacity binds none of them
FINISH_RTOL = 1e-12  # flows predicted to finish within this relative time of the earliest one finish with it

# rows of li (int64, per link)
HEAD, NINC, NFL, NCAP, TOUCH, LEFT, TEPOCH, TVAL, SEEN, FCOUNT, FVER, HVER, ADDEP = range(13)
NLI = 13
# rows of lf (float64, per link)
CAP, FREM, FLOAD, HKEY = range(4)
NLF = 4
# rows of si (int64, per slot)
RLEN, VER, FID, KIND, PLACED, RATED, ACTIVE, FRESH, SHAPE, FIDX, POPST = range(11)
NSI = 11
# rows of sf (float64, per slot)
BYTES, UPD, RATE, FCAP, NEW = range(5)
NSF = 5
# kind bits
CAPPED = 1  # a cap link ends its route
CAPPED_PLAIN = 2  # capped and not weighted: counted by its links' NCAP (a weighted flow keeps its links tight)
WEIGHTED = 4
REPEATS = 8  # crosses a link more than once
RATED_ONCE = 16
# sc (int64 scalars)
NTOUCH, NLEFT, NFRESH, EPOCH, ETA_SIZE, FILL_EPOCH, FROZEN, CUT = range(8)
NSC = 8
NO_CUT = 1 << 62  # sc[CUT] when no flow left since the last allocation
NEXT, PREV = 0, 1


@njit(cache=True, inline="always")
def _tight(link: int, li: np.ndarray, lf: np.ndarray, sf: np.ndarray, inc: np.ndarray, maxr: int) -> bool:
    """Whether ``link`` may bind its flows: one of them has no cap (or is weighted), or their caps, counted as
    often as they cross it, add up to more than ``SLACK`` of its capacity."""
    if li[NFL, link] == 0:
        return False
    if li[NFL, link] > li[NCAP, link]:
        return True
    total = 0.0
    e = li[HEAD, link]
    while e >= 0:
        total += sf[FCAP, e // maxr]
        e = inc[NEXT, e]
    return total > lf[CAP, link] * SLACK


@njit(cache=True, inline="always")
def _tight_now(link: int, li: np.ndarray, lf: np.ndarray, sf: np.ndarray, inc: np.ndarray, maxr: int,
               epoch: int) -> bool:
    """:func:`_tight`, kept for one allocation (its flows do not change during it)."""
    if li[TEPOCH, link] == epoch:
        return li[TVAL, link] == 1
    hit = _tight(link, li, lf, sf, inc, maxr)
    li[TEPOCH, link] = epoch
    li[TVAL, link] = 1 if hit else 0
    return hit


@njit(cache=True, inline="always")
def _mark(link: int, row: int, count: int, li: np.ndarray, marks: np.ndarray, sc: np.ndarray) -> None:
    """Put ``link`` once in the list ``marks[row - TOUCH]`` (touched or left since the last allocation)."""
    if li[row, link] == 0:
        li[row, link] = 1
        marks[row - TOUCH, sc[count]] = link
        sc[count] += 1


@njit(cache=True, inline="always")
def _first_crossing(route: np.ndarray, slot: int, i: int) -> bool:
    """Whether position ``i`` of the slot's route is its first crossing of that link."""
    link = route[slot, i]
    for j in range(i):  # noqa: SIM110 (a loop: numba compiles no generator into all())
        if route[slot, j] == link:
            return False
    return True


@njit(cache=True, **NO_REFCOUNTS)
def add(slot: int, links: np.ndarray, weights: np.ndarray, private: int, kind: int, key: int, nbytes: float,
        now: float, cap: float, li: np.ndarray, lf: np.ndarray, si: np.ndarray, sf: np.ndarray, route: np.ndarray,
        wts: np.ndarray, inc: np.ndarray, marks: np.ndarray, fresh: np.ndarray, sc: np.ndarray) -> None:
    """Start the flow ``key`` in ``slot``: over ``links`` (then its private cap link ``private`` of capacity
    ``cap``, if >= 0), loading them by ``weights`` (kind WEIGHTED), ``nbytes`` to drain from ``now``; linked onto
    its links' lists, the links whose flows it may slow marked."""
    maxr = route.shape[1]
    shape_n = len(links)
    n = shape_n + 1 if private >= 0 else shape_n
    if kind & WEIGHTED:
        for i in range(shape_n):
            wts[slot, i] = weights[i]
        for i in range(shape_n, maxr):
            wts[slot, i] = 1.0
    elif si[KIND, slot] & WEIGHTED:  # the slot's last flow was weighted
        for i in range(maxr):
            wts[slot, i] = 1.0
    for i in range(shape_n):
        route[slot, i] = links[i]
    if private >= 0:
        route[slot, shape_n] = private
        lf[CAP, private] = cap
    si[RLEN, slot] = n
    si[KIND, slot] = kind
    si[FID, slot] = key
    sf[BYTES, slot] = nbytes
    sf[UPD, slot] = now
    sf[RATE, slot] = 0.0
    sf[FCAP, slot] = cap
    repeats = False
    for i in range(n):
        link = route[slot, i]
        e = slot * maxr + i
        head = li[HEAD, link]
        inc[NEXT, e] = head
        inc[PREV, e] = -1
        if head >= 0:
            inc[PREV, head] = e
        li[HEAD, link] = e
        li[NINC, link] += 1
        if not _first_crossing(route, slot, i):
            repeats = True
        else:
            li[NFL, link] += 1
            if kind & CAPPED_PLAIN and i < shape_n:
                li[NCAP, link] += 1
    if repeats:
        si[KIND, slot] = kind | REPEATS
    si[SHAPE, slot] = shape_n
    si[ACTIVE, slot] = 1
    si[FIDX, slot] = -1  # not frozen by any filling yet
    for i in range(n):  # its component is filled afresh at the next allocation
        li[ADDEP, route[slot, i]] = sc[EPOCH] + 1
    if kind & CAPPED_PLAIN:  # its links' flows are re-rated only where the links may bind; it is rated anyway
        maxr = route.shape[1]
        for i in range(shape_n):
            link = route[slot, i]
            if _tight(link, li, lf, sf, inc, maxr):
                _mark(link, TOUCH, NTOUCH, li, marks, sc)
        if si[FRESH, slot] == 0:
            si[FRESH, slot] = 1
            fresh[sc[NFRESH]] = slot
            sc[NFRESH] += 1
    else:
        for i in range(n):
            _mark(route[slot, i], TOUCH, NTOUCH, li, marks, sc)


@njit(cache=True, **NO_REFCOUNTS)
def remove(slot: int, li: np.ndarray, lf: np.ndarray, si: np.ndarray, sf: np.ndarray, route: np.ndarray,
           inc: np.ndarray, marks: np.ndarray, sc: np.ndarray) -> None:
    """Unlink the flow in ``slot``; the flows it shared links with are re-rated at the next allocation."""
    maxr = route.shape[1]
    n = si[RLEN, slot]
    kind = si[KIND, slot]
    shape_n = si[SHAPE, slot]
    if kind & CAPPED_PLAIN:  # the other flows of a link that may bind (before it goes) may rise
        for i in range(shape_n):
            link = route[slot, i]
            _mark(link, LEFT, NLEFT, li, marks, sc)
            if _tight(link, li, lf, sf, inc, maxr):
                _mark(link, TOUCH, NTOUCH, li, marks, sc)
        si[FRESH, slot] = 0  # (dropped from the fresh list when the allocation reads it)
    else:
        for i in range(shape_n):
            _mark(route[slot, i], TOUCH, NTOUCH, li, marks, sc)
    for i in range(n):
        link = route[slot, i]
        e = slot * maxr + i
        nxt, prv = inc[NEXT, e], inc[PREV, e]
        if prv >= 0:
            inc[NEXT, prv] = nxt
        else:
            li[HEAD, link] = nxt
        if nxt >= 0:
            inc[PREV, nxt] = prv
        li[NINC, link] -= 1
        if _first_crossing(route, slot, i):
            li[NFL, link] -= 1
            if kind & CAPPED_PLAIN and i < shape_n:
                li[NCAP, link] -= 1
    si[ACTIVE, slot] = 0
    si[VER, slot] += 1  # its finish predictions are stale, whoever takes the slot next
    # the filling its component had is kept up to the step that froze it (a flow never frozen: none of it)
    cut = si[POPST, slot] if si[FIDX, slot] >= 0 else -1
    if cut < sc[CUT]:
        sc[CUT] = cut


# -- a binary heap of (key float, version int, id int) in three arrays, the smallest tuple on top ------------------
@njit(cache=True, inline="always")
def _less(hk: np.ndarray, hv: np.ndarray, hi: np.ndarray, a: int, b: int) -> bool:
    if hk[a] != hk[b]:
        return hk[a] < hk[b]
    if hv[a] != hv[b]:
        return hv[a] < hv[b]
    return hi[a] < hi[b]


@njit(cache=True, inline="always")
def _swap(hk: np.ndarray, hv: np.ndarray, hi: np.ndarray, a: int, b: int) -> None:
    hk[a], hk[b] = hk[b], hk[a]
    hv[a], hv[b] = hv[b], hv[a]
    hi[a], hi[b] = hi[b], hi[a]


@njit(cache=True, inline="always")
def _push(hk: np.ndarray, hv: np.ndarray, hi: np.ndarray, size: int, key: float, ver: int, ident: int) -> int:
    i = size
    hk[i], hv[i], hi[i] = key, ver, ident
    while i > 0:
        parent = (i - 1) >> 1
        if _less(hk, hv, hi, i, parent):
            _swap(hk, hv, hi, i, parent)
            i = parent
        else:
            break
    return size + 1


@njit(cache=True, inline="always")
def _pop(hk: np.ndarray, hv: np.ndarray, hi: np.ndarray, size: int) -> int:
    """Remove the top (read it first); returns the new size."""
    size -= 1
    if size > 0:
        hk[0], hv[0], hi[0] = hk[size], hv[size], hi[size]
        _sift_down(hk, hv, hi, size, 0)
    return size


@njit(cache=True, inline="always")
def _sift_down(hk: np.ndarray, hv: np.ndarray, hi: np.ndarray, size: int, i: int) -> None:
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        small = left
        if left + 1 < size and _less(hk, hv, hi, left + 1, left):
            small = left + 1
        if _less(hk, hv, hi, small, i):
            _swap(hk, hv, hi, small, i)
            i = small
        else:
            break


# -- allocation ---------------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _alone_rate(slot: int, lf: np.ndarray, si: np.ndarray, route: np.ndarray, wts: np.ndarray) -> float:
    """The rate of a flow alone on its links: its narrowest one (counted as often as it crosses it; a weighted
    flow's weights there summed)."""
    n = si[RLEN, slot]
    kind = si[KIND, slot]
    best = np.inf
    if kind & (WEIGHTED | REPEATS):
        for i in range(n):
            if not _first_crossing(route, slot, i):
                continue
            link = route[slot, i]
            if kind & WEIGHTED:
                used = 0.0
                for j in range(i, n):
                    if route[slot, j] == link:
                        used += wts[slot, j]
                r = lf[CAP, link] / used
            else:
                times = 0
                for j in range(i, n):
                    if route[slot, j] == link:
                        times += 1
                r = lf[CAP, link] / times
            if r < best:
                best = r
    else:
        for i in range(n):
            c = lf[CAP, route[slot, i]]
            if c < best:
                best = c
    return best


@njit(cache=True, inline="always")
def _set_rate(slot: int, new: float, now: float, si: np.ndarray, sf: np.ndarray, ek: np.ndarray, ev: np.ndarray,
              es: np.ndarray, sc: np.ndarray) -> None:
    """A flow's new rate: progress brought up to ``now`` and a finish predicted where the rate changes."""
    if new == sf[RATE, slot] and si[KIND, slot] & RATED_ONCE:
        return
    sf[BYTES, slot] -= sf[RATE, slot] * (now - sf[UPD, slot])
    sf[UPD, slot] = now
    sf[RATE, slot] = new
    v = si[VER, slot] + 1
    si[VER, slot] = v
    si[KIND, slot] |= RATED_ONCE
    left = sf[BYTES, slot]
    when = now + (left if left > 0.0 else 0.0) / new
    sc[ETA_SIZE] = _push(ek, ev, es, sc[ETA_SIZE], when, v, slot)


@njit(cache=True, inline="always")
def _share(link: int, weighted: bool, li: np.ndarray, lf: np.ndarray) -> float:
    """A link's share as the filling last left it: what is left of its capacity (none if rounding took it below
    zero) over its unfrozen flows (their weights, for a weighted component)."""
    left = lf[FREM, link]
    return (left if left >= 0.0 else 0.0) / (lf[FLOAD, link] if weighted else float(li[FCOUNT, link]))


@njit(cache=True, **NO_REFCOUNTS)
def _fill(members: np.ndarray, nm: int, links: np.ndarray, nl: int, weighted: bool, cut: int, li: np.ndarray,
          lf: np.ndarray, si: np.ndarray, sf: np.ndarray, route: np.ndarray, wts: np.ndarray, inc: np.ndarray,
          epoch: int, sc: np.ndarray, hk: np.ndarray, hv: np.ndarray, hl: np.ndarray) -> None:
    """Progressive filling of one component (``members``, over its tight links ``links``, ``li[SEEN] == epoch``
    on exactly those); each member's rate left in ``sf[NEW]``. ``hk``, ``hv``, ``hl``: room for its heap (the
    links, then a share per crossing of a member: ``nl`` plus the members' route lengths).

    Links come off the heap in (share, version, link) order, as :func:`simulator.engine.network._fill` pops them,
    with the same floats; but a link's share is not pushed at every change. A share only grows as flows freeze
    (a flow freezes at the smallest share, so what it leaves its other links is at least as much), so an entry
    already in the heap for the link stands for its current share: it comes off no later than the current one
    would, and if it is stale then, the current share is pushed (``HVER``: the version of the link's newest entry,
    ``HKEY`` its share). A change that rounds a share below its newest entry's (an ulp, at a tie) is pushed at once.
    The heap holds an entry at most as large as every link's current (share, version), and a current one on top
    is the smallest of all: the order of the eager heap, at a fraction of its pushes (an all-to-all's NIC link
    changes once per flow it carries, and comes off the heap once).

    Each flow frozen is numbered (``FIDX``, in freezing order, the numbers growing across fillings), with the
    number of the first flow its step froze (``POPST``). ``cut`` > 0 (a component that only lost flows since it was
    filled, unweighted): the members numbered below ``cut`` froze, in that order and at those rates, before any
    step that froze a flow now gone, and a filling without those flows freezes them the same way (a link of a gone
    flow shares more, never less, among fewer flows, so it comes off the heap no sooner): their subtractions are
    replayed in their order (the same floats) and the filling goes on from there."""
    maxr = route.shape[1]
    for k in range(nl):
        link = links[k]
        lf[FREM, link] = lf[CAP, link]
        li[FCOUNT, link] = li[NINC, link]
        li[FVER, link] = 0
    if weighted:
        for k in range(nl):
            lf[FLOAD, links[k]] = 0.0
        for k in range(nm):
            f = members[k]
            for i in range(si[RLEN, f]):
                link = route[f, i]
                if li[SEEN, link] == epoch:
                    lf[FLOAD, link] += wts[f, i]
    sc[FILL_EPOCH] += 1
    mark = sc[FILL_EPOCH]
    rated = 0
    size = 0
    if cut > 0:  # the steps kept: their flows in freezing order (a heap of their numbers)
        for k in range(nm):
            f = members[k]
            if 0 <= si[FIDX, f] < cut:
                size = _push(hk, hv, hl, size, float(si[FIDX, f]), 0, f)
        while size > 0:
            f = hl[0]
            size = _pop(hk, hv, hl, size)
            si[RATED, f] = mark
            rated += 1
            share = sf[NEW, f]
            for i in range(si[RLEN, f]):
                other = route[f, i]
                if li[SEEN, other] != epoch:
                    continue
                lf[FREM, other] = lf[FREM, other] - share
                li[FCOUNT, other] -= 1
                li[FVER, other] += 1
    for k in range(nl):  # a heap of every link's share at once (bottom-up)
        link = links[k]
        if li[FCOUNT, link] == 0:
            continue
        v = li[FVER, link]
        hk[size] = _share(link, weighted, li, lf)
        hv[size] = v
        hl[size] = link
        li[HVER, link] = v
        lf[HKEY, link] = hk[size]
        size += 1
    for k in range(size // 2 - 1, -1, -1):
        _sift_down(hk, hv, hl, size, k)
    while size > 0 and rated < nm:
        share, ver, link = hk[0], hv[0], hl[0]
        size = _pop(hk, hv, hl, size)
        if li[FCOUNT, link] == 0:
            continue
        if ver != li[FVER, link]:
            if ver == li[HVER, link]:  # it stood for the link's current share: that share now
                cur = _share(link, weighted, li, lf)
                v = li[FVER, link]
                size = _push(hk, hv, hl, size, cur, v, link)
                li[HVER, link] = v
                lf[HKEY, link] = cur
            continue
        first = sc[FROZEN]
        e = li[HEAD, link]
        while e >= 0:
            f = e // maxr
            e = inc[NEXT, e]
            if si[RATED, f] == mark:
                continue
            si[RATED, f] = mark
            sf[NEW, f] = share
            si[FIDX, f] = sc[FROZEN]
            sc[FROZEN] += 1
            si[POPST, f] = first
            rated += 1
            for i in range(si[RLEN, f]):
                other = route[f, i]
                if li[SEEN, other] != epoch:  # a slack link: it binds no one
                    continue
                w = wts[f, i]
                left = lf[FREM, other] - (share * w if weighted else share)
                lf[FREM, other] = left
                c = li[FCOUNT, other] - 1
                li[FCOUNT, other] = c
                v = li[FVER, other] + 1
                li[FVER, other] = v
                if c > 0:
                    if weighted:
                        rest = lf[FLOAD, other] - w
                        if rest <= 0.0:  # rounding ate what is left (weights 1e15 times apart): sum them again
                            rest = 0.0
                            e2 = li[HEAD, other]
                            while e2 >= 0:
                                g = e2 // maxr
                                if si[RATED, g] != mark:
                                    rest += wts[g, e2 - g * maxr]
                                e2 = inc[NEXT, e2]
                        lf[FLOAD, other] = rest
                        new = (left if left >= 0.0 else 0.0) / rest
                    else:
                        new = (left if left >= 0.0 else 0.0) / c
                    if new < lf[HKEY, other]:  # below the link's newest entry (rounding): pushed now
                        size = _push(hk, hv, hl, size, new, v, other)
                        li[HVER, other] = v
                        lf[HKEY, other] = new


@njit(cache=True, inline="always")
def work_size(li: np.ndarray, si: np.ndarray, inc: np.ndarray, ek: np.ndarray) -> tuple[int, int]:
    """The scratch room :func:`allocate` needs, (int64s, float64s): its lists of flows and links, a component's
    heap, and :func:`next_finish`'s (which needs the last ``2 len(ek) + 1`` of the int64s)."""
    slots, nlinks = si.shape[1], li.shape[1]
    heap = nlinks + inc.shape[1]  # a component's links, then a share per crossing of a member
    return 3 * slots + nlinks + 2 * heap + 2 * len(ek) + 1, heap


@njit(cache=True, **NO_REFCOUNTS)
def _place(now: float, li: np.ndarray, lf: np.ndarray, si: np.ndarray, sf: np.ndarray, route: np.ndarray,
           wts: np.ndarray, inc: np.ndarray, marks: np.ndarray, fresh: np.ndarray, ek: np.ndarray, ev: np.ndarray,
           es: np.ndarray, sc: np.ndarray, work: np.ndarray, fwork: np.ndarray, heap: int, tail: int
           ) -> tuple[int, int]:
    """:func:`allocate`'s work: the flows around the touched links (and the fresh capped ones) found, one connected
    component at a time, filled and given their new rates. Returns how many flows were alone on their links (listed
    in ``work[slots + nlinks:]``) and how many were in components (listed in ``work[2 slots + nlinks:]``)."""
    maxr = route.shape[1]
    nlinks = li.shape[1]
    slots = si.shape[1]
    sc[EPOCH] += 1
    epoch = sc[EPOCH]
    ntouch, nfresh = sc[NTOUCH], sc[NFRESH]
    # the flows to place: those on touched links, then the fresh capped ones
    members = work[:slots]
    links = work[slots:slots + nlinks]
    solos = work[slots + nlinks:2 * slots + nlinks]
    nsolo = 0
    comp_members = work[2 * slots + nlinks:3 * slots + nlinks]  # every component's members, one after another
    hv = work[3 * slots + nlinks:3 * slots + nlinks + heap]
    hl = work[3 * slots + nlinks + heap:tail]
    hk = fwork[:heap]
    total = 0
    for k in range(ntouch + nfresh):
        if k < ntouch:
            e = li[HEAD, marks[0, k]]
            single = -1
        else:
            single = fresh[k - ntouch]
            e = -1
            if si[ACTIVE, single] == 0 or si[FRESH, single] == 0:
                continue
        while True:
            if single >= 0:
                f = single
            elif e >= 0:
                f = e // maxr
                e = inc[NEXT, e]
            else:
                break
            if si[PLACED, f] != epoch:
                si[PLACED, f] = epoch
                start = -1
                for i in range(si[SHAPE, f]):
                    link = route[f, i]
                    if li[NFL, link] > 1 and _tight_now(link, li, lf, sf, inc, maxr, epoch):
                        start = link
                        break
                if start < 0:
                    solos[nsolo] = f
                    nsolo += 1
                else:  # a breadth-first search over the tight links
                    nm = 0
                    nl = 1
                    links[0] = start
                    li[SEEN, start] = epoch
                    added = li[ADDEP, start] == epoch  # a flow came: the component is filled afresh
                    j = 0
                    si[PLACED, f] = epoch - 1  # found again from its link below, in the search's order
                    while j < nl:
                        e2 = li[HEAD, links[j]]
                        j += 1
                        while e2 >= 0:
                            g = e2 // maxr
                            e2 = inc[NEXT, e2]
                            if si[PLACED, g] == epoch:
                                continue
                            si[PLACED, g] = epoch
                            members[nm] = g
                            nm += 1
                            for i in range(si[RLEN, g]):
                                other = route[g, i]
                                if li[SEEN, other] != epoch and _tight_now(other, li, lf, sf, inc, maxr, epoch):
                                    li[SEEN, other] = epoch
                                    links[nl] = other
                                    nl += 1
                                    if li[ADDEP, other] == epoch:
                                        added = True
                    weighted = False
                    for q in range(nm):
                        if si[KIND, members[q]] & WEIGHTED:
                            weighted = True
                            break
                    cut = 0 if added or weighted else sc[CUT]  # flows only left it: the steps before them kept
                    _fill(members, nm, links, nl, weighted, cut, li, lf, si, sf, route, wts, inc, epoch, sc, hk, hv,
                          hl)
                    for q in range(nm):
                        comp_members[total + q] = members[q]
                    total += nm
            if single >= 0:
                break
    for q in range(nsolo):
        f = solos[q]
        _set_rate(f, _alone_rate(f, lf, si, route, wts), now, si, sf, ek, ev, es, sc)
    for q in range(total):
        f = comp_members[q]
        _set_rate(f, sf[NEW, f], now, si, sf, ek, ev, es, sc)
    return nsolo, total


@njit(cache=True, inline="always")
def allocate(now: float, want_changed: bool, li: np.ndarray, lf: np.ndarray, si: np.ndarray, sf: np.ndarray,
             route: np.ndarray, wts: np.ndarray, inc: np.ndarray, marks: np.ndarray, fresh: np.ndarray,
             ek: np.ndarray, ev: np.ndarray, es: np.ndarray, sc: np.ndarray, work: np.ndarray, fwork: np.ndarray
             ) -> tuple[bool, np.ndarray, float, np.ndarray, int]:
    """New max-min rates of the flows around the links touched since the last call, one connected component at a
    time. Returns whether any flow came or went since the last call, the links whose load may have changed (empty
    unless ``want_changed``), :func:`next_finish`'s answer after it, and the finish heap's size. ``work``,
    ``fwork``: scratch room, :func:`work_size` of it at least (the engine keeps them between calls: no allocation
    per call)."""
    nlinks = li.shape[1]
    slots = si.shape[1]
    ints, heap = work_size(li, si, inc, ek)
    tail = ints - (2 * len(ek) + 1)  # next_finish's room
    if sc[NTOUCH] == 0 and sc[NLEFT] == 0 and sc[NFRESH] == 0:  # nothing came or went since the last call
        best, due = next_finish(si, ek, ev, es, sc, work[tail:])
        return False, np.empty(0, np.int64), best, due, sc[ETA_SIZE]
    nsolo, total = _place(now, li, lf, si, sf, route, wts, inc, marks, fresh, ek, ev, es, sc, work, fwork, heap,
                          tail)
    ntouch, nleft, nfresh = sc[NTOUCH], sc[NLEFT], sc[NFRESH]
    solos = work[slots + nlinks:2 * slots + nlinks]
    comp_members = work[2 * slots + nlinks:3 * slots + nlinks]
    nchanged = 0
    changed = np.empty(0, np.int64)
    if want_changed:
        room = ntouch + nleft
        for q in range(nsolo):
            room += si[RLEN, solos[q]]
        for q in range(total):
            room += si[RLEN, comp_members[q]]
        changed = np.empty(room, np.int64)
        for k in range(ntouch):
            changed[nchanged] = marks[0, k]
            nchanged += 1
        for k in range(nleft):
            changed[nchanged] = marks[1, k]
            nchanged += 1
        for q in range(nsolo):
            f = solos[q]
            for i in range(si[RLEN, f]):
                changed[nchanged] = route[f, i]
                nchanged += 1
        for q in range(total):
            f = comp_members[q]
            for i in range(si[SHAPE, f]):
                changed[nchanged] = route[f, i]
                nchanged += 1
    for k in range(ntouch):
        li[TOUCH, marks[0, k]] = 0
    for k in range(nleft):
        li[LEFT, marks[1, k]] = 0
    for k in range(nfresh):
        si[FRESH, fresh[k]] = 0
    sc[NTOUCH] = 0
    sc[NLEFT] = 0
    sc[NFRESH] = 0
    sc[CUT] = NO_CUT
    best, due = next_finish(si, ek, ev, es, sc, work[tail:])
    return True, changed[:nchanged], best, due, sc[ETA_SIZE]


@njit(cache=True)
def next_finish(si: np.ndarray, ek: np.ndarray, ev: np.ndarray, es: np.ndarray, sc: np.ndarray, work: np.ndarray
                ) -> tuple[float, np.ndarray]:
    """Earliest predicted finish and the keys of every flow predicted to finish then (within ``FINISH_RTOL``).

    Entries of flows since re-rated or finished are dropped when they reach the top; the flows due are read off
    the heap in place (every entry within the tolerance of the top has all its ancestors within it too).
    ``work``: scratch room for ``2 len(ek) + 1`` int64s."""
    size = sc[ETA_SIZE]
    while size > 0:
        s = es[0]
        if si[ACTIVE, s] == 1 and si[VER, s] == ev[0]:
            break
        size = _pop(ek, ev, es, size)
    sc[ETA_SIZE] = size
    if size == 0:
        return np.inf, np.empty(0, np.int64)
    best = ek[0]
    tol = FINISH_RTOL * (best if best > 1e-30 else 1e-30)
    due = work[:size]
    nd = 0
    stack = work[size:2 * size + 1]
    stack[0] = 0
    top = 1
    while top > 0:
        top -= 1
        i = stack[top]
        if ek[i] - best <= tol:
            s = es[i]
            if si[ACTIVE, s] == 1 and si[VER, s] == ev[i]:
                due[nd] = si[FID, s]
                nd += 1
            i = 2 * i + 1
            if i < size:
                stack[top] = i
                top += 1
                if i + 1 < size:
                    stack[top] = i + 1
                    top += 1
    return best, np.sort(due[:nd])


@njit(cache=True)
def load(link: int, li: np.ndarray, sf: np.ndarray, wts: np.ndarray, inc: np.ndarray, maxr: int) -> float:
    """Bytes/s of ``link``'s capacity in use (each crossing of a flow counted, weighted where it is)."""
    total = 0.0
    e = li[HEAD, link]
    while e >= 0:
        f = e // maxr
        total += sf[RATE, f] * wts[f, e - f * maxr]
        e = inc[NEXT, e]
    return total


@njit(cache=True)
def relayout(li: np.ndarray, inc: np.ndarray, maxr: int, new_maxr: int) -> np.ndarray:
    """The incidence lists re-numbered for ``new_maxr`` positions per slot (each link's order kept)."""
    slots = inc.shape[1] // maxr
    out = np.full((2, slots * new_maxr), -1, np.int64)
    for link in range(li.shape[1]):
        e = li[HEAD, link]
        prev = -1
        while e >= 0:
            f = e // maxr
            ne = f * new_maxr + (e - f * maxr)
            if prev >= 0:
                out[NEXT, prev] = ne
            else:
                li[HEAD, link] = ne
            out[PREV, ne] = prev
            prev = ne
            e = inc[NEXT, e]
    return out
