"""``treering plan``: the smallest cluster on which a model's decode step meets a time-between-tokens target.

A configuration is (algorithm, tensor-parallel degree ``tp``, node count): ``tp`` among the divisors of the GPUs
per node that suit the model's heads, the context sharded over the other ``GPUs / tp`` ways, and a whole decode
step simulated (``scope: model``). It *fits* when every GPU's peak memory is within ``mem_fraction`` of the
device's memory, and *meets* the target when it also runs within ``tbt_s``.

For each algorithm and ``tp`` the search covers every node count up to ``max_nodes``:

1. memory: per-GPU memory never grows with the node count (weights are split over ``tp`` only; the KV cache over
   ever more shards), so the smallest fitting count is found by a closed-form lower bound (weights plus every
   layer's KV shard), then galloping and bisection on simulated points;
2. latency: the smallest fitting count is simulated; if it misses the target, the counts ``n, 2n, 4n, ...,
   max_nodes`` are. Where those latencies are monotone the answer (or the best) is found by bisection between two
   of them, assuming latency is monotone between them too; where they are not, every count is simulated, in
   order, until the target is met;
3. the largest tp is searched first: once a configuration meets the target on G GPUs, the search of another tp
   stops where all it would go on to find is on more GPUs (its memory bound, its smallest fitting count, or the
   count its bisection would find is over G's), having evaluated the same points until then: the same answer.

The answer per algorithm is the fitting configuration that meets the target on the fewest GPUs (then the lowest
latency); when none does, the fastest fitting one is shown with what bounds it (``cannot go below 14.6 ms:
attention communication over NICs``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.errors import InputError
from simulator.models.precision import weight_bytes
from simulator.models.step import dense_on_one_server, model_step
from simulator.plan.verdict import Targets, met
from simulator.run.prepare import prepare_point
from simulator.run.prepared import PreparedPoint, cluster_for
from simulator.run.scenario import DecodeWorkload, Point, scenario_points
from simulator.schedule.memory import out_of_memory
from simulator.support.limits import check_graph, check_schedule

__all__ = ["Evaluation", "PlanRequest", "PlanRow", "memory_lower_bound", "ms", "plan", "tp_candidates"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PlanRequest:
    """What ``treering plan`` is asked: the model, context, target and the search bounds."""

    model: str
    context: int
    tbt_s: float
    topology: str
    algorithms: Sequence[str]
    batch: int = 1
    dtype: str = "bf16"
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    tp: int | None = None
    max_nodes: int = 64
    mem_fraction: float = 0.9
    eff_mem: float | None = None  # every device's, when given
    eff_flops: float | None = None
    sets: Sequence[str] = ()
    force: bool = False  # past the size limits of simulator.support.limits

    @property
    def targets(self) -> Targets:
        return Targets(tbt_s=self.tbt_s)


@dataclass(frozen=True)
class Evaluation:
    """One simulated configuration (seconds, bytes)."""

    algorithm: str
    nodes: int
    gpus: int
    tp: int
    latency_s: float
    peak_mem_bytes: float
    usable_mem_bytes: float  # the smallest device memory x mem_fraction
    oom: bool  # some GPU's peak is over its device memory x mem_fraction (as the scenarios' oom column)
    dense_s: float
    attention_s: float
    attention_compute_s: float
    head_s: float
    intra_class: str  # the link class inside a node, to name attention traffic that stays inside it

    @property
    def fits(self) -> bool:
        return not self.oom

    def meets(self, targets: Targets) -> bool:
        """Fits and runs a step within the time between tokens (:func:`simulator.plan.verdict.met`)."""
        return met(targets, oom=self.oom, tbt_s=self.latency_s)

    def bottleneck(self) -> str:
        """The largest part of the step, named for a reader."""
        comm = self.attention_s - self.attention_compute_s
        where = "over NICs" if self.nodes > 1 else f"over {self.intra_class}"
        parts = {"dense layers (weights read from HBM, tensor-parallel allreduces)": self.dense_s,
                 f"attention communication {where}": comm,
                 "attention compute (KV cache read from HBM)": self.attention_compute_s,
                 "LM head": self.head_s}
        name, value = max(parts.items(), key=lambda kv: kv[1])
        return f"{name}, {ms(value)} of {ms(self.latency_s)}"


@dataclass(frozen=True)
class PlanRow:
    """The plan's answer for one algorithm: ``best`` meets the target (``met``), or is the fastest configuration
    that fits (not met), or is ``None`` when nothing fits up to ``max_nodes``."""

    algorithm: str
    met: bool
    best: Evaluation | None
    binding: str
    evaluated: int
    space: int = 0  # the configurations it could have simulated: tp candidates x node counts


def tp_candidates(gpus_per_node: int, heads: int, kv_heads: int) -> list[int]:
    """Divisors of the GPUs per node that divide the heads and that the KV heads divide or are divided by."""
    return [d for d in range(1, gpus_per_node + 1)
            if gpus_per_node % d == 0 and heads % d == 0 and (kv_heads % d == 0 or d % kv_heads == 0)]


def memory_lower_bound(wl: DecodeWorkload, tp: int, gpus: int) -> float:
    """Bytes every GPU holds at least: its ``1/tp`` of the weights and every layer's largest KV shard (of ``tp``
    head groups, each sharding the context ``gpus / tp`` ways). Transient buffers only add to it."""
    model, shape = wl.model_preset(), wl.shape()
    part = dataclasses.replace(shape, heads=shape.heads // tp, kv_heads=max(1, shape.kv_heads // tp))
    shard = math.ceil(shape.context / (gpus // tp))
    return weight_bytes(model, wl.weights(), tp) + model.layers * part.kv_bytes(shard)


class _Search:
    """Evaluations of one request, cached by (algorithm, tp, nodes)."""

    def __init__(self, req: PlanRequest, progress: Progress | None) -> None:
        self.req = req
        self.progress = progress
        self.cache: dict[tuple[str, int, int], Evaluation] = {}
        self._device_names: list[str] | None = None

    def _tree(self, algorithm: str, tp: int, nodes: int) -> dict[str, Any]:
        r = self.req
        workload: dict[str, Any] = {"kind": "decode", "model": r.model, "scope": "model", "tp": tp,
                                    "batch": r.batch, "context": r.context, "dtype": r.dtype}
        for key in ("weight_dtype", "kv_dtype"):
            if getattr(r, key):
                workload[key] = getattr(r, key)
        return {"name": "plan", "topology": r.topology, "topology_params": {"nodes": nodes}, "workload": workload,
                "algorithms": [algorithm], "mem_fraction": r.mem_fraction}

    def point(self, algorithm: str, tp: int, nodes: int) -> Point:
        """The scenario point of a configuration; ``--eff-mem`` / ``--eff-flops`` become its ``devices:`` key
        (for every device spec of the topology), the request's ``--set`` items apply last."""
        tree = self._tree(algorithm, tp, nodes)
        effs = {k: v for k, v in (("eff_mem", self.req.eff_mem), ("eff_flops", self.req.eff_flops)) if v is not None}
        if effs:
            if self._device_names is None:
                probe = scenario_points(self._tree(algorithm, tp, 1), "treering plan", Path.cwd(), self.req.sets,
                                     self.req.force)[0]
                self._device_names = sorted({spec.name for spec in cluster_for(probe).specs.values()})
            tree["devices"] = {name: dict(effs) for name in self._device_names}
        return scenario_points(tree, "treering plan", Path.cwd(), self.req.sets,
                                     self.req.force)[0]

    def prepare(self, algorithm: str, tp: int, nodes: int) -> PreparedPoint:
        return prepare_point(self.point(algorithm, tp, nodes))

    def evaluate(self, algorithm: str, tp: int, nodes: int) -> Evaluation:
        key = (algorithm, tp, nodes)
        if key in self.cache:
            return self.cache[key]
        prep = self.prepare(algorithm, tp, nodes)
        cluster, wl, algo = prep.cluster, prep.workload, prep.algorithms[0]
        assert isinstance(wl, DecodeWorkload) and prep.shape is not None
        if self.progress:
            self.progress(f"{algorithm}: tp {tp}, {nodes} node(s) ({len(self.cache) + 1} simulated)")
        with dense_on_one_server():  # alike servers: one's dense layer is every one's (latency, memory exact)
            step = model_step(wl.model_preset(), algo.name, algo.params, prep.shape, tp, cluster, wl.weights())
        intra = {d["cls"] for u, v, d in cluster.graph.edges(data=True)
                 if cluster.host_of(u) == cluster.host_of(v) and "gpu" in (cluster.graph.nodes[u]["kind"],
                                                                          cluster.graph.nodes[v]["kind"])}
        ev = Evaluation(
            algorithm=algo.label, nodes=nodes, gpus=len(cluster.ranks), tp=tp, latency_s=step.latency_s,
            peak_mem_bytes=max(step.peaks), usable_mem_bytes=min(prep.capacity(n) for n in cluster.ranks),
            oom=out_of_memory(zip(step.peaks, map(prep.capacity, cluster.ranks), strict=True)),
            dense_s=step.dense_s, attention_s=step.attention_s, attention_compute_s=step.attention_compute_s,
            head_s=step.head_s, intra_class="/".join(sorted(intra)) or "the node")
        self.cache[key] = ev
        return ev


def _smallest_fit(s: _Search, algorithm: str, tp: int, lo: int, hi: int, cap: int | None = None) -> int | None:
    """The smallest node count in [lo, hi] that fits (memory is monotone): gallop from lo, then bisect. With
    ``cap``: None as soon as the count found would be over ``cap`` (the same points evaluated until then)."""
    step, prev = 1, lo - 1
    n = lo
    while True:
        if s.evaluate(algorithm, tp, n).fits:
            break
        if n == hi or (cap is not None and n >= cap):  # the count found will be over n
            return None
        prev, n, step = n, min(hi, n + step), step * 2
    a, b = prev + 1, n  # fits at b, not at prev
    while a < b:
        if cap is not None and a > cap:  # the count found is at least a
            return None
        mid = (a + b) // 2
        if s.evaluate(algorithm, tp, mid).fits:
            b = mid
        else:
            a = mid + 1
    return b


def _monotone(values: Sequence[float]) -> bool:
    return all(x >= y for x, y in itertools.pairwise(values)) or all(x <= y for x, y in itertools.pairwise(values))


def _search_tp(s: _Search, algorithm: str, tp: int, gpn: int, most_gpus: float = math.inf
               ) -> tuple[list[Evaluation], int | None]:
    """(the evaluations that matter, the smallest fitting node count) for one algorithm and tp.

    ``most_gpus``: a configuration of another tp met the target on that many GPUs, so that only configurations on
    as many or fewer can be the answer: the search stops where every configuration it would go on to find is on
    more (the memory bound, or the smallest fitting count, over them), having evaluated the same points until
    then; ([], None) then."""
    req = s.req
    prep = s.prepare(algorithm, tp, 1)
    wl = prep.workload
    assert isinstance(wl, DecodeWorkload)
    usable = max(prep.capacity(n) for n in prep.cluster.ranks)  # the bound must hold on some GPU
    lo = next((n for n in range(1, req.max_nodes + 1) if memory_lower_bound(wl, tp, n * gpn) <= usable), None)
    cap = None if math.isinf(most_gpus) else int(most_gpus) // gpn  # the most nodes a better answer may have
    if lo is None or (cap is not None and lo > cap):
        return [], None
    n_fit = _smallest_fit(s, algorithm, tp, lo, req.max_nodes, cap)
    if n_fit is None:
        return [], None
    first = s.evaluate(algorithm, tp, n_fit)
    if first.meets(req.targets):
        return [first], n_fit
    probes = [n_fit]
    while probes[-1] < req.max_nodes:
        probes.append(min(req.max_nodes, probes[-1] * 2))
    evs = [s.evaluate(algorithm, tp, n) for n in probes]
    hit = next((i for i, e in enumerate(evs) if e.meets(req.targets)), None)
    upto = len(evs) if hit is None else hit + 1
    if _monotone([e.latency_s for e in evs[:upto]]) and all(e.fits for e in evs):
        if hit is None:
            return evs, n_fit
        a, b = probes[hit - 1] + 1, probes[hit]  # bisection: meets at b, not at a - 1
        while a < b:
            if cap is not None and a > cap:  # the count it finds is over cap: not the answer
                return evs, n_fit
            mid = (a + b) // 2
            if s.evaluate(algorithm, tp, mid).meets(req.targets):
                b = mid
            else:
                a = mid + 1
        return [*evs, s.evaluate(algorithm, tp, b)], n_fit
    scanned = []
    for n in range(n_fit, req.max_nodes + 1 if cap is None else min(req.max_nodes, cap) + 1):
        # not monotone: every count, until one meets the target (up to cap: beyond, none can be the answer)
        ev = s.evaluate(algorithm, tp, n)
        scanned.append(ev)
        if ev.meets(req.targets):
            break
    return scanned, n_fit


def plan(req: PlanRequest, progress: Progress | None = None) -> list[PlanRow]:
    """One :class:`PlanRow` per algorithm."""
    s = _Search(req, progress)
    probe = s.prepare(req.algorithms[0], 1, 1)
    cluster = probe.cluster
    if cluster.num_hosts != 1:
        raise InputError(f"plan varies topology_params.nodes; {req.topology} has {cluster.num_hosts} nodes with "
                         "nodes: 1 (use a parametric preset)", field="--topology")
    gpn = len(cluster.ranks)
    wl = probe.workload
    assert isinstance(wl, DecodeWorkload)
    heads, kv = wl.heads_kv()
    tps = [req.tp] if req.tp else tp_candidates(gpn, heads, kv)
    if req.tp and (gpn % req.tp or req.tp not in tp_candidates(gpn, heads, kv)):
        raise InputError(f"must divide the {gpn} GPUs per node and suit the model's {heads} heads and {kv} KV "
                         f"heads; candidates: {', '.join(map(str, tp_candidates(gpn, heads, kv)))}", field="--tp")
    graph = cluster.graph.number_of_nodes() + cluster.graph.number_of_edges()
    check_graph(graph * req.max_nodes, f"{req.max_nodes:,} nodes of {req.topology}", "--max-nodes", req.force)
    for algorithm in req.algorithms:  # the largest cluster tried
        check_schedule(algorithm, req.max_nodes * gpn // min(tps), "--max-nodes", req.force)
    rows = []
    for algorithm in req.algorithms:
        before = len(s.cache)
        by_tp: dict[int, list[Evaluation]] = {}
        fit_at: dict[int, int] = {}
        most_gpus = math.inf  # the fewest GPUs a configuration found met the target on
        for tp in sorted(tps, reverse=True):  # the largest tp fits on the fewest nodes: its answer bounds the rest
            evs, n_fit = _search_tp(s, algorithm, tp, gpn, most_gpus)
            by_tp[tp] = evs
            if n_fit is not None:
                fit_at[tp] = n_fit
            most_gpus = min([most_gpus, *(e.gpus for e in evs if e.meets(req.targets))])
        found = [e for tp in tps for e in by_tp[tp]]  # in the order of tps, as ties are broken
        rows.append(dataclasses.replace(_row(algorithm, found, fit_at, req, len(s.cache) - before),
                                        space=len(tps) * req.max_nodes))
    return rows


def _row(algorithm: str, found: list[Evaluation], fit_at: dict[int, int], req: PlanRequest, count: int
         ) -> PlanRow:
    meeting = [e for e in found if e.meets(req.targets)]
    if meeting:
        best = min(meeting, key=lambda e: (e.gpus, e.latency_s))
        if best.nodes == 1:
            binding = "none: one node is enough"
        elif fit_at.get(best.tp) == best.nodes:
            binding = f"memory: {best.nodes - 1} node(s) do not fit at tp {best.tp}"
        else:
            binding = f"latency: {best.nodes - 1} node(s) are too slow at tp {best.tp}"
        return PlanRow(algorithm, True, best, binding, count)
    fitting = [e for e in found if e.fits]
    if not fitting:
        return PlanRow(algorithm, False, None, f"memory: weights + KV cache do not fit in {req.mem_fraction:g} of "
                                               f"device memory up to {req.max_nodes} nodes", count)
    best = min(fitting, key=lambda e: (e.latency_s, e.gpus))
    return PlanRow(algorithm, False, best, f"cannot go below {ms(best.latency_s)} up to {req.max_nodes} nodes: "
                                           f"{best.bottleneck()}", count)


def ms(seconds: float) -> str:
    """``27.3 ms``, ``2604 ms``: three significant digits, never an exponent."""
    x = seconds * 1e3
    return f"{x:.0f} ms" if x >= 100 else f"{x:.3g} ms"
