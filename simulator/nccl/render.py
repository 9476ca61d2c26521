"""The fitted topology of ``treering calibrate --from-nccl-tests`` as an explicit topology YAML, with comments.

Every node and link of the cluster is written (links whose two directions agree as one full-duplex ``a``/``b``
entry), NCCL's latencies that the fit changed under ``nccl_latency``, and the comments say where the numbers came
from: the logs, the base topology, each fitted value beside its start, the fit quality and the held-out check.
:func:`simulator.cluster.topology.load_topology` reads it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from simulator.cluster.devices import DeviceSpec
from simulator.cluster.nccl_keys import ALGOS, LATENCY_KINDS, PROTOCOLS, latency_key
from simulator.cluster.size_curve import SizeCurve
from simulator.cluster.topology import Cluster, device_library

__all__ = ["render_fitted"]


def _bw(x: float) -> str:
    return f"{x / 1e9:.6g} GB/s"


def _time(x: float) -> str:
    return f"{x * 1e6:.6g} us"


def _spec(spec: DeviceSpec) -> str:
    fields = {"peak_flops": "{" + ", ".join(f"{k}: {v / 1e12:.6g} TFLOP/s" for k, v in spec.peak_flops.items()) + "}",
              "mem_bw": _bw(spec.mem_bw_Bps), "mem": f"{spec.mem_bytes / 1e9:.6g} GB",
              "launch_overhead": _time(spec.launch_s), "eff_flops": f"{spec.eff_flops:g}",
              "eff_mem": f"{spec.eff_mem:g}"}
    if spec.attention_eff:
        fields["attention_efficiency"] = "{" + ", ".join(f"{k}: {v:g}" for k, v in spec.attention_eff.items()) + "}"
    return "{" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}"


def _links(cluster: Cluster) -> list[str]:
    graph = cluster.graph
    out, done = [], set()
    for u, v, data in graph.edges(data=True):
        if (u, v) in done:
            continue
        back = graph.edges[v, u] if graph.has_edge(v, u) else None
        fields = f"bandwidth: {_bw(data['bandwidth'])}, latency: {_time(data['latency'])}, class: {data['cls']}"
        if "by_size" in data:
            fields += f", bandwidth_by_size: {_curve(data['by_size'])}"
        if back is not None and all(back.get(k) == data.get(k) for k in ("bandwidth", "latency", "cls", "by_size")):
            done.add((v, u))
            out.append(f"  - {{a: {u}, b: {v}, {fields}}}")
        else:
            out.append(f"  - {{src: {u}, dst: {v}, {fields}}}")
    return out


def _curve(curve: SizeCurve) -> str:
    """A by-size bandwidth in flow style (:meth:`SizeCurve.to_yaml`'s figures)."""
    body = curve.to_yaml()
    return f"{{bytes: [{', '.join(map(str, body['bytes']))}], bandwidth: [{', '.join(body['bandwidth'])}]}}"


def _latencies(table: dict[str, float]) -> list[str]:
    out = []
    for algo in ALGOS:
        protos = []
        for proto in PROTOCOLS:
            kinds = [f"{kind}: {_time(table[key])}" for kind in LATENCY_KINDS
                     if (key := latency_key(algo, proto, kind)) in table]
            if kinds:
                protos.append(f"    {proto}: {{{', '.join(kinds)}}}")
        if protos:
            out += [f"  {algo}:", *protos]
    return out


def render_fitted(cluster: Cluster, comments: Sequence[str]) -> str:
    """The explicit topology YAML of ``cluster``, ``comments`` (lines without ``#``) first."""
    library = device_library()
    own = {spec.name: spec for spec in cluster.specs.values() if library.get(spec.name) != spec}
    out = [f"# {line}".rstrip() for line in comments]
    out.append(f"name: {cluster.name}")
    scalars: dict[str, Any] = {"message_overhead": cluster.message_overhead_s, "comm_overhead": cluster.comm_overhead_s,
                               "collective_overhead": cluster.collective_overhead_s}
    out += [f"{k}: {_time(v)}" for k, v in scalars.items() if v is not None]
    if own:
        out += ["devices:", *(f"  {name}: {_spec(spec)}" for name, spec in own.items())]
    if cluster.nccl_latency:
        out += ["# NCCL's protocol latencies as fitted (the rest: simulator/collectives/protocols.py, NCCL's own)",
                "nccl_latency:", *_latencies(dict(cluster.nccl_latency))]
    for key, table in (("host_cores", cluster.host_cores), ("host_mem_bw", cluster.host_mem_bw),
                       ("host_copy_bw", cluster.host_copy_bw)):
        if table:
            body = ", ".join(f"{h}: {v if key == 'host_cores' else _bw(v)}" for h, v in table.items())
            out.append(f"{key}: {{{body}}}")
    if cluster.host_copy_bw_by_size:
        curves = ", ".join(f"{h}: {_curve(c)}" for h, c in cluster.host_copy_bw_by_size.items())
        out.append(f"host_copy_bw_by_size: {{{curves}}}")
    out.append("nodes:")
    for name, data in cluster.graph.nodes(data=True):
        device = f", device: {data['device']}" if data.get("device") else ""
        out.append(f"  - {{name: {name}, kind: {data['kind']}{device}}}")
    out += ["links:", *_links(cluster)]
    return "\n".join(out) + "\n"
