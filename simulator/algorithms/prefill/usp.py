"""``usp``: hybrid context parallelism, Ulysses inside a group of U GPUs and a ring across the R = P / U groups
(Fang & Zhao, "USP: A Unified Sequence Parallelism Approach", arXiv:2405.07719).

Degrees: ``ulysses: U`` (0, the default: the GPUs of a server, or the largest divisor of them the heads allow);
U must divide each server's GPUs, and the heads, and U and the KV heads one another (as ``ulysses``); R is the rest.
The Ulysses groups are U consecutive GPUs of a server; ring member u of every group forms ring u.

Sequence: the workload's layout over the R groups (group k holds positions T_k, ``layout_runs(layout, n, R)[k]``),
and inside a group GPU u holds the u-th contiguous slice of T_k (in storage order).

Forward: inside each group an all-to-all of q, and of K with V, to head-sharded (GPU u: heads/U query heads and
the KV heads they use, of every position of T_k: KV heads replicated when there are fewer than U, as ``ulysses``);
then ring u passes K/V shards round its R members as ``ring`` does (a block: T_k's queries against T_j's keys, of
heads/U heads, the layout's launches); each GPU finalizes its heads and an all-to-all takes the output back to its
rows. Backward: dO to head-sharded, the ring backward (dQ local, dK and dV travel with their shard and return to
it), dQ and dK, dV back to rows (replicated KV heads' gradients summed).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from simulator.algorithms.base import Layout
from simulator.algorithms.prefill.base import add_concat, add_delta, add_final
from simulator.algorithms.prefill.ring import _Blocks, _Ring, landed
from simulator.algorithms.prefill.ulysses import kv_heads_of
from simulator.collectives.alltoall import pairwise_alltoall
from simulator.errors import InputError
from simulator.kernels.launches import launch_matrix
from simulator.kernels.prefill import cut_runs
from simulator.schedule.core import Schedule
from simulator.schedule.oplist import Indexed
from simulator.workloads.layouts import Run, layout_runs, pair_matrix, run_tokens
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import shard_bounds

__all__ = ["build_prefill_usp", "usp_degrees"]


def _fits(shape: PrefillShape, u: int) -> bool:
    return shape.heads % u == 0 and (shape.kv_heads % u == 0 or u % shape.kv_heads == 0)


def usp_degrees(shape: PrefillShape, layout: Layout, ulysses: int = 0, field: str = "algorithms"
                ) -> tuple[int, int]:
    """(U, R): the Ulysses and ring degrees (module docstring); bad degrees are input errors at ``field``."""
    sizes = {len(g) for g in layout.groups()}
    if len(sizes) != 1:
        raise InputError("usp needs the same number of GPUs on every server", field=field)
    server = sizes.pop()
    if ulysses == 0:
        ulysses = max(d for d in range(1, server + 1) if server % d == 0 and _fits(shape, d))
    if server % ulysses:
        raise InputError(f"usp: ulysses ({ulysses}) must divide the {server} GPUs of a server", field=field)
    if not _fits(shape, ulysses):
        raise InputError(f"usp: ulysses ({ulysses}) must divide the {shape.heads} heads, and it and the "
                         f"{shape.kv_heads} KV heads one another", field=field)
    return ulysses, layout.ranks // ulysses


def build_prefill_usp(shape: PrefillShape, layout: Layout, ulysses: int = 0, overlap: bool = True) -> Schedule:
    u_deg, r_deg = usp_degrees(shape, layout, ulysses)
    p = layout.ranks
    groups = [g[i:i + u_deg] for g in layout.groups() for i in range(0, len(g), u_deg)]  # Ulysses groups
    server_runs = layout_runs(shape.layout, shape.sequence, r_deg)  # T_k of group k
    cuts = [shard_bounds(run_tokens(t), u_deg) for t in server_runs]
    runs: list[tuple[Run, ...]] = [()] * p
    for k, grp in enumerate(groups):
        for j, rank in enumerate(grp):
            runs[rank] = cut_runs(server_runs[k], *cuts[k][j])
    sched = Schedule(p, name="usp", meta={"shape": shape, "runs": runs, "outputs": [], "grads": [],
                                          "degrees": (u_deg, r_deg)})
    for r, rr in enumerate(runs):
        t = run_tokens(rr)
        sched.initial[r] = {"q": shape.q_bytes(t), "kv": shape.kv_bytes(t)}
        if shape.backward:
            sched.initial[r]["dout"] = shape.q_bytes(t)
    hq = shape.heads // u_deg
    kvq = kv_heads_of(shape, u_deg, 0)[1] - kv_heads_of(shape, u_deg, 0)[0]
    part = dataclasses.replace(shape, heads=hq, kv_heads=kvq)  # the attention of one GPU's heads
    group_of = {rank: (k, j) for k, grp in enumerate(groups) for j, rank in enumerate(grp)}
    tok = np.array([run_tokens(t) for t in server_runs], dtype=np.int64)

    def rows_of(rank: int) -> int:
        return run_tokens(runs[rank])

    def exchange(buf: str, prefix: str, kv: bool, to_heads: bool, deps: dict[int, list[int]], tag: str
                 ) -> dict[int, list[int]]:
        """An all-to-all inside every group (``to_heads``: rows -> heads, else back), then the pieces side by side."""
        def piece(src: int, dst: int) -> tuple[int, int, float]:
            k = group_of[src][0]
            j_dst = group_of[dst][1]
            if to_heads:
                t = rows_of(src)
                if kv:
                    return (*kv_heads_of(shape, u_deg, j_dst), shape.kv_bytes(t, kvq))
                return j_dst * hq, (j_dst + 1) * hq, shape.q_bytes(t, hq)
            lo, hi = cuts[k][j_dst]
            return lo, hi, shape.kv_bytes(hi - lo, kvq) if kv else shape.q_bytes(hi - lo, hq)
        front: dict[int, list[int]] = {}
        for grp in groups:
            got = pairwise_alltoall(sched, grp, buf, lambda s: f"{prefix}@{s}", piece,
                                    mode="heads" if to_heads else "rows", tag=tag, deps=deps)
            for r in grp:
                front[r] = [add_concat(sched, r, _out(prefix, to_heads), [f"{prefix}@{s}" for s in grp], got[r])]
        return front

    qf = exchange("q", "q", False, True, {}, "q-alltoall")
    kvf = exchange("kv", "kv", True, True, {}, "kv-alltoall")
    pairs = pair_matrix(server_runs, shape.causal)
    blocks = _Blocks(part, tok, pairs, launch_matrix(shape.layout, server_runs, shape.causal))
    rings = [[grp[j] for grp in groups] for j in range(u_deg)]
    ring_geo = [_Ring(Layout(tuple(layout.hosts[m] for m in members))) for members in rings]
    last = {r: qf[r] + kvf[r] for r in range(p)}
    for members, ring in zip(rings, ring_geo, strict=True):
        _pass(sched, part, ring, members, tok, blocks, pairs, last, overlap, backward=False)
    done = {r: [add_final(sched, part, r, int(tok[group_of[r][0]]), last[r], heads=hq)] for r in range(p)}
    exchange("out", "o", False, False, done, "out-alltoall")
    sched.meta["outputs"] = [(r, "y") for r in range(p)]
    if not shape.backward:
        return sched
    dof = exchange("dout", "do", False, True, done, "dout-alltoall")
    last = {r: [add_delta(sched, part, r, int(tok[group_of[r][0]]), dof[r], dout="doh", heads=hq)] for r in range(p)}
    for members, ring in zip(rings, ring_geo, strict=True):
        _pass(sched, part, ring, members, tok, blocks, pairs, last, overlap, backward=True)
    dkv = f"dkv{r_deg % 2}" if r_deg > 1 else "dkv0"
    exchange("dqh", "dq", False, False, last, "dq-alltoall")
    exchange(dkv, "dkv", True, False, last, "dkv-alltoall")
    sched.meta["grads"] = [(r, "dq", "dkv") for r in range(p)]
    return sched


def _out(prefix: str, to_heads: bool) -> str:
    """The buffer an exchange leaves: q -> qh, kv -> kvh, do -> doh (head-sharded); o -> y, dq, dkv (rows)."""
    if to_heads:
        return f"{prefix}h"
    return "y" if prefix == "o" else prefix


def _kv(step: int) -> str:
    return "kvh" if step == 0 else f"kvr{step % 2}"


def _padded(lists: list[list[int]]) -> np.ndarray:
    """Op ids, a list per member, as an (members, k) array padded with -1."""
    width = max(1, *map(len, lists)) if lists else 1
    out = np.full((len(lists), width), -1, dtype=np.int64)
    for i, ids in enumerate(lists):
        out[i, :len(ids)] = ids
    return out


def _pass(sched: Schedule, part: PrefillShape, ring: _Ring, members: list[int], tok: np.ndarray, blocks: _Blocks,
          pairs: np.ndarray, last: dict[int, list[int]], overlap: bool, backward: bool) -> None:
    """One pass of ring ``members``'s K/V shards round it (``ring``'s, a block per step; ``last[rank]``: the ops
    each rank's first block waits for, updated to its last op). Backward: dQ accumulates locally, each shard's dK,
    dV travel with it and one hop more brings them home. Each step's transfers, blocks and dK, dV transfers are
    appended as one block of columns each, members in ring order (the ops of one call per member, in that order)."""
    r_deg = ring.p
    mem = np.asarray(members, dtype=np.int64)
    nxt = ring.next
    kv_size = np.array([part.kv_bytes(int(t)) for t in tok], dtype=float)
    max_kv = float(kv_size.max())
    kv_names, dkv_names = [f"kv[{j}]" for j in range(r_deg)], [f"dkv[{j}]" for j in range(r_deg)]
    none = np.full(r_deg, -1, dtype=np.int64)
    have, sent, dkv_have, dkv_sent = none, none, none, none  # each member's receive and send of this step (-1: none)
    prev = _padded([list(last[m]) for m in members])  # each member's last ops
    allocs = Indexed([(("dqh", part.q_bytes(int(t))), ("dkv0", part.kv_bytes(int(t)))) if backward else
                      (("acc", part.state_bytes(int(t))),) for t in tok], np.arange(r_deg))

    def post(step: int, held: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        first = sched.add_transfers(mem, mem[nxt], kv_size[held], Indexed(kv_names, held), after,
                                    np.column_stack([prev[nxt], sent[nxt]]), args=(_kv(step),),
                                    dst_args=(_kv(step + 1),),
                                    alloc=((_kv(step + 1), max_kv),) if step < 2 and not backward else ())
        return landed(first, nxt)

    for step in range(r_deg):
        held = ring.shards_at(step)
        new_have, new_sent = have, sent
        if overlap and step < r_deg - 1:
            new_have, new_sent = post(step, held, prev if step == 0 else have[:, None])
        live = np.flatnonzero(pairs[np.arange(r_deg), held] > 0)
        if step == 0 and len(live) < r_deg:
            raise AssertionError("every group's queries see its own keys")
        done = none.copy()
        if len(live):
            which = Indexed(blocks.table, blocks.which(backward, "kv" if step == 0 else "kvr", live, held[live]))
            alloc = Indexed(allocs.table, allocs.which[live]) if step == 0 else ()
            if not backward:
                first = sched.add_kernel_step(mem[live], which, np.column_stack([have[live], prev[live]]),
                                              dtype=part.dtype, fn="attn-fwd", out="acc", args=("qh", _kv(step)),
                                              alloc=alloc)
            else:
                first = sched.add_kernel_step(
                    mem[live], which, np.column_stack([have[live], prev[live], dkv_have[live]]), dtype=part.dtype,
                    fn="attn-bwd", out="dqh", args=("qh", _kv(step), "lse", "delta", "doh", f"dkv{step % 2}"),
                    alloc=alloc)
            done[live] = first + np.arange(len(live))
            prev = prev.copy()  # a live member's last op is now its block
            prev[live, 0], prev[live, 1:] = done[live], -1
        if not overlap and step < r_deg - 1:
            new_have, new_sent = post(step, held, np.column_stack([have, done]))
        if backward and r_deg > 1:  # dK, dV of the shard go on with it
            dnxt = f"dkv{(step + 1) % 2}"
            first = sched.add_transfers(mem, mem[nxt], kv_size[held], Indexed(dkv_names, held),
                                        np.column_stack([done, dkv_have]), np.column_stack([dkv_sent[nxt], prev[nxt]]),
                                        args=(f"dkv{step % 2}",), dst_args=(dnxt,),
                                        alloc=((dnxt, max_kv),) if step == 0 else ())
            dkv_have, dkv_sent = landed(first, nxt)
        have, sent = new_have, new_sent
    for i, m in enumerate(members):
        ids = (*prev[i], dkv_have[i]) if backward else prev[i]
        last[m] = [int(d) for d in ids if d >= 0]
