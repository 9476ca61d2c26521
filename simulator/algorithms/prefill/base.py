"""What every prefill schedule shares: the shards of the layout, the initial buffers and the attention kernels.

Buffers hold *row blocks*: rows of a (b, heads, tokens, head_dim) tensor (q, out, dout, dq; K and V together as
``kv``, dK and dV as ``dkv``) with their global positions and head range. The kernels (op ``fn``: ``attn-fwd``,
``attn-final``, ``attn-delta``, ``attn-bwd``, ``concat``, ``slice-heads``, ``slice-rows``, ``add``) are in the
one kernel table (:mod:`simulator.kernels.table`, defined in :mod:`simulator.kernels.prefill`); their costs come from
:class:`PrefillShape` (the roofline) and, for the attention blocks on a GPU with tile facts, from the flash-attention
launches each block records in its dims (:mod:`simulator.kernels.launches`, priced by
:mod:`simulator.kernels.tiles`). ``concat`` is free (the pieces were received into one buffer).

Sends carry whole buffers (collectives cut pieces first, as views). ``meta`` carries
``shape`` (the :class:`PrefillShape`), ``runs`` (each rank's positions, :mod:`simulator.workloads.layouts`),
``outputs`` [(rank, out buffer)] and, with a backward, ``grads`` [(rank, dq buffer, dkv buffer)]. On a cached
prefix (``shape.cached``) ``runs`` are each rank's new positions (its queries) and ``kv_runs`` its cached then new
positions (its K and V: :func:`simulator.workloads.layouts.prefix_runs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from simulator.kernels.tiles import AttentionCall, Launch, call_dims
from simulator.schedule.core import Schedule
from simulator.workloads.layouts import Run, pair_count, prefix_runs, rank_pairs, run_tokens
from simulator.workloads.prefill_shape import PrefillShape

__all__ = ["add_backward_block", "add_concat", "add_delta", "add_final", "add_forward_block", "attention_dims",
           "kv_runs", "kv_tokens", "new_prefill_schedule", "tokens"]

Extra = tuple[float, int]  # (bytes, kernels) of the elementwise work a block's op runs after its launches


def tokens(sched: Schedule, rank: int) -> int:
    """Tokens rank ``rank`` owns (cached in ``meta['tokens']``)."""
    cache = sched.meta.get("tokens")
    if cache is None:
        cache = sched.meta["tokens"] = [run_tokens(rr) for rr in sched.meta["runs"]]
    return int(cache[rank])


def kv_runs(sched: Schedule) -> list[tuple[Run, ...]]:
    """Each rank's K and V positions: its cached then new ones (``meta['kv_runs']``), else its positions."""
    return list(sched.meta.get("kv_runs", sched.meta["runs"]))


def kv_tokens(sched: Schedule, rank: int) -> int:
    """Tokens of K and V rank ``rank`` holds (cached in ``meta['kv_tokens']``)."""
    cache = sched.meta.get("kv_tokens")
    if cache is None:
        cache = sched.meta["kv_tokens"] = [run_tokens(rr) for rr in kv_runs(sched)]
    return int(cache[rank])


def new_prefill_schedule(name: str, shape: PrefillShape, ranks: int, kv_name: str = "kv") -> Schedule:
    """Rank r starts with its q, its K and V (``kv_name``: its cached prefix too) and, with a backward, dO, for its
    positions."""
    runs, keys = prefix_runs(shape.layout, shape.cached, shape.sequence, ranks)
    meta = {"shape": shape, "runs": runs, "outputs": [], "grads": []}
    if shape.cached:
        meta["kv_runs"] = keys
    sched = Schedule(ranks, name=name, meta=meta)
    for r, rr in enumerate(runs):
        t = run_tokens(rr)
        sched.initial[r] = {"q": shape.q_bytes(t), kv_name.format(r=r): shape.kv_bytes(run_tokens(keys[r]))}
        if shape.backward:
            sched.initial[r]["dout"] = shape.q_bytes(t)
    return sched


def _pairs(shape: PrefillShape, q: tuple[Run, ...], k: tuple[Run, ...] | None) -> int:
    """Unmasked pairs of queries ``q`` against keys ``k`` (None: the whole sequence, its cached prefix too)."""
    return rank_pairs(q, shape.keys, shape.causal) if k is None else pair_count(q, k, shape.causal)


def _block_size(shape: PrefillShape, q_runs: tuple[Run, ...], k_runs: tuple[Run, ...] | None,
                pairs: int | None) -> tuple[int, int, int] | None:
    """(queries, keys, unmasked pairs) of a block (``k_runs`` None: the whole sequence); None when fully masked."""
    pairs = _pairs(shape, q_runs, k_runs) if pairs is None else pairs
    if pairs == 0:
        return None
    return run_tokens(q_runs), shape.keys if k_runs is None else run_tokens(k_runs), pairs


def block_dims(shape: PrefillShape, nq: int, nk: int, pairs: int, heads: int | None = None) -> tuple[float, ...]:
    """An attention block's shape on its profile's axes (:data:`simulator.kernels.table.PROFILE_AXES`): query rows x
    heads, keys it spans, head dimension, and the share of its (query, key) pairs the mask keeps (a kernel that skips
    masked tiles costs in proportion to it; one that computes every pair, as the merge core does, does not)."""
    h = shape.heads if heads is None else heads
    return float(shape.batch * h * nq), float(nk), float(shape.head_dim), pairs / (nq * nk)


def attention_dims(shape: PrefillShape, nq: int, nk: int, pairs: int, launches: Sequence[Launch],
                   heads: int | None = None, extra: Extra = (0.0, 0)) -> tuple[float, ...]:
    """An attention block's dims: its profile axes (:func:`block_dims`), then the flash-attention launches it makes
    and the elementwise work after them, which the tile model prices (:func:`simulator.kernels.tiles.call_dims`)."""
    h = shape.heads if heads is None else heads
    call = AttentionCall(shape.head_dim, shape.batch * h, shape.group, tuple(launches), float(extra[0]), int(extra[1]))
    return call_dims(block_dims(shape, nq, nk, pairs, heads), call)


def add_forward_block(sched: Schedule, shape: PrefillShape, rank: int, q_runs: tuple[Run, ...],
                      k_runs: tuple[Run, ...] | None, kv_buf: str, deps: Iterable[int], *, launches: Sequence[Launch],
                      q_buf: str = "q", out: str = "acc", first: bool, heads: int | None = None,
                      free: Sequence[str] = (), pairs: int | None = None, extra: Extra = (0.0, 0)) -> int | None:
    """Forward block of ``q_runs`` against ``k_runs`` (None: the whole sequence), run as ``launches``
    (:mod:`simulator.kernels.launches`); None when fully masked.

    ``pairs``: the block's unmasked pairs when the caller knows them already."""
    size = _block_size(shape, q_runs, k_runs, pairs)
    if size is None:
        return None
    nq, nk, pairs = size
    flops, nbytes = shape.forward_cost(nq, nk, pairs, heads)
    return sched.add_compute(rank, f"attn-fwd[{kv_buf}]", flops=flops, nbytes=nbytes, dtype=shape.dtype, deps=deps,
                             fn="attn-fwd", out=out, args=(q_buf, kv_buf),
                             dims=attention_dims(shape, nq, nk, pairs, launches, heads, extra),
                             alloc=[(out, shape.state_bytes(nq, heads))] if first else (), free=free)


def add_final(sched: Schedule, shape: PrefillShape, rank: int, nq: int, deps: Iterable[int], *, state: str = "acc",
              heads: int | None = None) -> int:
    """out = o / l and lse = m + log l (saved for the backward); the running state is released."""
    elems = shape.batch * nq * (shape.heads if heads is None else heads) * shape.head_dim
    flops, nbytes = shape.elementwise_cost(elems)
    return sched.add_compute(rank, "attn-final", flops=flops, nbytes=nbytes, dtype=shape.dtype, deps=deps,
                             fn="attn-final", out="out", args=(state,),
                             alloc=[("out", shape.q_bytes(nq, heads)), ("lse", shape.row_bytes(nq, heads))],
                             free=(state,))


def add_delta(sched: Schedule, shape: PrefillShape, rank: int, nq: int, deps: Iterable[int], *, dout: str = "dout",
              heads: int | None = None) -> int:
    """delta = rowsum(out * dout) (FlashAttention-2's backward preprocessing)."""
    elems = shape.batch * nq * (shape.heads if heads is None else heads) * shape.head_dim
    flops, nbytes = shape.elementwise_cost(2 * elems)
    return sched.add_compute(rank, "attn-delta", flops=flops, nbytes=nbytes, dtype=shape.dtype, deps=deps,
                             fn="attn-delta", out="delta", args=("out", dout),
                             alloc=[("delta", shape.row_bytes(nq, heads))])


def add_backward_block(sched: Schedule, shape: PrefillShape, rank: int, q_runs: tuple[Run, ...],
                       k_runs: tuple[Run, ...] | None, kv_buf: str, dkv_buf: str, deps: Iterable[int], *,
                       launches: Sequence[Launch], q_buf: str = "q", dout: str = "dout", dq: str = "dq",
                       alloc_dq: bool, alloc_dkv: float | None, heads: int | None = None, free: Sequence[str] = (),
                       pairs: int | None = None, extra: Extra = (0.0, 0)) -> int | None:
    """Backward block, run as ``launches``: dq += and ``dkv_buf`` += its gradients (``alloc_dkv``: bytes when the
    block creates it)."""
    size = _block_size(shape, q_runs, k_runs, pairs)
    if size is None:
        return None
    nq, nk, pairs = size
    flops, nbytes = shape.backward_cost(nq, nk, pairs, heads)
    dims = attention_dims(shape, nq, nk, pairs, launches, heads, extra)
    alloc = [(dq, shape.q_bytes(nq, heads))] if alloc_dq else []
    if alloc_dkv is not None:
        alloc.append((dkv_buf, alloc_dkv))
    return sched.add_compute(rank, f"attn-bwd[{kv_buf}]", flops=flops, nbytes=nbytes, dtype=shape.dtype, deps=deps,
                             fn="attn-bwd", out=dq, args=(q_buf, kv_buf, "lse", "delta", dout, dkv_buf),
                             alloc=alloc, free=free, dims=dims)


def add_concat(sched: Schedule, rank: int, out: str, pieces: Sequence[str], deps: Iterable[int]) -> int:
    """``out`` = the pieces side by side: zero cost (they were received into one buffer), for the executors."""
    return sched.add_compute(rank, f"concat[{out}]", deps=deps, fn="concat", out=out, args=tuple(pieces), fused=True)
