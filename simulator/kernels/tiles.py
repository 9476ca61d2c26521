"""Attention kernels by tile: FlashAttention-2 and -3 as they run on a GPU (docs/kernels.md).

A FlashAttention forward kernel (Dao, arXiv:2307.08691, Alg. 1) cuts each (batch, head) problem into row blocks of
``Br`` queries; one thread block (CTA) per row block walks the column tiles of ``Bc`` keys it may see, skipping the
tiles a causal mask hides entirely and computing the tiles the diagonal crosses in full, masked. The backward
(Alg. 2) cuts the keys into column blocks of ``Bc``, one CTA each, and walks the row tiles of ``Br`` queries,
recomputing the probabilities from the saved log-sum-exp; separate small kernels compute ``D = rowsum(dO * O)``
first and convert the fp32 dQ accumulator after. The CTAs are spread over the SMs in launch order, each taking the
next free SM (the tail of the last wave is where small grids lose).

On one SM a tile of ``Br x Bc`` (query, key) elements costs

* its GEMMs: ``4 Br Bc d`` FLOPs forward (S = Q K^T, O += P V), ``10 Br Bc d`` backward (S again, dP, dV, dK, dQ),
  at the SM's share of the device's achievable matmul rate (``peak_flops[dtype] * eff_flops / sm_count``);
* its softmax: one exp2 per element on the special-function units (``sfu_rate / sm_count``) and, per element,
  the FP32 instructions of the kernel's softmax (``peak_flops['fp32'] / 2 / sm_count`` instructions/s, an FMA
  counted once): forward 3.5 (scale and subtract the running max, row max, row sum, half a packed conversion to
  16 bits) plus ``d / Bc`` (rescaling the output accumulator), backward 4 (scale and subtract the lse,
  dS = P (dP - D), two halves of a packed conversion); a tile the mask crosses adds 2 per element (compare, select)
  (FlashAttention-2 ``csrc/flash_attn/src/softmax.h``, ``mask.h``);
* ``GEMMs + softmax`` where each warp runs them one after the other (FlashAttention-2, and FlashAttention-3's
  backward), ``max(GEMMs, softmax)`` where two warpgroups ping-pong so that one's softmax runs under the other's
  GEMMs (FlashAttention-3's forward, Shah et al., arXiv:2407.08608, Sec. 3.1-3.2).

A CTA adds one tile's time (its software pipeline filling and draining) and the bytes of its own tiles that only it
reads or writes through HBM at its SM's share of the bandwidth (forward: its Q in and O out; backward: its K, V in
and dK, dV out). A kernel costs the device's launch overhead plus the time its CTAs take on the SMs.

Tile sizes are the implementations' own (:data:`IMPLEMENTATIONS`, each cited to its source); the SM count and
rates are the device's (``topologies/devices.yaml``). Pure: numpy and the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from simulator.support.jitcache import njit

__all__ = ["EXACT_GRID", "EXACT_TAIL", "FLASH_ATTENTION_2", "FLASH_ATTENTION_3", "IMPLEMENTATIONS", "PROFILE_DIMS",
           "AttentionCall", "Implementation", "Launch", "TiledDevice", "attention_time", "call_dims", "call_of",
           "causal_launch", "cta_tiles", "full_launch", "implementation_of", "kernel_time", "launch_pairs", "makespan",
           "tile_seconds"]

PROFILE_DIMS = 4  # the leading dims of an attention op: its profile axes (row_heads, span, head_dim, density)
EXACT_TAIL = 4096  # CTAs scheduled one by one at the end of a grid (the rest spread evenly: module docstring)


class Launch(NamedTuple):
    """One flash-attention call per (batch, head): ``nq`` queries against ``nk`` keys, key j visible to query i
    iff ``j <= i + off`` (``off >= nk - 1``: no mask)."""

    nq: int
    nk: int
    off: int


def full_launch(nq: int, nk: int) -> Launch:
    """``causal=False``."""
    return Launch(nq, nk, nk - 1)


def causal_launch(nq: int, nk: int, off: int | None = None) -> Launch:
    """``causal=True``: flash-attn aligns the mask to the bottom right (``off = nk - nq``, flash-attn >= 2.1), unless
    the positions need another offset (``off``)."""
    return Launch(nq, nk, nk - nq if off is None else off)


def launch_pairs(launch: Launch) -> int:
    """Visible (query, key) pairs of one (batch, head): sum over queries of clamp(i + off + 1, 0, nk)."""
    nq, nk, off = launch
    if nq <= 0 or nk <= 0:
        return 0
    # rows i < a see nothing, rows a <= i < b see i + off + 1 keys, rows from b see all nk
    a = min(nq, max(0, -off))
    b = min(nq, max(a, nk - 1 - off))
    ramp = (b - a) * (a + off + 1) + (b - a) * (b - a - 1) // 2
    return ramp + (nq - b) * nk


class AttentionCall(NamedTuple):
    """What an attention op runs, read off its dims (:func:`call_of`): its flash-attention launches (more than one
    run concurrently, on separate streams), ``rows`` = batch x query heads of each, ``group`` query heads per KV
    head, ``head_dim``, and the elementwise kernels the schedule runs after them (``extra_kernels`` launches moving
    ``extra_bytes``: the merge of a ring step's partial result, gradient accumulation)."""

    head_dim: int
    rows: int
    group: int
    launches: tuple[Launch, ...]
    extra_bytes: float = 0.0
    extra_kernels: int = 0


def call_dims(profile_dims: Sequence[float], call: AttentionCall) -> tuple[float, ...]:
    """An attention op's dims: its profile axes, then (rows, group, extra bytes, extra kernels, nq, nk, off, ...)."""
    if len(profile_dims) != PROFILE_DIMS:
        raise ValueError(f"an attention op's profile dims are {PROFILE_DIMS} values, got {len(profile_dims)}")
    tail = [float(call.rows), float(call.group), float(call.extra_bytes), float(call.extra_kernels)]
    for launch in call.launches:
        tail.extend(float(x) for x in launch)
    return (*map(float, profile_dims), *tail)


def call_of(dims: Sequence[float]) -> AttentionCall | None:
    """The call an attention op's dims describe (:func:`call_dims`), or None when they carry no launches."""
    tail = dims[PROFILE_DIMS:]
    if len(tail) < 7 or (len(tail) - 4) % 3:
        return None
    launches = tuple(Launch(int(tail[i]), int(tail[i + 1]), int(tail[i + 2])) for i in range(4, len(tail), 3))
    return AttentionCall(int(dims[2]), int(tail[0]), int(tail[1]), launches, float(tail[2]), int(tail[3]))


@dataclass(frozen=True)
class Implementation:
    """A FlashAttention implementation on one GPU architecture: its tiles ``(Br, Bc)`` per head-dimension bucket
    (a head dimension runs in the smallest bucket that holds it, padded, as the libraries dispatch it), per pass
    (``fwd_causal``/``bwd_causal`` where a causal mask picks other tiles), whether its forward hides the softmax
    under the GEMMs, whether its backward sums the dK, dV of a KV head's query heads in the kernel (else a separate
    reduction over expanded gradients), and the dtypes it runs."""

    name: str
    fwd: Mapping[int, tuple[int, int]]
    bwd: Mapping[int, tuple[int, int]]
    fwd_causal: Mapping[int, tuple[int, int]]
    bwd_causal: Mapping[int, tuple[int, int]]
    overlap_fwd: bool
    gqa_in_kernel: bool
    dtypes: tuple[str, ...] = ("bf16", "fp16")

    def tiles(self, backward: bool, head_dim: int, masked: bool) -> tuple[int, int] | None:
        """(Br, Bc) of a pass at ``head_dim``, or None beyond the largest bucket."""
        table, causal = (self.bwd, self.bwd_causal) if backward else (self.fwd, self.fwd_causal)
        for bucket in sorted(table):
            if head_dim <= bucket:
                return causal.get(bucket, table[bucket]) if masked else table[bucket]
        return None


# FlashAttention-2 on sm80 (A100): github.com/Dao-AILab/flash-attention @ 0251105a,
# csrc/flash_attn/src/flash_fwd_launch_template.h (run_mha_fwd_hdim32 l.195, hdim64 l.203, hdim96 l.223, hdim128
# l.247, hdim192 l.282, hdim256 l.299: the branch taken on an A100, no dropout) and flash_bwd_launch_template.h
# (run_mha_bwd_hdim32 l.136 ... hdim256 l.285: A100's 163 KB of shared memory per block >= 144 KB); the v2.0 source
# of the FlashAttention-2 paper's benchmarks (4f285b35, 2023-07-17) picks the same tiles.
FLASH_ATTENTION_2 = Implementation(
    "flash-attention-2",
    fwd={32: (128, 128), 64: (128, 128), 96: (128, 64), 128: (128, 64), 192: (128, 64), 256: (128, 64)},
    bwd={32: (128, 128), 64: (128, 128), 96: (64, 128), 128: (64, 128), 192: (64, 64), 256: (64, 64)},
    fwd_causal={}, bwd_causal={}, overlap_fwd=False, gqa_in_kernel=False)

# FlashAttention-3 on sm90 (H100, H200), the source of the FlashAttention-3 paper's benchmarks: hopper/
# flash_fwd_launch_template.h @ dfe1a59e (2024-07-22; run_mha_fwd_hdim64 l.111: 192 x 128, hdim128 l.124: 128 x 176,
# 128 x 128 causal, hdim256 l.140: 128 x 80) and hopper/flash_bwd_launch_template.h @ bafe2530 (2024-08-01;
# run_mha_bwd_hdim64 l.167: 128 x 128, hdim96 l.179 and hdim128 l.191: 64 x 128); its backward at head dim 256 came
# later: @ 0251105a run_mha_bwd_hdim256 l.377, 64 x 80. dK, dV of GQA heads accumulate in the kernel.
FLASH_ATTENTION_3 = Implementation(
    "flash-attention-3",
    fwd={64: (192, 128), 128: (128, 176), 256: (128, 80)},
    bwd={64: (128, 128), 96: (64, 128), 128: (64, 128), 256: (64, 80)},
    fwd_causal={128: (128, 128)}, bwd_causal={}, overlap_fwd=True, gqa_in_kernel=True)

IMPLEMENTATIONS: dict[str, Implementation] = {i.name: i for i in (FLASH_ATTENTION_2, FLASH_ATTENTION_3)}

GEMM_FLOPS = {False: 4, True: 10}  # per (query, key) element and head dimension: 2 GEMMs forward, 5 backward
FP32_OPS = {False: 3.5, True: 4.0}  # FP32 instructions per element besides the rescale (module docstring)
MASK_OPS = 2.0  # compare and select, per element of a tile the mask crosses
EXPS = 1.0  # exp2 per element, forward and backward (P recomputed)


class TiledDevice(Protocol):
    """The device facts the tile model reads (:class:`simulator.cluster.devices.DeviceSpec`)."""

    @property
    def peak_flops(self) -> Mapping[str, float]: ...
    @property
    def eff_flops(self) -> float: ...
    @property
    def mem_bw_Bps(self) -> float: ...
    @property
    def eff_mem(self) -> float: ...
    @property
    def launch_s(self) -> float: ...
    @property
    def sm_count(self) -> int: ...
    @property
    def sfu_flops(self) -> float: ...
    @property
    def attention_kernels(self) -> str: ...


def implementation_of(spec: TiledDevice, dtype: str) -> Implementation | None:
    """The device's attention implementation if it has the facts the tile model needs and runs ``dtype``."""
    impl = IMPLEMENTATIONS.get(spec.attention_kernels)
    if impl is None or spec.sm_count <= 0 or spec.sfu_flops <= 0 or dtype not in impl.dtypes \
            or dtype not in spec.peak_flops or "fp32" not in spec.peak_flops:
        return None
    return impl


def tile_seconds(spec: TiledDevice, impl: Implementation, backward: bool, dtype: str, head_dim: int, br: int,
                 bc: int) -> tuple[float, float]:
    """(seconds of a tile no mask crosses, seconds of one it crosses) on one SM."""
    sms = spec.sm_count
    gemm = GEMM_FLOPS[backward] * br * bc * head_dim / (spec.peak_flops[dtype] * spec.eff_flops / sms)
    fp32_rate = spec.peak_flops["fp32"] / 2 / sms  # instructions per second (an FMA is 2 FLOPs, one instruction)
    fp32 = FP32_OPS[backward] + (0.0 if backward else head_dim / bc)
    soft = br * bc * (EXPS / (spec.sfu_flops / sms) + fp32 / fp32_rate)
    mask = br * bc * MASK_OPS / fp32_rate
    overlap = impl.overlap_fwd and not backward

    def combine(s: float) -> float:
        return max(gemm, s) if overlap else gemm + s
    return combine(soft), combine(soft + mask)


def cta_tiles(launch: Launch, backward: bool, br: int, bc: int, blocks: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """(tiles no mask crosses, tiles it crosses) of each CTA of one (batch, head), in launch order: row blocks
    forward, walking column tiles; column blocks backward, walking row tiles. A tile the causal mask hides entirely
    is skipped; the ragged last tile of the walk is masked (its out-of-range elements). ``blocks``: the CTAs' indices
    to count (all of them by default)."""
    nq, nk, off = launch
    rb, cb = -(-nq // br), -(-nk // bc)
    if not backward:
        idx = np.arange(rb, dtype=np.int64) if blocks is None else blocks.astype(np.int64)
        lo = idx * br  # first query of each row block
        hi = np.minimum(lo + br, nq) - 1
        need = np.clip(np.minimum(nk - 1, hi + off) // bc + 1, 0, cb)  # column tiles its last query sees
        clean = np.clip((lo + off + 1) // bc, 0, need)  # column tiles its first query sees whole
        if nk % bc:
            clean = np.minimum(clean, cb - 1)
        return clean, need - clean
    idx = np.arange(cb, dtype=np.int64) if blocks is None else blocks.astype(np.int64)
    lo = idx * bc  # first key of each column block
    hi = np.minimum(lo + bc, nk) - 1
    first = np.where(lo - off > nq - 1, rb, np.clip((lo - off) // br, 0, rb))  # first row tile seeing key lo
    whole = np.clip(-((off - hi) // br), first, rb)  # first row tile whose first query sees key hi
    clean = rb - whole
    if nq % br:
        clean = clean - (clean > 0)
    return clean, rb - first - clean


def makespan(durations: np.ndarray, sms: int) -> float:
    """Time until the last CTA ends when each CTA, in launch order, takes the SM that frees first (list
    scheduling). Beyond the last :data:`EXACT_TAIL` CTAs (rounded to whole waves) the work is taken as spread evenly
    over the SMs; the tail is scheduled CTA by CTA."""
    n = len(durations)
    if n == 0:
        return 0.0
    head = _head(n, sms)
    return _list_scheduled(float(durations[:head].sum()), durations[head:], sms)


def _head(n: int, sms: int) -> int:
    """CTAs of a grid of ``n`` taken as spread evenly: all but the last :data:`EXACT_TAIL`, in whole waves."""
    return max(0, (n - EXACT_TAIL) // sms * sms)


def _list_scheduled(head_work: float, tail: np.ndarray, sms: int) -> float:
    """The end of ``tail``'s CTAs list-scheduled on SMs that all free at ``head_work / sms``: each CTA in turn on the
    SM that frees first (compiled; the same floats as a walk with :func:`heapq.heapreplace`, since each step adds
    the CTA to the least free time whichever SM holds it)."""
    return float(_schedule(head_work / sms, np.ascontiguousarray(tail, dtype=np.float64), sms))


@njit(cache=True)
def _schedule(start: float, tail: np.ndarray, sms: int) -> float:  # pragma: no cover (compiled)
    free = np.full(sms, start)  # a binary min-heap of the SMs' free times
    for d in tail:
        value = free[0] + d
        i = 0
        while True:  # sift the root's new value down
            child = 2 * i + 1
            if child >= sms:
                break
            if child + 1 < sms and free[child + 1] < free[child]:
                child += 1
            if free[child] >= value:
                break
            free[i] = free[child]
            i = child
        free[i] = value
    return free.max()


EXACT_GRID = 1 << 22  # CTAs of a pass held in one array; a larger grid is walked in chunks (:func:`kernel_time`)
_CHUNK = 1 << 20  # CTAs counted at once on a large grid


class _Walk(NamedTuple):
    """One launch of a pass as its CTAs see it: how many per (batch, head), and the costs that make one CTA's
    seconds (:meth:`durations`)."""

    launch: Launch
    blocks: int
    br: int
    bc: int
    fixed: float  # a CTA's pipeline fill and its own tiles' HBM traffic
    t_clean: float
    t_masked: float

    def durations(self, backward: bool, blocks: np.ndarray | None = None) -> np.ndarray:
        clean, crossed = cta_tiles(self.launch, backward, self.br, self.bc, blocks)
        return self.fixed + clean * self.t_clean + crossed * self.t_masked


def kernel_time(spec: TiledDevice, impl: Implementation, backward: bool, dtype: str, head_dim: int, rows: int,
                launches: Sequence[Launch], sms: int = 0) -> float | None:
    """Seconds of the launches (run concurrently) of one pass: a launch overhead each, their CTAs over the SMs;
    None beyond the implementation's head dimensions. A grid over :data:`EXACT_GRID` CTAs is never held whole: its
    CTAs' seconds are summed in chunks and only its tail is scheduled CTA by CTA (:func:`makespan`, which spreads
    the rest evenly), so memory stays bounded whatever the sequence. ``sms`` > 0: the CTAs run on that many of the
    device's SMs (the others held by other work: the engine's contention), each as fast as ever."""
    n_sms = sms if sms > 0 else spec.sm_count
    per_sm_bw = spec.mem_bw_Bps * spec.eff_mem / spec.sm_count
    elem = 2 if dtype in ("bf16", "fp16") else 1
    walks = []
    for launch in launches:
        masked = launch.off < launch.nk - 1 or launch.nq == 0
        tiles = impl.tiles(backward, head_dim, masked)
        if tiles is None:
            return None
        br, bc = tiles
        t_clean, t_masked = tile_seconds(spec, impl, backward, dtype, head_dim, br, bc)
        own = (4 * bc if backward else 2 * br) * head_dim * elem  # K, V, dK, dV tiles / Q, O tiles
        blocks = -(-launch.nk // bc) if backward else -(-launch.nq // br)
        walks.append(_Walk(launch, blocks, br, bc, t_clean + own / per_sm_bw, t_clean, t_masked))
    overhead = len(launches) * spec.launch_s
    if sum(w.blocks for w in walks) * rows <= EXACT_GRID:
        grid = np.concatenate([np.tile(w.durations(backward), rows) for w in walks]) if walks else np.zeros(0)
        return overhead + makespan(grid, n_sms)
    return overhead + _large_makespan(walks, backward, rows, n_sms)


def _large_makespan(walks: Sequence[_Walk], backward: bool, rows: int, sms: int) -> float:
    """:func:`makespan` of the grid ``rows`` copies of each walk's CTAs, in order, without building it: the sum of
    every CTA's seconds in chunks of :data:`_CHUNK`, the last :data:`EXACT_TAIL` (rounded as makespan rounds) by
    index."""
    total = 0.0
    for w in walks:
        per_head = sum(float(w.durations(backward, np.arange(s, min(s + _CHUNK, w.blocks))).sum())
                       for s in range(0, w.blocks, _CHUNK))
        total += rows * per_head
    n = sum(w.blocks for w in walks) * rows
    head = _head(n, sms)
    tail: list[np.ndarray] = []
    left = n - head  # CTAs of the tail, taken from the end of the grid backwards
    for w in reversed(walks):
        take = min(left, w.blocks * rows)
        if take <= 0:
            break
        idx = np.arange(w.blocks * rows - take, w.blocks * rows, dtype=np.int64) % w.blocks
        tail.insert(0, w.durations(backward, idx))
        left -= take
    last = np.concatenate(tail)
    return _list_scheduled(max(0.0, total - float(last.sum())), last, sms)


def _side_kernels(spec: TiledDevice, impl: Implementation, backward: bool, dtype: str, call: AttentionCall
                  ) -> tuple[int, float]:
    """(launches, HBM bytes) of a pass's own small kernels: backward, per launch, D = rowsum(dO * O) with the fp32
    dQ accumulator zeroed before, and that accumulator converted after; without in-kernel GQA, the expanded dK, dV
    summed over each KV head's query heads."""
    if not backward:
        return 0, 0.0
    elem = 2 if dtype in ("bf16", "fp16") else 1
    kernels, nbytes = 0, 0.0
    for launch in call.launches:
        q_elems = call.rows * launch.nq * call.head_dim
        kernels += 2
        nbytes += q_elems * (2 * elem + 4) + call.rows * launch.nq * 4  # read O, dO, zero dQacc; write D
        nbytes += q_elems * (4 + elem)  # dQacc in, dQ out
        if call.group > 1 and not impl.gqa_in_kernel:
            kv_elems = call.rows * launch.nk * call.head_dim  # per query head, dK and dV
            kernels += 2
            nbytes += 2 * kv_elems * elem * (1 + 1 + 1 / call.group)  # written expanded, read, summed out
    return kernels, nbytes


_TIMES: dict[tuple[int, bool, str, tuple[float, ...], int], tuple[TiledDevice, float | None]] = {}
_TIMES_MAX = 1 << 14  # entries kept (then started again): a plan or sweep asks for the same blocks many times


def attention_time(spec: TiledDevice, backward: bool, dtype: str, dims: Sequence[float], sms: int = 0
                   ) -> float | None:
    """Seconds of an attention op on ``spec`` by the tile model, or None where it does not apply (the device lacks
    the facts, the dtype or head dimension is not the implementation's, the op carries no launches); ``sms`` > 0:
    its CTAs on that many SMs (:func:`kernel_time`). Kept per device (by identity: specs are frozen) and shape: the
    same op asked again costs a lookup."""
    key = (id(spec), backward, dtype, tuple(dims), sms)
    hit = _TIMES.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    if len(_TIMES) >= _TIMES_MAX:
        _TIMES.clear()
    t = _attention_time(spec, backward, dtype, dims, sms)
    _TIMES[key] = (spec, t)
    return t


def _attention_time(spec: TiledDevice, backward: bool, dtype: str, dims: Sequence[float], sms: int = 0
                    ) -> float | None:
    impl = implementation_of(spec, dtype)
    call = call_of(dims) if impl is not None else None
    if impl is None or call is None:
        return None
    kernels = kernel_time(spec, impl, backward, dtype, call.head_dim, call.rows, call.launches, sms)
    if kernels is None:
        return None
    side, side_bytes = _side_kernels(spec, impl, backward, dtype, call)
    bw = spec.mem_bw_Bps * spec.eff_mem
    return kernels + (side + call.extra_kernels) * spec.launch_s + (side_bytes + call.extra_bytes) / bw
