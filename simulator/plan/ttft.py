"""``treering plan SCENARIO --ttft T [--tbt T]``: the smallest cluster of the scenario's topology family on which a
prefill (or a generate request: prefill, then decode) meets a time-to-first-token target, and a time between
tokens too, with the prefill strategy chosen.

The scenario's workload is ``prefill`` or ``generate`` (its ``scope`` as given: ``scope: model`` is the whole
model). A configuration is (node count, tensor-parallel degree ``tp``, prefill strategy, layout):

* strategies: ``ring``, ``allgather``, ``ulysses`` (a prefill scenario's own ``algorithms:``, ``single`` left out);
  layouts: ``contiguous``, ``zigzag``, ``striped`` when causal (the scenario's own otherwise);
* ``tp`` (``scope: model`` only; ``--tp`` fixes it): the divisors of the GPUs per node that suit the heads, less
  those whose share of the weights alone is over the usable memory (it does not shrink with more nodes);
* TTFT is the prefill's simulated latency; a generate workload is then run with the fastest fitting prefill of
  each (nodes, tp), every decode schedule of its ``algorithms:``, for TPOT (mean time per output token) and memory.

A configuration *fits* when no GPU's peak (the prefill's, and for generate the decode steps' too) is over
``mem_fraction`` of its memory, and *meets* when it fits, its TTFT is at most ``ttft_s`` and (with ``tbt_s``) its
TPOT at most ``tbt_s``. Node counts ``1, 2, 4, ..., max_nodes`` are simulated until one meets; the answer is then
bisected between it and the previous one, assuming "meets" is monotone between them (:mod:`simulator.plan.decode` does
the same for decode). Whether a count meets is settled tp after tp (:meth:`Search.meets_at`: a tp out of memory by
a lower bound is not simulated); only the answer's count and the one below it are simulated whole. At the answer's
node count every strategy's best configuration is listed: the answer first (fewest GPUs, then lowest TTFT), the
runner-up second. When no count meets, the configuration with the lowest TTFT that fits is shown with what bounds
it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from simulator.algorithms import resolve
from simulator.algorithms.prefill import PREFILL_REGISTRY
from simulator.cluster.topology import Cluster
from simulator.errors import InputError
from simulator.plan.decode import ms, tp_candidates
from simulator.plan.search import LAYOUTS, Config, Progress, Search, TtftRequest, seconds
from simulator.plan.verdict import Targets, binding
from simulator.run.prepared import cluster_for
from simulator.run.scenario import Point, load_scenario
from simulator.schedule.memory import usable_bytes
from simulator.support.limits import check_graph, check_schedule
from simulator.units import DTYPE_BYTES
from simulator.workloads.generate import GenerateWorkload
from simulator.workloads.prefill import PrefillWorkload

__all__ = ["LAYOUTS", "Config", "TtftPlan", "TtftRequest", "plan_ttft", "seconds"]


@dataclass(frozen=True)
class TtftPlan:
    """The answer: ``rows`` (every strategy's best configuration at the answer's node count, best first),
    whether it ``met`` the targets, what bound it, and how many configurations were simulated."""

    rows: list[Config]
    binding: str
    evaluated: int
    kind: str  # the workload's: prefill or generate
    reproduce: list[str]  # the command that runs the answer (treering run SCENARIO --set ...)
    model: str = ""  # the scenario's model (a preset's name, or custom)
    topology: str = ""
    targets: Targets = field(default_factory=Targets)  # what every row's verdict is judged by (plan.verdict)
    tokens: int = 0  # the prompt (prefill: the sequence) in tokens, as resolved ("256K": 262,144)
    prefills: int = 0  # of the evaluated: configurations' prefills (the rest: generate requests run whole)
    space: int = 0  # the configurations the search could have simulated: node counts x tp x strategies x layouts

    @property
    def met(self) -> bool:
        """The answer (the first row) meets every target and fits."""
        return bool(self.rows) and self.rows[0].meets(self.targets)


def _base(req: TtftRequest) -> Point:
    points = load_scenario(req.scenario, req.sets, req.force)
    base = points[0]
    wl = base.scenario.workload
    if not isinstance(wl, (PrefillWorkload, GenerateWorkload)):
        raise base.locate(InputError(f"--ttft plans prefill and generate workloads, not {wl.kind} (for decode: "
                                     "treering plan --model M --context N --tbt T)", field="workload.kind"))
    if len(points) > 1:
        raise base.locate(InputError("plan searches the cluster itself: give one point (remove the sweep, or "
                                     "--set sweep={})", field="sweep"))
    if req.tbt_s is not None and isinstance(wl, PrefillWorkload):
        raise InputError("a prefill workload has no tokens to decode; --tbt needs a generate workload",
                         field="--tbt")
    return base


def plan_ttft(req: TtftRequest, progress: Progress | None = None) -> TtftPlan:
    """Search the node counts of the scenario's topology (module docstring)."""
    base = _base(req)
    s = Search(req, base, progress)
    if not s.strategies():
        raise base.locate(InputError("needs a context-parallel strategy (ring, allgather or ulysses)",
                                     field="algorithms"))
    one = s._point({"topology_params.nodes": 1})
    cluster = cluster_for(one)  # (not prepare_point: the scenario's own tp and layout may not suit one node)
    if cluster.num_hosts != 1:
        raise base.locate(InputError(f"plan varies topology_params.nodes; {base.scenario.topology} has "
                                     f"{cluster.num_hosts} nodes with nodes: 1 (use a parametric preset)",
                                     field="topology"))
    gpn = len(cluster.ranks)
    wl = s.wl
    shape = wl.shape() if isinstance(wl, PrefillWorkload) else wl.prefill_shape()
    heads, kv = shape.heads, shape.kv_heads
    if req.tp is not None:
        if wl.scope != "model" or req.tp not in tp_candidates(gpn, heads, kv):
            why = "needs scope: model" if wl.scope != "model" else \
                f"must divide the {gpn} GPUs per node and suit the model's {heads} heads and {kv} KV heads; " \
                f"candidates: {', '.join(map(str, tp_candidates(gpn, heads, kv)))}"
            raise InputError(why, field="--tp")
        tps = [req.tp]
    elif wl.scope == "model":
        usable = min(usable_bytes(cluster.specs[n].mem_bytes, one.scenario.mem_fraction) for n in cluster.ranks)
        weights = wl.model_preset().params * DTYPE_BYTES[wl.dtype]
        tps = [t for t in tp_candidates(gpn, heads, kv) if weights / t <= usable] or [gpn]  # weights alone: no fit
    else:
        tps = [wl.tp]
    _check_size(s, cluster, gpn // min(tps), req)
    met: dict[int, bool] = {}  # by node count, in the order searched

    def met_at(n: int) -> bool:
        if n not in met:
            met[n] = s.meets_at(n, tps)
        return met[n]

    probes = [1]
    while probes[-1] < req.max_nodes:
        probes.append(min(req.max_nodes, probes[-1] * 2))
    hit = next((i for i, n in enumerate(probes) if met_at(n)), None)
    if hit is None:
        return _counted(s, tps, _unmet(s, {n: s.at(n, tps) for n in met}, req))
    a, b = (probes[hit - 1] + 1, probes[hit]) if hit else (1, 1)
    while a < b:
        mid = (a + b) // 2
        if met_at(mid):
            b = mid
        else:
            a = mid + 1
    rows = _per_strategy(s.at(b, tps), s)  # every configuration of the answer's count and of the one below
    smaller = [n for n in met if n < b]
    why = _binding(s, s.at(max(smaller), tps), max(smaller)) if smaller else "none: one node is enough"
    return _counted(s, tps, TtftPlan(rows, why, s.count, s.kind, _reproduce(req, rows[0]), *_names(s)))


def _counted(s: Search, tps: list[int], result: TtftPlan) -> TtftPlan:
    """``result`` with how many configurations' prefills were simulated, of how many the search could have."""
    prefills = sum(isinstance(c, Config) for c in s.prefills.values())
    space = s.req.max_nodes * len(tps) * len(s.strategies()) * len(s.layouts())
    return dataclasses.replace(result, prefills=prefills, space=space)


def _check_size(s: Search, cluster: Cluster, groups_per_node: int, req: TtftRequest) -> None:
    """Refuse, before any simulation, a search whose largest cluster (``--max-nodes``) or its schedules would be
    too big to build (:mod:`simulator.support.limits`; ``--force`` runs it anyway)."""
    graph = cluster.graph.number_of_nodes() + cluster.graph.number_of_edges()
    check_graph(graph * req.max_nodes, f"{req.max_nodes:,} nodes of {s.base.scenario.topology}", "--max-nodes",
                req.force)
    for i, (_, entry) in enumerate(s.strategies()):
        name, _ = resolve(entry, field=f"algorithms.{i}", registry=PREFILL_REGISTRY)
        check_schedule(f"prefill:{name}", req.max_nodes * groups_per_node, "--max-nodes", req.force)


def _rank(s: Search) -> Callable[[Config], tuple[bool, int, float, float]]:
    return lambda c: (not s.meets(c), c.gpus, c.ttft_s, c.tpot_s if not math.isnan(c.tpot_s) else 0.0)


def _per_strategy(configs: list[Config], s: Search) -> list[Config]:
    """The best configuration of each prefill strategy, best first (meets, fewest GPUs, lowest TTFT)."""
    best: dict[str, Config] = {}
    for c in sorted(configs, key=_rank(s)):
        best.setdefault(c.strategy, c)
    return list(best.values())


def _binding(s: Search, configs: list[Config], nodes: int) -> str:
    """Why ``nodes`` nodes (the largest count below the answer) did not do: the constraint that binds them
    (:func:`simulator.plan.verdict.binding`), told with the configuration that came closest."""
    bound = binding(s.req.targets, [c.values for c in configs])
    fitting = [c for c in configs if c.fits]
    if bound == "memory" or not fitting:
        return f"memory: {nodes} node(s) do not fit"
    fast = min(fitting, key=lambda c: c.ttft_s)
    if bound == "ttft":
        return f"ttft: {nodes} node(s) take at least {seconds(fast.ttft_s)} ({fast.strategy} {fast.layout}, " \
               f"tp {fast.tp}; {fast.bound()})"
    quick = [c for c in fitting if c.meets(Targets(ttft_s=s.req.ttft_s))]
    best = min(quick, key=lambda c: c.tpot_s)
    return f"tbt: {nodes} node(s) meet the TTFT but decode at {ms(best.tpot_s)} per token at best ({best.decode})"


def _unmet(s: Search, found: dict[int, list[Config]], req: TtftRequest) -> TtftPlan:
    every = [c for cs in found.values() for c in cs]
    errors = [e for e in s.prefills.values() if isinstance(e, InputError)]
    if not every and errors:  # no configuration could be built at all: say why
        raise errors[0]
    fitting = [c for c in every if c.fits]
    if not fitting:
        return TtftPlan([], f"memory: nothing fits in {req.max_nodes} node(s) or fewer", s.count, s.kind, [],
                        *_names(s))
    fast = min(fitting, key=lambda c: (c.ttft_s, c.gpus, c.tpot_s if not math.isnan(c.tpot_s) else 0.0))
    rows = _per_strategy([c for c in found[fast.nodes] if c.fits], s)
    rows = [fast, *[c for c in rows if c.strategy != fast.strategy]]
    why = f"cannot go below a TTFT of {seconds(fast.ttft_s)} up to {req.max_nodes} nodes ({fast.bound()})"
    if req.tbt_s is not None:
        low = min((c for c in fitting if not math.isnan(c.tpot_s)), key=lambda c: c.tpot_s, default=None)
        if low is not None:
            why += f"; the lowest TPOT is {ms(low.tpot_s)} ({low.decode} on {low.nodes} node(s))"
    return TtftPlan(rows, why, s.count, s.kind, _reproduce(req, fast), *_names(s))


def _names(s: Search) -> tuple[str, str, Targets, int]:
    """The model's name, the topology's, the targets and the prompt's tokens: what the answer is told with."""
    model = s.wl.model if isinstance(s.wl.model, str) else "custom"
    tokens = s.wl.sequence if isinstance(s.wl, PrefillWorkload) else s.wl.prompt
    return model, s.base.scenario.topology, s.req.targets, tokens


def _reproduce(req: TtftRequest, c: Config) -> list[str]:
    cmd = ["treering", "run", req.scenario]
    for item in (*req.sets, *c.sets):
        cmd += ["--set", item]
    return cmd

