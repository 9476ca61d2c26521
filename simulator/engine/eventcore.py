"""The engine's event loop compiled (numba): the calendar, every op's life cycle and the flow network in machine code.

:mod:`simulator.engine.core` describes the model and prepares the schedule as columns (one array per op field:
kind, rank, its match, its duration, its route's index...); :func:`run` then runs the simulation, a budget of
callbacks per call.
What each op does is the model of :mod:`simulator.engine.core`'s docstring; this module is that model over arrays:

* the calendar: a binary heap of callbacks ordered by (time, order of scheduling), so every callback due at one
  instant runs in the order it was scheduled (a row per callback, its four numbers side by side: a sift touches one
  row per level, where four arrays cost four cache misses per level once the heap outgrows the caches: a tree decode
  of 131,072 GPUs simulates about a sixth faster; any heap pops the same sequence), and the flows' rates are
  recomputed once per instant at which flows started or finished, after every other callback of that instant (it may
  schedule more at the same instant: they run, then rates again if flows came or went);
* callbacks: an op ready (``READY``: its dependencies met; it waits for ``not_before_s``, and on a host thread for
  its turn in program order), a kernel or a collective's launch done (``DONE``, ``LAUNCHED``), a transfer's latency
  paid (``INJECT``: its flow starts; ``FINISH``: an empty or local transfer ends), flows drained (``DRAINED``: the
  flows due at the predicted finish, unless rates changed since the prediction);
* an op that ends readies the ops that waited only for it, in op-id order; a kernel of no duration on a host thread
  ends at once, and its dependents are readied before the rest of the ending op's (a stack of ending ops, as the
  recursive calls of a Python engine would visit them).

Times are computed with the floating-point operations of the engine's model, in the same order: a callback
scheduled ``delay`` from now runs at ``now + delay``.

The state's arrays are read through :func:`~simulator.engine.borrow.borrow` (``_b(s.kind)[op]``): a view without
reference counts, so that the loop does not spend its time on numba's atomic increments and decrements (a quarter of
it before, in ``perf``); the calendar's and the frames' arrays, which grow, are borrowed only until the next call
that may replace them.

What a fresh install compiles (issue 41): numba compiles every compiled function it keeps apart with all it calls
(and re-optimizes them), so the helpers of one caller are inlined into it (``inline="always"``) and only the loop,
``_ready``, ``_done`` and ``_at`` are kept apart; each is compiled once (:class:`~simulator.support.jitcache.
OneSignature`, op ids read as int64); and the state's type is declared (:data:`STATE`), so that the loop compiles
(:mod:`simulator.engine.warmup`) without a state made first, beside the rest in another process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numba import types
from numba.experimental import structref

from simulator.engine import netstate as ns
from simulator.engine.borrow import borrow as _b
from simulator.support.arraycopy import put1, put2
from simulator.support.jitcache import njit

__all__ = ["F_SLOWED", "NEW_STATE_ARGS", "STATE", "EngineState", "new_state", "records", "results", "run", "seed"]

# callbacks
READY, DONE, LAUNCHED, INJECT, FINISH, DRAINED = range(6)
# op kinds: indices into simulator.schedule.core.OP_KINDS
K_COMPUTE, K_MERGE, K_SEND, K_RECV, K_LAUNCH = range(5)
# op flags
F_READY, F_HELD, F_SLOWED = 1, 2, 4  # F_SLOWED: a kernel that ran slower than alone for a while (contention)


@structref.register
class EngineStateType(types.StructRef):
    def preprocess_fields(self, fields: tuple[tuple[str, types.Type], ...]) -> tuple[tuple[str, types.Type], ...]:
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class EngineState(structref.StructRefProxy):
    """A simulation's state (read and changed only by this module's compiled functions)."""

    if TYPE_CHECKING:  # its fields, as the compiled functions see them
        def __getattr__(self, name: str) -> Any: ...

        def __setattr__(self, name: str, value: Any) -> None: ...


_I, _F, _B, _I32, _U8 = types.int64, types.float64, types.boolean, types.int32, types.uint8
_I1, _F1, _I2, _F2, _I32_1, _U8_1 = _I[::1], _F[::1], _I[:, ::1], _F[:, ::1], _I32[::1], _U8[::1]  # contiguous arrays
_FIELDS: tuple[tuple[str, types.Type], ...] = (  # declared: compiled code can be compiled for the state's type ahead
    # per op (ids): kind, rank, match (-1), route index (sends; -1), weights row (sends; -1: none), host kernel row
    # (kernels on shared host cores; -1), in a collective (1/0), pending dependencies, flags, flow slot
    ("kind", _U8_1), ("rank", _I32_1), ("match", _I32_1), ("path", _I32_1), ("wrow", _I32_1), ("hrow", _I32_1),
    ("coll", _U8_1), ("pending", _I32_1), ("flag", _U8_1), ("slot", _I32_1),
    # per op (seconds, bytes): duration (kernels; a launch's fixed time), not_before_s, floor_s, nbytes, rate_cap,
    # start and end (NaN until then)
    ("dur", _F1), ("not_before", _F1), ("floor", _F1), ("nbytes", _F1), ("rate_cap", _F1), ("start", _F1),
    ("end", _F1),
    ("kids", _I32_1), ("first_kid", _I1),  # dependents as CSR: op d's are kids[first_kid[d]:first_kid[d + 1]]
    # contention (simulator.engine.core): per op, the SMs a transfer's end holds in flight, and a kernel's row of
    # rates (speed against alone with h SMs held, column h); per rank, the most SMs its transfers hold at once
    ("ctas", _I32_1), ("srow", _I32_1), ("srate", _F2), ("hmax", _I1),
    # per rank: program order (host threads), compute stream
    ("prog", _I1), ("prog_start", _I1), ("cursor", _I1), ("stream_free", _F1),
    ("plinks", _I2), ("plen", _I1), ("plat", _F1),  # routes (link ids, then host copy links), lengths, latencies
    ("wtab", _F2),  # weights rows: per link of a route
    ("hlinks", _I2), ("hlen", _I1), ("hwork", _F1), ("hwts", _F2), ("hweighted", _U8_1),  # host kernels
    # with contention, per rank: how many transfer ends in flight hold each count of SMs (row: rank, column: count)
    # and the largest count held, the kernel running (-1: none) and its work left, since when, at what rate and its
    # predicted end; the FIFO of kernels waiting for the stream (first, last; per op: the next)
    ("contend", _B), ("hcnt", _I2), ("hcur", _I1), ("run", _I1), ("rleft", _F1), ("rsince", _F1), ("rrate", _F1),
    ("rend", _F1), ("qhead", _I1), ("qtail", _I1), ("qnext", _I32_1),
    ("net", ns.NET_STATE),  # the flow network
    # the calendar: a binary heap of rows (time, order, callback, argument), each row's four in one cache line's
    # half (an order, a callback and an argument are integers below 2^53: exact as floats); its size and count
    ("cal", _F2), ("csize", _I), ("cseq", _I),
    ("frames", _I2), ("fpos", _I1),  # the stack of ending ops (op, issue flag) and each one's next dependent
    # hold_posted: a transfer's end holds its SMs from its post (a program's op order), else from the transfer's start
    ("now", _F), ("last", _F), ("msg_s", _F), ("comm_s", _F), ("in_order", _B), ("hold_posted", _B), ("dirty", _B),
    ("generation", _I),
    ("events", _I), ("instants", _I),
    ("record", _B), ("nedges", _I), ("rec_t", _F1), ("rec_l", _I1), ("rec_v", _F1), ("nrec", _I),  # link loads
)
structref.define_proxy(EngineState, EngineStateType, [name for name, _ in _FIELDS])
STATE = EngineStateType(_FIELDS)  # the type new_state returns (a test holds them equal)
_COLUMNS = ("kind", "rank", "match", "path", "wrow", "hrow", "coll", "pending", "dur", "not_before", "floor",
            "nbytes", "rate_cap", "kids", "first_kid", "ctas", "srow", "srate", "hmax", "prog", "prog_start", "plinks",
            "plen", "plat", "wtab", "hlinks", "hlen", "hwork", "hwts", "hweighted")
# new_state's argument types: the schedule's columns as simulator.engine.core makes them, the links' capacities, ...
NEW_STATE_ARGS = (*(dict(_FIELDS)[name] for name in _COLUMNS), _F1, _F, _F, _B, _B, _B, _I)


@njit(cache=True)
def new_state(kind: np.ndarray, rank: np.ndarray, match: np.ndarray, path: np.ndarray, wrow: np.ndarray,
              hrow: np.ndarray, coll: np.ndarray, pending: np.ndarray, dur: np.ndarray, not_before: np.ndarray,
              floor: np.ndarray, nbytes: np.ndarray, rate_cap: np.ndarray, kids: np.ndarray, first_kid: np.ndarray,
              ctas: np.ndarray, srow: np.ndarray, srate: np.ndarray, hmax: np.ndarray,
              prog: np.ndarray, prog_start: np.ndarray, plinks: np.ndarray, plen: np.ndarray, plat: np.ndarray,
              wtab: np.ndarray, hlinks: np.ndarray, hlen: np.ndarray, hwork: np.ndarray, hwts: np.ndarray,
              hweighted: np.ndarray, capacity: np.ndarray, msg_s: float, comm_s: float, in_order: bool,
              hold_posted: bool, record: bool, nedges: int) -> EngineState:
    """A simulation ready to :func:`run` (the arrays are the schedule's columns, see the fields above)."""
    n = len(kind)
    ranks = len(prog_start) - 1
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    contend = False
    most = np.int64(0)
    for i in range(len(ctas)):  # (empty where no transfer holds SMs)
        c = np.int64(ctas[i])
        if c > 0:
            contend = True
            if c > most:
                most = c
    queued = n if contend else 0
    counts = ranks if contend else 0
    return EngineState(kind, rank, match, path, wrow, hrow, coll, pending, np.zeros(n, np.uint8),
                       np.full(n, -1, np.int32), dur, not_before, floor, nbytes, rate_cap, start, end, kids,
                       first_kid, ctas, srow, srate, hmax, prog, prog_start, np.zeros(ranks, np.int64),
                       np.zeros(ranks), plinks, plen, plat, wtab, hlinks, hlen, hwork, hwts, hweighted, contend,
                       np.zeros((counts, most + 1), np.int64), np.zeros(ranks, np.int64), np.full(ranks, -1, np.int64),
                       np.zeros(ranks), np.zeros(ranks), np.ones(ranks), np.zeros(ranks), np.full(ranks, -1, np.int64),
                       np.full(ranks, -1, np.int64), np.full(queued, -1, np.int32), ns.net_new(capacity),
                       np.zeros((16, 4)), 0, 0, np.zeros((2, 2), np.int64), np.zeros(2, np.int64), 0.0, np.nan,
                       msg_s, comm_s, in_order, hold_posted, False, 0, 0, 0, record, nedges, np.zeros(0),
                       np.zeros(0, np.int64), np.zeros(0), 0)


# -- the calendar ---------------------------------------------------------------------------------------------------
@njit(cache=True)
def _at(s: EngineState, delay: float, callback: int, arg: int) -> None:
    """Run ``callback(arg)`` ``delay`` seconds from now (after every callback already due then)."""
    if delay < 0.0:
        raise ValueError("a callback scheduled in the past")
    when = s.now + delay
    n = s.csize
    if n == s.cal.shape[0]:
        cal = np.zeros((2 * n, 4))
        put2(cal, s.cal)
        s.cal = cal
    cal = _b(s.cal)
    seq = s.cseq
    s.cseq = seq + 1
    i = n
    while i > 0:  # sift up: (time, seq) with seq larger than every entry's, so a tie on time stays below
        p = (i - 1) >> 1
        if cal[p, 0] <= when:
            break
        cal[i, 0], cal[i, 1], cal[i, 2], cal[i, 3] = cal[p, 0], cal[p, 1], cal[p, 2], cal[p, 3]
        i = p
    cal[i, 0], cal[i, 1], cal[i, 2], cal[i, 3] = when, seq, callback, arg
    s.csize = n + 1


@njit(cache=True, inline="always")
def _pop(s: EngineState) -> tuple[float, int, int]:
    """The earliest callback (time, callback, argument), taken off the calendar."""
    cal = _b(s.cal)
    when, callback, arg = cal[0, 0], int(cal[0, 2]), int(cal[0, 3])
    n = s.csize - 1
    s.csize = n
    if n > 0:
        t, q, y, a = cal[n, 0], cal[n, 1], cal[n, 2], cal[n, 3]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and (cal[c + 1, 0] < cal[c, 0] or
                              (cal[c + 1, 0] == cal[c, 0] and cal[c + 1, 1] < cal[c, 1])):
                c += 1
            if t < cal[c, 0] or (t == cal[c, 0] and q < cal[c, 1]):
                break
            cal[i, 0], cal[i, 1], cal[i, 2], cal[i, 3] = cal[c, 0], cal[c, 1], cal[c, 2], cal[c, 3]
            i = c
        cal[i, 0], cal[i, 1], cal[i, 2], cal[i, 3] = t, q, y, a
    return when, callback, arg


# -- op life cycle ----------------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _thread(s: EngineState, rank: int) -> bool:
    """Whether the rank is a host thread (it has a program order: its host's cores are shared)."""
    return _b(s.prog_start)[rank + 1] > _b(s.prog_start)[rank]


@njit(cache=True, inline="always")
def _issued(s: EngineState, rank: int) -> None:
    """A host thread is done issuing its current op: its next op in program order may start once it is ready."""
    cur = _b(s.cursor)[rank] + 1
    _b(s.cursor)[rank] = cur
    i = _b(s.prog_start)[rank] + cur
    if i < _b(s.prog_start)[rank + 1]:
        nxt = _b(s.prog)[i]
        if _b(s.flag)[nxt] & F_HELD:
            _b(s.flag)[nxt] &= ~F_HELD
            _at(s, 0.0, READY, nxt)


@njit(cache=True, inline="always")
def _start_transfer(s: EngineState, send: int, recv: int) -> None:
    now = s.now
    _b(s.start)[send] = now
    _b(s.start)[recv] = now
    if s.contend and not s.hold_posted:  # both ends' kernels hold their SMs from now until the transfer ends
        _hold(s, np.int64(_b(s.rank)[send]), np.int64(_b(s.ctas)[send]), 1)
        _hold(s, np.int64(_b(s.rank)[recv]), np.int64(_b(s.ctas)[recv]), 1)
    p = _b(s.path)[send]
    delay = s.msg_s + _b(s.plat)[p]
    floor = _b(s.floor)[send]
    if delay < floor:
        delay = floor
    elif floor < 0.0:  # STREAMED: a later step of a pipeline, its latency hidden behind the steps before it
        delay = 0.0
    if _b(s.coll)[send] == 0:
        delay += s.comm_s
    if _b(s.plen)[p] == 0 or _b(s.nbytes)[send] == 0.0:
        _at(s, delay, FINISH, send)
    else:
        _at(s, delay, INJECT, send)


@njit(cache=True, inline="always")
def _posted(s: EngineState, op: int, kind: int) -> None:
    """A send or receive is posted (ready): its kernel holds its SMs from now (``hold_posted``); once both ends
    are posted, the transfer starts."""
    if s.contend and s.hold_posted:
        _hold(s, np.int64(_b(s.rank)[op]), np.int64(_b(s.ctas)[op]), 1)
    m = np.int64(_b(s.match)[op])  # (the int32 columns' ids read as int64: one signature per function)
    if _b(s.flag)[m] & F_READY:
        if kind == K_SEND:
            _start_transfer(s, op, m)
        else:
            _start_transfer(s, m, op)


@njit(cache=True, inline="always")
def _start_kernel(s: EngineState, op: int) -> int:
    """A kernel of a host thread starts: work drained over its host's cores. Returns ``op`` if it has no duration
    (it ends at once: the caller ends it), else -1."""
    _b(s.start)[op] = s.now
    if not _b(s.dur)[op] > 0.0:  # (core refuses a NaN duration)
        return op
    h = _b(s.hrow)[op]
    links = _b(s.hlinks)[h, :_b(s.hlen)[h]]
    _b(s.slot)[op] = ns.net_add(s.net, op, links, _b(s.hwts)[h], _b(s.hweighted)[h] != 0, _b(s.hwork)[h], s.now, 0.0)
    s.dirty = True
    return -1


@njit(cache=True, inline="always")
def _kernel_rate(s: EngineState, rank: int, op: int) -> float:
    """How fast a kernel progresses (1: as its duration says) while its rank's transfers hold ``h`` SMs (the most
    any transfer end in flight there holds, at most ``hmax``): its duration alone over its duration on the SMs left
    (a row of the rate table per kernel cost, made by simulator.engine.core)."""
    h = _b(s.hcur)[rank]
    most = _b(s.hmax)[rank]
    if h > most:
        h = most
    if h <= 0:
        return 1.0
    return _b(s.srate)[np.int64(_b(s.srow)[op]), h]


@njit(cache=True, inline="always")
def _predict(s: EngineState, rank: int, op: int, left: float, rate: float) -> None:
    """(With contention) the running kernel ``op`` has ``left`` seconds of work (alone) from now, done at ``rate``:
    its end predicted (an earlier prediction goes stale)."""
    now = s.now
    _b(s.rleft)[rank] = left
    _b(s.rsince)[rank] = now
    _b(s.rrate)[rank] = rate
    if rate < 1.0:
        _b(s.flag)[op] |= F_SLOWED
    delay = left / rate
    _b(s.rend)[rank] = now + delay
    _at(s, delay, DONE, op)


@njit(cache=True, inline="always")
def _begin(s: EngineState, rank: int, op: int) -> None:
    """(With contention) ``op`` starts on its rank's compute stream now, its end predicted at the current rate."""
    _b(s.run)[rank] = op
    _b(s.start)[op] = s.now
    _predict(s, rank, op, _b(s.dur)[op], _kernel_rate(s, rank, op))


@njit(cache=True, inline="always")
def _kernel_ready(s: EngineState, rank: int, op: int) -> None:
    """(With contention) a kernel is ready: it starts if its rank's stream is free, else waits in its FIFO."""
    if _b(s.run)[rank] < 0:
        _begin(s, rank, op)
        return
    _b(s.qnext)[op] = -1
    last = _b(s.qtail)[rank]
    if last < 0:
        _b(s.qhead)[rank] = op
    else:
        _b(s.qnext)[last] = op
    _b(s.qtail)[rank] = op


@njit(cache=True, inline="always")
def _hold(s: EngineState, rank: int, ctas: int, sign: int) -> None:
    """(With contention) a transfer's end on ``rank`` that holds ``ctas`` SMs starts (``sign`` 1) or ends (-1): the
    running kernel's work so far is counted at its old rate and its end predicted again at the new one (its old
    prediction goes stale), where the rate changes."""
    if ctas <= 0:
        return
    left = _b(s.hcnt)[rank, ctas] + sign
    _b(s.hcnt)[rank, ctas] = left
    h = _b(s.hcur)[rank]
    if sign > 0 and ctas > h:
        _b(s.hcur)[rank] = ctas
    elif sign < 0 and left == 0 and ctas == h:  # the most held is gone: the next count still held
        while h > 0 and _b(s.hcnt)[rank, h] == 0:
            h -= 1
        _b(s.hcur)[rank] = h
    op = _b(s.run)[rank]
    if op < 0:
        return
    rate = _kernel_rate(s, rank, op)
    if rate == _b(s.rrate)[rank]:
        return
    left = _b(s.rleft)[rank] - (s.now - _b(s.rsince)[rank]) * _b(s.rrate)[rank]
    _predict(s, rank, op, left if left > 0.0 else 0.0, rate)


@njit(cache=True, inline="always")
def _released(s: EngineState, send: int) -> None:
    """(With contention) both ends of a transfer that ended give back their SMs."""
    _hold(s, np.int64(_b(s.rank)[send]), np.int64(_b(s.ctas)[send]), -1)
    m = np.int64(_b(s.match)[send])
    _hold(s, np.int64(_b(s.rank)[m]), np.int64(_b(s.ctas)[m]), -1)


@njit(cache=True, inline="always")
def _ready_in_order(s: EngineState, op: int) -> int:
    """An op of a host thread: it waits for its turn in program order. Returns a kernel that ended at once, or -1."""
    rank = _b(s.rank)[op]
    if _b(s.prog)[_b(s.prog_start)[rank] + _b(s.cursor)[rank]] != op:
        _b(s.flag)[op] |= F_HELD
        return -1
    kind = _b(s.kind)[op]
    if kind in (K_SEND, K_RECV):  # posted: the thread goes on to its next op
        _issued(s, rank)
    _b(s.flag)[op] |= F_READY
    if kind <= K_MERGE:  # its turn: the rank's previous kernel has returned
        return _start_kernel(s, op)
    if kind == K_LAUNCH:
        _b(s.start)[op] = s.now
        _at(s, _b(s.dur)[op], LAUNCHED, op)
    else:
        _posted(s, op, kind)
    return -1


@njit(cache=True)
def _ready(s: EngineState, op: int) -> int:
    """``op``'s dependencies are met. Returns a kernel of a host thread that ended at once (no duration), or -1."""
    now = s.now
    nb = _b(s.not_before)[op]
    if now < nb:
        _at(s, nb - now, READY, op)
        return -1
    rank = _b(s.rank)[op]
    if s.in_order and _thread(s, rank):
        return _ready_in_order(s, op)
    kind = _b(s.kind)[op]
    if kind <= K_MERGE and s.contend:
        _kernel_ready(s, rank, op)
    elif kind <= K_MERGE:  # one FIFO compute stream per rank
        begin = _b(s.stream_free)[rank]
        if begin < now:
            begin = now
        end = begin + _b(s.dur)[op]
        _b(s.stream_free)[rank] = end
        _b(s.start)[op] = begin
        _at(s, end - now, DONE, op)
    elif kind == K_LAUNCH:
        _b(s.start)[op] = now
        _at(s, _b(s.dur)[op], LAUNCHED, op)
    else:
        _b(s.flag)[op] |= F_READY
        _posted(s, op, kind)
    return -1


@njit(cache=True, inline="always")
def _push_frame(s: EngineState, top: int, op: int, issue: int) -> None:
    if top == s.frames.shape[1]:
        frames = np.zeros((2, 2 * top), np.int64)
        put2(frames, s.frames)
        fpos = np.zeros(2 * top, np.int64)
        put1(fpos, s.fpos, top)
        s.frames, s.fpos = frames, fpos
    _b(s.end)[op] = s.now
    _b(s.frames)[0, top] = op
    _b(s.frames)[1, top] = issue
    _b(s.fpos)[top] = _b(s.first_kid)[op]


@njit(cache=True)
def _done(s: EngineState, op: int, issue: bool) -> None:
    """``op`` has ended: the ops that waited only for it become ready (in op-id order); ``issue``: then its host
    thread goes on to its next op (a kernel's return)."""
    _push_frame(s, 0, op, 1 if issue else 0)
    top = 1
    kids, first, pending = _b(s.kids), _b(s.first_kid), _b(s.pending)
    while top > 0:
        f = top - 1
        o = _b(s.frames)[0, f]
        pos = _b(s.fpos)[f]
        if pos < first[o + 1]:
            _b(s.fpos)[f] = pos + 1
            child = np.int64(kids[pos])
            left = pending[child] - 1
            pending[child] = left
            if left == 0:
                z = _ready(s, child)
                if z >= 0:  # a host thread's kernel of no duration: it ends now, its dependents first
                    _push_frame(s, top, z, 1)
                    top += 1
        else:
            top = f
            if _b(s.frames)[1, f]:
                _issued(s, _b(s.rank)[o])


@njit(cache=True, inline="always")
def _kernel_end(s: EngineState, op: int) -> None:
    """(With contention) a kernel's predicted end: unless predicted again since, it ends, and the next kernel
    waiting for its rank's stream starts."""
    rank = np.int64(_b(s.rank)[op])
    if _b(s.run)[rank] != op or s.now != _b(s.rend)[rank]:
        return  # re-timed since (its rank's transfers took or gave back SMs)
    _b(s.run)[rank] = -1
    nxt = np.int64(_b(s.qhead)[rank])
    if nxt >= 0:
        after = np.int64(_b(s.qnext)[nxt])
        _b(s.qhead)[rank] = after
        if after < 0:
            _b(s.qtail)[rank] = -1
        _begin(s, rank, nxt)
    _done(s, op, False)


@njit(cache=True, inline="always")
def _ended_transfer_end(s: EngineState, op: int) -> None:
    """One end of a drained transfer ends (its end recorded alone where no op depends on it: most sends)."""
    if _b(s.first_kid)[op] == _b(s.first_kid)[op + 1]:
        _b(s.end)[op] = s.now
    else:
        _done(s, op, False)


@njit(cache=True, inline="always")
def _drained(s: EngineState, generation: int) -> None:
    if generation != s.generation:
        return  # rates changed since this finish was predicted
    due = s.net.due
    for i in range(len(due)):
        flow = due[i]
        ns.net_remove(s.net, np.int64(_b(s.slot)[flow]))
        if _b(s.kind)[flow] == K_SEND:
            if s.contend:
                _released(s, flow)
            _ended_transfer_end(s, flow)
            _ended_transfer_end(s, np.int64(_b(s.match)[flow]))
        else:  # a kernel on shared host cores
            _done(s, flow, True)
    s.dirty = True


@njit(cache=True, inline="always")
def _reallocate(s: EngineState) -> None:
    s.dirty = False
    s.events += 1
    now = s.now
    did, changed = ns.net_allocate(s.net, now, s.record)
    if s.record and did and len(changed):
        links = np.sort(changed)  # distinct (np.unique's answer; the sort is compiled for the flows due anyway)
        k = 0
        for i in range(len(links)):
            if k == 0 or links[i] != links[k - 1]:
                links[k] = links[i]
                k += 1
        links = links[:k]
        need = s.nrec + len(links)
        if need > len(s.rec_t):
            size = max(2 * len(s.rec_t), need, 64)
            rt, rl, rv = np.zeros(size), np.zeros(size, np.int64), np.zeros(size)
            put1(rt, s.rec_t, s.nrec)
            put1(rl, s.rec_l, s.nrec)
            put1(rv, s.rec_v, s.nrec)
            s.rec_t, s.rec_l, s.rec_v = rt, rl, rv
        for link in links:
            if link < s.nedges:  # not a virtual core or memory link
                k = s.nrec
                s.rec_t[k] = now
                s.rec_l[k] = link
                s.rec_v[k] = ns.net_load(s.net, link)
                s.nrec = k + 1
    s.generation += 1
    when, due = ns.net_next(s.net)
    if len(due):
        _at(s, when - now, DRAINED, s.generation)


@njit(cache=True, inline="always")
def _callback(s: EngineState, callback: int, arg: int) -> None:
    if callback == READY:
        z = _ready(s, arg)
        if z >= 0:
            _done(s, z, True)
    elif callback == DONE and s.contend:
        _kernel_end(s, arg)
    elif callback == DONE:
        _done(s, arg, False)
    elif callback == LAUNCHED:
        _done(s, arg, _thread(s, _b(s.rank)[arg]))
    elif callback == INJECT:
        p = _b(s.path)[arg]
        w = _b(s.wrow)[arg]
        links = _b(s.plinks)[p, :_b(s.plen)[p]]
        _b(s.slot)[arg] = ns.net_add(s.net, arg, links, _b(s.wtab)[max(w, 0)], w >= 0, _b(s.nbytes)[arg], s.now,
                                     _b(s.rate_cap)[arg])
        s.dirty = True  # rates are recomputed once every other callback of this instant has run
    elif callback == FINISH:
        if s.contend:
            _released(s, arg)
        _done(s, arg, False)
        _done(s, np.int64(_b(s.match)[arg]), False)
    else:
        _drained(s, arg)


@njit(cache=True)
def seed(s: EngineState, roots: np.ndarray) -> None:
    """Schedule the ops with no dependencies (``roots``, in op-id order): each ready at its ``not_before_s``."""
    for i in range(len(roots)):
        _at(s, _b(s.not_before)[roots[i]], READY, roots[i])


@njit(cache=True)
def run(s: EngineState, budget: int) -> bool:
    """Run up to about ``budget`` callbacks (the rest of an instant's rate recomputation included); returns whether
    the calendar is empty (the simulation is over). Called again, it goes on where it stopped: the caller returns
    to Python between calls (an interrupt lands there)."""
    stop = s.events + budget
    while s.csize > 0 and s.events < stop:
        when, callback, arg = _pop(s)
        if when != s.last:
            s.instants += 1
            s.last = when
        s.now = when
        s.events += 1
        _callback(s, callback, arg)
        if s.dirty and (s.csize == 0 or s.cal[0, 0] != when):
            _reallocate(s)  # may schedule more at this same instant: they run next
    return s.csize == 0


@njit(cache=True)
def results(s: EngineState) -> tuple[np.ndarray, np.ndarray, int, int, int, int, np.ndarray]:
    """Every op's start and end (NaN: never), the callbacks run (rate recomputations included), the instants they
    ran at, the allocations that re-rated flows, the link loads recorded and each op's flags (``F_SLOWED``)."""
    return s.start, s.end, s.events, s.instants, s.net.allocations, s.nrec, s.flag


@njit(cache=True)
def records(s: EngineState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The link loads recorded: times, link ids, bytes/s."""
    return s.rec_t[:s.nrec].copy(), s.rec_l[:s.nrec].copy(), s.rec_v[:s.nrec].copy()
