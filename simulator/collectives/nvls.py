"""NVLS (NVLink SHARP): an allreduce that the NVSwitch reduces, as NCCL runs it on one server.

**Traffic.** NCCL's single-server NVLS allreduce (``src/device/all_reduce.h``, ``RunWorkColl<ncclFuncAllReduce, T,
RedOp, NCCL_ALGO_NVLS, NCCL_PROTO_SIMPLE>``, the ``oneNode`` branch) makes every GPU the *head* of one share of each
chunk (``nHeads`` = the GPU count, ``src/graph/search.cc``: "Force intra-node NVLS algorithm to pull evenly from all
GPUs"). A head's reduce warps ``multimem.ld_reduce`` its share from the multicast address (the switch pulls that
share from every GPU and returns the sum to the head) and ``multimem.st`` it back (the switch multicasts it to every
GPU): ``prims.directRecvDirectSend`` on ``nvls->down``. Over all heads, each GPU's link to the switch carries, each
way, its whole buffer and its own share once more: ``S (n + 1) / n`` bytes for a buffer of ``S`` on ``n`` GPUs (NCCL
issue 2072 draws the same flow; S. Jeaugey, NCCL issue 1506: NVLS "transmit[s] size in one direction and 1/N size in
the other" for each of its two halves).

**Rate.** Those bytes move at what an NVLink carries, not its line rate: NCCL counts 20.6 GB/s per Hopper NVLink and
40.1 per Blackwell NVLink (``src/graph/topo.h``, ``SM90_NVLINK_BW``, ``SM100_NVLINK_BW``) where the line rate is 25 and
50 GB/s per direction (NVLink4: 900 GB/s bidirectional over 18 links, Hopper datasheet; NVLink5: 1.8 TB/s over 18,
Blackwell datasheet); S. Jeaugey, nccl-tests issue 212: "450GB/s is the line rate. With the protocol overhead (~20%)
NCCL can get an effective NVLink bandwidth of 370GB/s". The multimem path then reaches NCCL's NVLS efficiency of
that (``nvlsEfficiency``, ``src/graph/tuning.cc``: 0.85 Hopper, 0.74 Blackwell). So a GPU's link moves NVLS payload
at ``B x eta_link x eta_nvls x n / (n + 1)`` (:func:`nvls_wire` is the inverse factor, bytes on the wire per payload
byte), and the bus bandwidth nccl-tests reports tends to ``2 (n - 1) / n`` of that (:func:`nvls_bus_bandwidth`:
490 GB/s on 8 x H100). The NVSwitch's own reduction rate is not a bound here: no vendor figure for it was found,
and the measured NVLS algorithm bandwidth grows with the GPU count as ``n / (n + 1)`` does (NCCL issue 1455: 258,
265, 270, 273 GB/s on 5 to 8 H100), where a switch-bound reduction (``n - 1`` additions per element) would fall.

**Pipeline.** A head's reduce warps ``ld_reduce`` and ``st`` their share a few vectors at a time
(``directRecvDirectSend`` over the protocol's steps), so the way up and the way down stream together: the pipeline's
slice is the Simple protocol's step, 512 KiB (:func:`nvls_slices`, at most ``ring.MAX_SLICES``), and the data takes
``slices + 1`` slice times (the first slice's way down is the fill).

**Latency.** NCCL's model charges NVLS one NVLink latency in all (``tuning.cc``: ``latencies[NVLS] = intraLat``, 25
us, base 0): the first slice's way up pays it, its way down its route's own latency.

The schedule: per slice, every GPU sends its slice up (the first GPU's lands in the switch's buffer, the others'
are added to it: the switch's reductions, no time), the switch sends the sum down to every GPU; each transfer
carries the slice's bytes on the wire (:func:`nvls_wire`), the traffic of the ``ld_reduce`` and ``st`` halves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from simulator.collectives import ring as _ring
from simulator.collectives.base import CollBuilder, chunk_bounds
from simulator.schedule.core import STREAMED

__all__ = ["NVLS_ARCHS", "nvls_allreduce", "nvls_bus_bandwidth", "nvls_slices", "nvls_time", "nvls_wire"]

_GB = 1e9
# per NVLink, one direction, GB/s: (line rate: Hopper / Blackwell datasheets, NCCL's figure: src/graph/topo.h)
_NVLINK = {"hopper": (25.0, 20.6), "blackwell": (50.0, 40.1)}
_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}  # src/graph/tuning.cc nvlsEfficiency
NVLS_ARCHS = tuple(_NVLINK)


def _arch(arch: str) -> str:
    if arch not in _NVLINK:
        raise ValueError(f"NVLS runs on {', '.join(NVLS_ARCHS)} GPUs, not {arch!r}")
    return arch


def nvls_wire(arch: str, heads: int) -> float:
    """Bytes a GPU's link to the switch carries, each way, per payload byte, in line-rate bytes: the ``ld_reduce``
    and ``st`` traffic ``(n + 1) / n`` over NVLink's data rate and NCCL's NVLS efficiency (module docstring)."""
    line, nccl = _NVLINK[_arch(arch)]
    if heads < 1:
        raise ValueError(f"heads must be positive, got {heads}")
    return (heads + 1) / heads / (nccl / line * _EFFICIENCY[arch])


def nvls_bus_bandwidth(link_Bps: float, arch: str, heads: int) -> float:
    """nccl-tests' bus bandwidth of a large NVLS allreduce on ``heads`` GPUs whose links to the switch carry
    ``link_Bps`` each way: ``2 (n - 1) / n x link / wire`` (the pipeline's fill and the latency left out)."""
    return 2 * (heads - 1) / heads * link_Bps / nvls_wire(arch, heads)


def nvls_slices(payload: float) -> int:
    """The pipeline's slices for ``payload`` bytes: the Simple protocol's steps, at most ``ring.MAX_SLICES`` (read at
    each call: ``benchmarks/nccl_tree.py --max-slices`` changes it)."""
    return min(_ring.MAX_SLICES, max(1, math.ceil(payload / _ring.PIPELINE_SLICE_BYTES)))


def nvls_time(payload: float, wire: float, slices: int, link_Bps: float, up_s: float, down_s: float) -> float:
    """Seconds of the NVLS pipeline alone on its links (the launch not included): the first slice's latency up
    and down, then ``slices + 1`` slice times at the link's rate (``payload x wire`` bytes on the wire)."""
    return up_s + down_s + (slices + 1) * payload * wire / slices / link_Bps


def nvls_allreduce(b: CollBuilder, ranks: Sequence[int], switch: int, slices: int, up_s: float) -> None:
    """The schedule (module docstring) on ``b``'s elements: ``slices`` pipeline slices; the first slice's sends
    up take at least ``up_s`` (NCCL's NVLS latency), its sends down their route's latency; the later slices stream
    behind it (``STREAMED``)."""
    sched, size = b.sched, b.elem_bytes * b.wire
    up = {r: b.front[r] for r in ranks}
    down = dict(up)
    for k, (lo, hi) in enumerate(lohi for lohi in chunk_bounds(b.n, slices) if lohi[1] > lohi[0]):
        lo, hi = lo + b.offset, hi + b.offset
        recvs = []
        for i, r in enumerate(ranks):  # the first GPU's slice lands in the switch's buffer, the others' are added
            snd, rcv = sched.add_transfer(r, switch, (hi - lo) * size, b.tag, send_deps=up[r], args=(b.buf,),
                                          dst_args=(b.buf if i == 0 else f"{b.tag}.nvls{k}.{r}",), lo=lo, hi=hi,
                                          coll=b.tag, into=i == 0, floor_s=up_s if k == 0 else STREAMED)
            up[r] = (snd,)
            recvs.append(rcv)
        red = recvs[0]
        for r, rcv in zip(ranks[1:], recvs[1:], strict=True):
            red = sched.add_compute(switch, f"{b.tag}.reduce", flops=0.0, dtype=b.dtype, deps=(rcv, red),
                                    fn=f"reduce-{b.op}", out=b.buf, args=(f"{b.tag}.nvls{k}.{r}",), lo=lo, hi=hi,
                                    fused=True, coll=b.tag)
        for r in ranks:
            _, rcv = sched.add_transfer(switch, r, (hi - lo) * size, b.tag, send_deps=(red,), recv_deps=down[r],
                                        args=(b.buf,), lo=lo, hi=hi, coll=b.tag, into=True,
                                        floor_s=0.0 if k == 0 else STREAMED)
            down[r] = (rcv,)
    for r in ranks:
        b.front[r] = (*down[r], *up[r])
