"""The flash-attention calls each prefill schedule's attention blocks make, per layout, as the implementations launch
them (docs/kernels.md). Each call is a :class:`~simulator.kernels.tiles.Launch` (queries, keys, mask offset) per
(batch, head); the tile model (:mod:`simulator.kernels.tiles`) prices it. The visible pairs of a block's launches are
exactly the block's unmasked pairs (:func:`simulator.workloads.layouts.pair_count`): the layouts differ only in how
those pairs fall into kernels.

Ring steps (rank r attends shard j; github.com/zhuzilin/ring-flash-attention @ 8996282, ``ring_flash_attn/``):

* no mask, any layout (``ring_flash_attn.py``: the zigzag and stripe functions assert ``causal``): every step one
  unmasked launch of the rank's queries against the shard;
* ``contiguous`` (``ring_flash_attn.py``, ``causal=causal and step == 0``): the own shard one causal launch, an
  earlier shard one unmasked launch, a later one nothing;
* ``zigzag`` (``zigzag_ring_flash_attn.py``; the same kernels as Transformer Engine's P2P context parallelism with
  load-balanced chunks, ``AttnFuncWithCPAndKVP2P``, and PyTorch's round-robin ``context_parallel``): the own shard
  one causal launch over both chunks; an earlier shard (``step <= rank``) all queries against its first chunk,
  unmasked; a later shard the second chunk of queries against both its chunks, unmasked;
* ``striped`` (``stripe_flash_attn.py``): an earlier or the own shard one causal launch of all queries against all
  its keys; a later shard one causal launch of ``q[1:]`` against ``k[:-1]`` (the shifted diagonal).

The reference code needs equal shards; with uneven ones the launches keep the shapes and offsets the positions need
(striped: the keys of a later shard that some query sees).

On a cached prefix (rank j's keys: its cached positions, then its new ones, in that order) every query sees all of
a shard's cached keys: a block is the layout's launch over the new keys with the cached keys in front of them, one
launch when the layout's launch covers every query of the rank (or, ``striped``, all but the first: the shifted
diagonal moves by the cached keys), else (a ``zigzag`` later shard: only the second chunk of queries sees its new
keys) two: every query against the cached keys, unmasked, then the layout's launch
(:func:`prefix_launch_matrix`). ``single`` is one bottom-right causal launch of the new queries against every key.

``allgather`` (Transformer Engine's ``AttnFuncWithCPAndKVAllGather``, Llama 3's load-balanced context parallelism,
arXiv:2407.21783 Sec. 3.3.2): each of the rank's runs (its two chunks under ``zigzag``) against the keys up to its
end, causal from the bottom right, the launches on separate streams (concurrent); under ``striped`` (no reference
implementation) one launch per gathered shard, each the band the mask keeps. ``ulysses`` and ``single``: one launch
over the whole sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simulator.kernels.tiles import Launch, causal_launch, full_launch
from simulator.workloads.layouts import Run, run_tokens

__all__ = ["block_launches", "gathered_launches", "launch_matrix", "prefix_launch_matrix", "sequence_launch"]


def _full(nq: int, nk: int) -> tuple[Launch, ...]:
    return (full_launch(nq, nk),) if nq > 0 and nk > 0 else ()


def block_launches(layout: str, q_runs: Sequence[Run], k_runs: Sequence[Run], causal: bool) -> tuple[Launch, ...]:
    """The launches of a ring step: rank's queries ``q_runs`` against a shard's keys ``k_runs`` (module docstring);
    empty when the mask hides the whole block."""
    tq, tk = run_tokens(q_runs), run_tokens(k_runs)
    if tq == 0 or tk == 0:
        return ()
    if not causal:
        return _full(tq, tk)
    own, earlier = q_runs[0].start == k_runs[0].start, k_runs[0].start < q_runs[0].start
    if layout == "contiguous":
        if own:
            return (causal_launch(tq, tk, 0),)
        return _full(tq, tk) if earlier else ()
    if layout == "zigzag":
        if own:
            return (causal_launch(tq, tk, 0),)
        if earlier:  # all queries against the shard's first chunk
            return _full(tq, k_runs[0].size)
        return _full(q_runs[-1].size, tk)  # the second chunk of queries against the whole shard
    if layout == "striped":
        if own or earlier:
            return (causal_launch(tq, tk, 0),)
        return (causal_launch(tq - 1, min(tk, tq - 1), 0),) if tq > 1 else ()  # q[1:] against k[:-1]
    raise ValueError(f"unknown layout {layout!r}")


def launch_matrix(layout: str, runs: Sequence[Sequence[Run]], causal: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(nq, nk, off) of every ring block, rank x shard (int64 arrays, P x P; nq 0 where nothing is launched): what
    :func:`block_launches` gives each, by arrays (every layout's ring block is one launch)."""
    p = len(runs)
    tok = np.array([run_tokens(rr) for rr in runs], dtype=np.int64)
    tq, tk = np.broadcast_to(tok[:, None], (p, p)).copy(), np.broadcast_to(tok[None, :], (p, p)).copy()
    empty = (tq == 0) | (tk == 0)
    if not causal:
        nq, nk, off = tq, tk, tk - 1
    else:
        start = np.array([rr[0].start if rr else 0 for rr in runs], dtype=np.int64)
        own = np.eye(p, dtype=bool)
        earlier = start[None, :] < start[:, None]
        if layout == "contiguous":
            nq, nk = np.where(own | earlier, tq, 0), tk
            off = np.where(own, 0, tk - 1)
        elif layout == "zigzag":
            first = np.array([rr[0].size if rr else 0 for rr in runs], dtype=np.int64)
            last = np.array([rr[-1].size if rr else 0 for rr in runs], dtype=np.int64)
            nq = np.where(own | earlier, tq, last[:, None])
            nk = np.where(earlier, first[None, :], tk)
            off = np.where(own, 0, nk - 1)
        elif layout == "striped":
            later = ~(own | earlier)
            nq = np.where(later, tq - 1, tq)
            nk = np.where(later, np.minimum(tk, tq - 1), tk)
            off = np.zeros((p, p), dtype=np.int64)
        else:
            raise ValueError(f"unknown layout {layout!r}")
    nq = np.where(empty | (nk <= 0), 0, nq)
    return nq.astype(np.int64), np.asarray(nk, dtype=np.int64), np.asarray(off, dtype=np.int64)


def prefix_launch_matrix(layout: str, runs: Sequence[Sequence[Run]], kv_runs: Sequence[Sequence[Run]],
                         causal: bool) -> tuple[np.ndarray, ...]:
    """(nq, nk, off) of the first and of the second launch of every ring block on a cached prefix (six int64 arrays,
    P x P; a second launch's nq is 0 where there is none): queries ``runs`` (new positions), keys ``kv_runs``
    (cached then new), module docstring."""
    nq, nk, off = launch_matrix(layout, runs, causal)
    tq = np.array([run_tokens(rr) for rr in runs], dtype=np.int64)
    cj = np.array([run_tokens(k) for k in kv_runs], dtype=np.int64) - tq  # each shard's cached keys
    p = len(runs)
    tqm, cjm = np.broadcast_to(tq[:, None], (p, p)), np.broadcast_to(cj[None, :], (p, p))
    zero = np.zeros((p, p), dtype=np.int64)
    if not causal:  # every key visible: one unmasked launch
        return tqm.copy(), cjm + nk, cjm + nk - 1, zero, zero.copy(), zero.copy()
    # one launch: the layout's over the last nq queries, the cached keys in front (its offset moves by them, and
    # by the queries in front of its own)
    single = (nq == tqm) | ((layout == "striped") & (nq > 0)) | (nq == 0) | (cjm == 0)
    one = (np.where(cjm == 0, nq, tqm), np.where(cjm == 0, nk, cjm + np.where(nq == 0, 0, nk)),
           np.where(cjm == 0, off, np.where(nq == 0, cjm - 1, cjm + off - (tqm - nq))))
    nq1 = np.where(single, one[0], tqm)
    nk1 = np.where(single, one[1], cjm)
    off1 = np.where(single, one[2], cjm - 1)
    nq2 = np.where(single, 0, nq)
    return (nq1.astype(np.int64), nk1.astype(np.int64), off1.astype(np.int64), nq2.astype(np.int64),
            np.where(single, 0, nk).astype(np.int64), np.where(single, 0, off).astype(np.int64))


def gathered_launches(layout: str, q_runs: Sequence[Run], shards: Sequence[Sequence[Run]], n: int,
                      causal: bool) -> tuple[Launch, ...]:
    """The launches of ``allgather``'s block: the rank's queries against the gathered sequence of ``n`` tokens
    (``shards``: every rank's positions), module docstring."""
    tq = run_tokens(q_runs)
    if tq == 0:
        return ()
    if not causal:
        return _full(tq, n)
    if layout == "striped":
        return tuple(causal_launch(tq, run_tokens(k), 0 if k[0].start <= q_runs[0].start else -1)
                     for k in shards if run_tokens(k) and (k[0].start <= q_runs[0].start or tq > 1))
    return tuple(causal_launch(r.size, r.start + r.size) for r in q_runs if r.size)


def sequence_launch(n: int, causal: bool, cached: int = 0) -> tuple[Launch, ...]:
    """``single`` and ``ulysses``: the whole sequence, one launch (on a cached prefix, the ``n`` new queries against
    every key, causal from the bottom right)."""
    return (causal_launch(n, cached + n),) if causal else _full(n, cached + n)
