"""The all-gather and reduce-scatter of pieces built as one block of columns append the ops that one
``add_transfer`` (and ``add_compute``) per move append (issue 41: a plan's all-gather prefill schedules were built a
Python call per transfer)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.collectives.alltoall import pairwise_alltoall
from simulator.collectives.pieces import _launch, ring_allgather_pieces, ring_reduce_scatter_pieces
from simulator.schedule.core import Schedule


def _one_by_one(sched: Schedule, order: Sequence[int], name: Callable[[int], str], nbytes: Callable[[int], float],
                *, tag: str, deps: Mapping[int, Iterable[int]]) -> dict[int, tuple[int, ...]]:
    """ring_allgather_pieces as it was: one add_transfer per move, step after step."""
    p = len(order)
    front = _launch(sched, order, tag, "allgather", name(order[0]), deps)
    held = {r: list(front[r]) for r in order}
    last_send: dict[int, list[int]] = {r: [] for r in order}
    for k in range(p - 1):
        new_recv: dict[int, int] = {}
        new_send: dict[int, list[int]] = {}
        for i, r in enumerate(order):
            owner, dst = order[(i - k) % p], order[(i + 1) % p]
            snd, recv = sched.add_transfer(r, dst, nbytes(owner), tag, send_deps=held[r] + last_send[r],
                                           recv_deps=held[dst], args=(name(owner),),
                                           alloc=[(name(owner), nbytes(owner))], coll=tag)
            new_recv[dst], new_send[r] = recv, [snd]
        for r in order:
            held[r] = [new_recv[r]]
            last_send[r] = new_send[r]
            front[r].append(new_recv[r])
    return {r: tuple(ids) for r, ids in front.items()}


def _reduce_scatter_one_by_one(sched: Schedule, order: Sequence[int], full: str,
                               rows: Callable[[int], tuple[int, int]], nbytes: Callable[[int], float],
                               elems: Callable[[int], float], *, out: Callable[[int], str], tag: str,
                               dtype: str, elem_bytes: int, deps: Mapping[int, Iterable[int]]
                               ) -> dict[int, tuple[int, ...]]:
    """ring_reduce_scatter_pieces as it was: an add_compute and add_transfer per move, step after step."""
    p = len(order)
    front = _launch(sched, order, tag, "reduce-scatter", full, deps)
    if p < 2:
        return {r: tuple(ids) for r, ids in front.items()}
    held = {r: list(front[r]) for r in order}
    for k in range(p - 1):
        new_held: dict[int, list[int]] = {}
        for i, r in enumerate(order):
            owner = order[(i - k - 1) % p]
            dst = order[(i + 1) % p]
            lo, hi = rows(owner)
            src_buf = f"{tag}.part{owner}"
            send_deps = held[r]
            if k == 0:
                send_deps = [sched.add_compute(r, f"{tag}.cut", deps=held[r], fn="slice-rows", out=src_buf,
                                               args=(full,), lo=lo, hi=hi, fused=True, coll=tag)]
            tmp = f"{tag}.tmp{k}"
            snd, recv = sched.add_transfer(r, dst, nbytes(owner), tag, send_deps=send_deps, recv_deps=held[dst],
                                           args=(src_buf,), dst_args=(tmp,), coll=tag,
                                           free_src=() if k == 0 else (src_buf,))
            target = out(owner) if k == p - 2 else f"{tag}.part{owner}"
            red = sched.add_compute(dst, f"{tag}.reduce", flops=elems(owner), nbytes=3 * elems(owner) * elem_bytes,
                                    dtype=dtype, deps=(recv, *held[dst]), fn="add", out=target, args=(tmp, full),
                                    lo=lo, hi=hi, fused=True, coll=tag, alloc=[(target, nbytes(owner))])
            new_held.setdefault(dst, []).append(red)
            new_held.setdefault(r, []).append(snd)
        held = new_held
    return {r: tuple(ids) for r, ids in held.items()}


def _order_and_sizes(data: st.DataObject, p: int) -> tuple[int, list[int], dict[int, float]]:
    ranks = p + data.draw(st.integers(0, 3))
    order = data.draw(st.permutations(range(ranks)))[:p]
    return ranks, order, {r: data.draw(st.one_of(st.integers(0, 10**9), st.floats(0, 1e9))) for r in order}


def _before(sched: Schedule, ranks: int, before: int, order: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """Ops before the collective, which its launches wait for (some ranks')."""
    for r in range(before):
        sched.add_compute(r % ranks, "k", flops=1.0)
    return {r: (r % before,) if before and r % 2 else () for r in order}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), p=st.integers(1, 9), before=st.integers(0, 3))
def test_the_block_is_the_transfers_one_by_one(data: st.DataObject, p: int, before: int) -> None:
    ranks, order, sizes = _order_and_sizes(data, p)
    built = []
    for build in (ring_allgather_pieces, _one_by_one):
        sched = Schedule(ranks)
        deps = _before(sched, ranks, before, order)
        front = build(sched, order, lambda r: f"kv{r}", sizes.__getitem__, tag="ag", deps=deps)
        built.append((list(sched.ops), front))
    assert built[0] == built[1]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), p=st.integers(1, 9), before=st.integers(0, 3), dtype=st.sampled_from(["bf16", "fp32"]))
def test_the_reduce_scatter_block_is_the_moves_one_by_one(data: st.DataObject, p: int, before: int,
                                                           dtype: str) -> None:
    ranks, order, sizes = _order_and_sizes(data, p)
    edges = [0]
    for _ in order:
        edges.append(edges[-1] + data.draw(st.integers(0, 50)))
    at = {r: j for j, r in enumerate(order)}
    built = []
    for build in (ring_reduce_scatter_pieces, _reduce_scatter_one_by_one):
        sched = Schedule(ranks)
        deps = _before(sched, ranks, before, order)
        front = build(sched, order, "full", lambda r: (edges[at[r]], edges[at[r] + 1]), sizes.__getitem__,
                      lambda r: float(3 * (edges[at[r] + 1] - edges[at[r]])), out=lambda r: f"out{r % 2}",
                      tag="rs", dtype=dtype, elem_bytes=2, deps=deps)
        built.append((list(sched.ops), front))
    assert built[0] == built[1]


def test_every_rank_gets_every_piece_once() -> None:
    sched = Schedule(4)
    front = ring_allgather_pieces(sched, [2, 0, 3, 1], lambda r: f"kv{r}", lambda r: 10.0 * (r + 1), tag="ag",
                                  deps={})
    got: dict[int, list[str]] = {r: [] for r in range(4)}
    for op in sched.ops:
        if op.kind == "recv":
            got[op.rank] += [name for name, _ in op.alloc]
    assert {r: sorted(names) for r, names in got.items()} == {r: sorted(f"kv{o}" for o in range(4) if o != r)
                                                              for r in range(4)}
    assert all(len(ids) == 1 + 3 for ids in front.values())  # its launch, then a piece a step


def test_one_rank_moves_nothing() -> None:
    sched = Schedule(2)
    sched.add_compute(1, "k", flops=1.0)
    front = ring_allgather_pieces(sched, [1], lambda r: f"kv{r}", lambda r: 1.0, tag="ag", deps={1: (0,)})
    assert len(sched.ops) == 1 and front == {1: (0,)}


def _pairwise_one_by_one(sched: Schedule, order: Sequence[int], buf: str, name: Callable[[int], str],
                         piece: Callable[[int, int], tuple[int, int, float]], *, mode: str, tag: str,
                         deps: Mapping[int, Iterable[int]]) -> dict[int, tuple[int, ...]]:
    """pairwise_alltoall as it was: an add_compute per cut and an add_transfer per piece, round after round."""
    p = len(order)
    prev: dict[int, list[int]] = {}
    front: dict[int, list[int]] = {}
    for r in order:
        start = list(deps.get(r, ()))
        if p > 1:
            start = [sched.add_launch(r, f"{tag}.launch", deps=start, coll=tag, fn="alltoall", out=buf)]
        cuts = []
        for dst in order:
            lo, hi, nbytes = piece(r, dst)
            own = dst == r
            cuts.append(sched.add_compute(r, f"{tag}.cut", deps=start, fn=f"slice-{mode}",
                                          out=name(r) if own else f"{tag}.{r}>{dst}", args=(buf,), lo=lo, hi=hi,
                                          fused=True, coll=tag, alloc=[(name(r), nbytes)] if own else ()))
        prev[r], front[r] = cuts, [cuts[order.index(r)]]
    for k in range(1, p):
        done: dict[int, list[int]] = {r: [] for r in order}
        for i, src in enumerate(order):
            dst = order[(i + k) % p]
            nbytes = piece(src, dst)[2]
            snd, recv = sched.add_transfer(src, dst, nbytes, tag, send_deps=prev[src], recv_deps=prev[dst],
                                           args=(f"{tag}.{src}>{dst}",), dst_args=(name(src),), coll=tag,
                                           alloc=[(name(src), nbytes)])
            done[src].append(snd)
            done[dst].append(recv)
            front[dst].append(recv)
        prev = done
    return {r: tuple(ids) for r, ids in front.items()}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), p=st.integers(1, 9), before=st.integers(0, 3), mode=st.sampled_from(["heads", "rows"]))
def test_the_pairwise_alltoall_block_is_the_pieces_one_by_one(data: st.DataObject, p: int, before: int,
                                                             mode: str) -> None:
    ranks, order, _ = _order_and_sizes(data, p)
    cuts = {(s, d): (data.draw(st.integers(0, 40)), data.draw(st.integers(0, 40)),
                     data.draw(st.one_of(st.integers(0, 10**9), st.floats(0, 1e9))))
            for s in order for d in order}
    built = []
    for build in (pairwise_alltoall, _pairwise_one_by_one):
        sched = Schedule(ranks)
        deps = _before(sched, ranks, before, order)
        front = build(sched, order, "buf", lambda r: f"out{r}", lambda s, d: cuts[(s, d)], mode=mode, tag="a2a",
                      deps=deps)
        built.append((list(sched.ops), front))
    assert built[0] == built[1]
