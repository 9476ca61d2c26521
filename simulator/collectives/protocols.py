"""NCCL's protocols (LL, LL128, Simple): per-collective base latency, per-hop latency, bytes on the wire.

Constants from NCCL's cost model, ``src/graph/tuning.cc`` (``ncclTunerConstantsDefaults``, v2.2x-2.30), in
microseconds as LL / LL128 / Simple (../shared/hardware.md):

================  =================  =================  ======================
                  Tree               Ring               NVLS (Simple only)
================  =================  =================  ======================
base latency      6.8 / 14.0 / 8.4   6.6 / 14.0 / 8.4   0
per hop, NVLink   0.6 / 1.25 / 4.0   0.6 / 1.9 / 3.4    25
per hop, PCI      1.0 / 1.9 / 4.0    1.0 / 2.5 / 5.7    (none)
per hop, network  5.0 / 8.5 / 14     2.7 / 4.0 / 14.0   18
================  =================  =================  ======================

Bandwidth is not a constant here but the protocol's mechanism: LL sends 8-byte lines of 4 data bytes and a 4-byte
flag (twice the bytes on the wire; NCCL's model: ``busBw * 0.5``), LL128 128-byte lines of 120 data bytes
(``120/128``; NCCL models ring LL128 as ``0.92``), Simple the payload. NVLS's traffic and efficiency are its own
(:mod:`.nvls`). Channels used for a message: NCCL drops channels while ``bytes < channels * threads *
threshold`` (``src/enqueue.cc``; threads 512 / 640 / 512, thresholds 8 (x ranks for ring LL) / 8 / 64 bytes,
``src/include/comm.h``, ``device.h``). A pipeline moves a step's buffer at a time: NCCL's channel buffer over
``NCCL_STEPS`` = 8 steps (``src/init.cc``: ``DEFAULT_LL_BUFFSIZE`` = 8 lines x 512 threads x 8 steps x 16 bytes,
``DEFAULT_LL128_BUFFSIZE`` = 120 x 640 x 8 x 8 bytes, ``DEFAULT_BUFFSIZE`` = 4 MiB), so a step carries 32 KiB of
payload with LL, 576,000 bytes with LL128 and 512 KiB with Simple (:func:`step_payload`).

What a rank waits for before it passes data on differs (:func:`forward_grain`). Simple is store-and-forward by
step: the receiver waits on the connection's tail counter, which the sender advances once a whole step is written
(``src/device/prims_simple.h``). LL and LL128 carry a flag in every line, so inside a server a rank forwards lines as
they arrive (cut-through): LL's threads each read one 16-byte line, wait for its flags and store it on to the next
rank at once (``prims_ll.h``, ``LLGenericOp``), LL128's warps wait for the flags of their 16 lines of 128 bytes
(``prims_ll128.h``, ``recvReduceSendCopy``); the grain is a warp's lines, 256 payload bytes with LL, 1,920 with
LL128. Across servers the proxy thread sends a step only once every line of it is in (``src/transport/net.cc``,
``sendProxyProgress`` checks the step's flags), so a network connection holds back a whole step: the GPU writes its
lines as they arrive (the connection's flow, at the protocol's rate) and the rank across the network gets whole
steps (what follows the connection waits for the step's last line). The NIC's own copy of a step, at its line rate
after the last line is in, is not added: with LL a fiftieth of the step's time at LL's rate on a 400 Gb/s NIC.

A topology may replace any of these latencies (``nccl_latency:``, what ``treering calibrate --from-nccl-tests``
fits): ``table`` maps ``"ALGO.PROTOCOL.KIND"`` (KIND ``base``, ``nvlink``, ``pci`` or ``net``) to seconds.
"""

from __future__ import annotations

from collections.abc import Mapping

from simulator.cluster.nccl_keys import ALGOS, LATENCY_KINDS, PROTOCOLS, latency_key

__all__ = ["ALGOS", "LATENCY_KINDS", "PROTOCOLS", "base_latency", "channels_for", "forward_grain", "hop_latency",
           "latency_key", "step_payload", "wire_factor"]

_US = 1e-6
_BASE = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0)}
_HOP = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0.0, 0.0, 0.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0)},
}
_WIRE = {"LL": 2.0, "LL128": 128.0 / 120.0, "Simple": 1.0}
_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
_NCCL_STEPS = 8
_GRAIN = {"LL": 32 * 8.0, "LL128": 16 * 120.0}  # a warp's lines of payload (32 of 8 bytes; 16 of 120 bytes)
_BUFFSIZE = {"LL": 8 * 512 * _NCCL_STEPS * 16, "LL128": 120 * 640 * _NCCL_STEPS * 8, "Simple": 1 << 22}


def _index(proto: str) -> int:
    if proto not in PROTOCOLS:
        raise ValueError(f"unknown protocol {proto!r}; valid: {', '.join(PROTOCOLS)}")
    return PROTOCOLS.index(proto)


def base_latency(algo: str, proto: str, table: Mapping[str, float] | None = None) -> float:
    """Seconds a collective of ``algo`` with ``proto`` costs once (NCCL's ``baseLatencies``, or ``table``'s)."""
    if table and (key := latency_key(algo, proto, "base")) in table:
        return table[key]
    return _BASE[algo][_index(proto)] * _US


def hop_latency(algo: str, proto: str, hw: str, table: Mapping[str, float] | None = None) -> float:
    """Seconds of one step over a hop of class ``hw`` (``nvlink``, ``pci``, ``net``): NCCL's ``hwLatencies``, or
    ``table``'s."""
    if table and (key := latency_key(algo, proto, hw)) in table:
        return table[key]
    return _HOP[hw][algo][_index(proto)] * _US


def wire_factor(algo: str, proto: str) -> float:
    """Bytes on the wire per payload byte of ``proto``'s line format (``algo``'s own traffic is not in it: NVLS's
    is :func:`.nvls.nvls_wire`)."""
    del algo
    return _WIRE[proto]


def step_payload(proto: str) -> float:
    """Payload bytes one pipeline step of ``proto`` carries: a channel buffer's step, less the protocol's flags."""
    return _BUFFSIZE[proto] / _NCCL_STEPS / _WIRE[proto]


def forward_grain(proto: str) -> float | None:
    """Payload bytes after which a rank inside a server passes on what it received (module docstring): a warp's
    lines with LL and LL128 (cut-through); ``None`` with Simple, which forwards whole steps."""
    return _GRAIN.get(proto)


def channels_for(nbytes: float, channels: int, algo: str, proto: str, ranks: int) -> int:
    """How many of ``channels`` NCCL uses for a message of ``nbytes`` (at least one)."""
    threshold = _THRESHOLD[proto] * (ranks if algo == "ring" and proto == "LL" else 1)
    nc = channels
    while nc > 1 and nbytes < nc * _THREADS[proto] * threshold:
        nc -= 1
    return nc
