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
bisected between it and the previous one, assuming "meets" is monotone between them (:mod:`simulator.plan` does
the same for decode). At the answer's node count every strategy's best configuration is listed: the answer
first (fewest GPUs, then lowest TTFT), the runner-up second. When no count meets, the configuration with the lowest
TTFT that fits is shown with what bounds it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simulator.algorithms import label, resolve
from simulator.algorithms.prefill import PREFILL_REGISTRY
from simulator.cluster.devices import DTYPE_BYTES
from simulator.errors import InputError
from simulator.plan import ms, tp_candidates
from simulator.points import cluster_for, prepare_point, simulate_point
from simulator.scenario import Point, load_scenario, scenario_points
from simulator.workloads import GenerateWorkload, PrefillWorkload

__all__ = ["LAYOUTS", "Config", "TtftPlan", "TtftRequest", "plan_ttft", "seconds"]

LAYOUTS = ("contiguous", "zigzag", "striped")
STRATEGIES = ("ring", "allgather", "ulysses")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class TtftRequest:
    """What ``treering plan SCENARIO --ttft`` is asked (seconds)."""

    scenario: str
    ttft_s: float
    tbt_s: float | None = None
    tp: int | None = None
    max_nodes: int = 64
    sets: Sequence[str] = ()
    force: bool = False


@dataclass(frozen=True)
class Config:
    """One simulated configuration: its prefill (strategy, layout) and, for generate, its best decode schedule."""

    nodes: int
    gpus: int
    tp: int
    strategy: str  # the prefill schedule's label (``ring``, ``ring[overlap=False]``...)
    layout: str
    ttft_s: float
    compute_s: float  # the prefill's kernel time on its critical rank
    peak_mem_bytes: float
    usable_mem_bytes: float
    oom: bool
    decode: str | None = None
    tpot_s: float = math.nan
    sets: tuple[str, ...] = ()  # the --set items that reproduce it with treering run

    @property
    def fits(self) -> bool:
        return not self.oom

    @property
    def exposed_comm_s(self) -> float:
        """The prefill's time beyond its critical rank's kernels: communication its compute did not hide."""
        return self.ttft_s - self.compute_s

    def bound(self) -> str:
        """What the TTFT is made of: ``compute 0.97 s, network 0.05 s exposed: compute-bound``."""
        kind = "compute" if self.compute_s >= self.exposed_comm_s else "network"
        return f"compute {seconds(self.compute_s)}, network {seconds(self.exposed_comm_s)} exposed: {kind}-bound"


@dataclass(frozen=True)
class TtftPlan:
    """The answer: ``rows`` (every strategy's best configuration at the answer's node count, best first),
    whether it ``met`` the targets, what bound it, and how many configurations were simulated."""

    met: bool
    rows: list[Config]
    binding: str
    evaluated: int
    kind: str  # the workload's: prefill or generate
    reproduce: list[str]  # the command that runs the answer (treering run SCENARIO --set ...)
    model: str = ""  # the scenario's model (a preset's name, or custom)
    topology: str = ""


def seconds(x: float) -> str:
    """``1.04 s`` or ``27.3 ms``: three significant digits."""
    return f"{x:.3g} s" if x >= 1 else ms(x)


class _Search:
    """Evaluations of one request, cached by (nodes, tp, strategy, layout)."""

    def __init__(self, req: TtftRequest, base: Point, progress: Progress | None) -> None:
        self.req, self.base, self.progress = req, base, progress
        wl = base.scenario.workload
        assert isinstance(wl, (PrefillWorkload, GenerateWorkload))
        self.wl = wl
        self.kind = "prefill" if isinstance(wl, PrefillWorkload) else "generate"
        self.prefills: dict[tuple[int, int, str, str], Config | InputError] = {}
        self.generates: dict[tuple[int, int], list[Config]] = {}
        self.count = 0

    def strategies(self) -> list[tuple[str, Any]]:
        """(label, YAML entry) of each prefill strategy to try."""
        entries: list[Any]
        if isinstance(self.wl, PrefillWorkload):
            entries = [e for e in self.base.scenario.algorithms if _name(e) != "single"]
        else:
            entries = [*STRATEGIES]
            if self.wl.prefill not in entries and _name(self.wl.prefill) != "single":
                entries.append(self.wl.prefill)
        out = {}
        for i, e in enumerate(entries):
            name, params = resolve(e, field=f"algorithms.{i}", registry=PREFILL_REGISTRY)
            out[label(name, params, PREFILL_REGISTRY)] = e
        return list(out.items())

    def layouts(self) -> list[str]:
        causal = self.wl.causal if isinstance(self.wl, PrefillWorkload) else True
        return list(LAYOUTS) if causal else [self.wl.layout]

    def _point(self, sets: dict[str, Any], kind: str | None = None) -> Point:
        tree = copy.deepcopy(self.base.tree)
        tree["sweep"] = {}
        for dotted, value in sets.items():
            node = tree
            *parents, last = dotted.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        if kind == "prefill" and self.kind == "generate":  # the generate request's prefill phase on its own
            w = tree["workload"]
            tree["workload"] = {"kind": "prefill", "model": w["model"], "scope": w.get("scope", "attention"),
                                "tp": w.get("tp", 1), "batch": w.get("batch", 1), "sequence": w["prompt"],
                                "dtype": w.get("dtype", "bf16"), "causal": True, "layout": w.get("layout", "zigzag")}
            tree["algorithms"] = [w.get("prefill", "ring")]
        return scenario_points(tree, self.base.source, self.base.base_dir, (), self.req.force)[0]

    def _sets(self, nodes: int, tp: int, entry: Any, layout: str) -> dict[str, Any]:
        sets: dict[str, Any] = {"topology_params.nodes": nodes, "workload.layout": layout}
        if self.wl.scope == "model":
            sets["workload.tp"] = tp
        sets["algorithms" if self.kind == "prefill" else "workload.prefill"] = [entry] if self.kind == "prefill" \
            else entry
        return sets

    def prefill(self, nodes: int, tp: int, strategy: str, entry: Any, layout: str) -> Config | InputError:
        key = (nodes, tp, strategy, layout)
        if key not in self.prefills:
            sets = self._sets(nodes, tp, entry, layout)
            try:
                prep = prepare_point(self._point(sets, "prefill"))
            except InputError as err:  # e.g. Ulysses' heads, fewer tokens than ranks: not a configuration
                self.prefills[key] = self._as_generate(err)
                return self.prefills[key]
            self.count += 1
            if self.progress:
                self.progress(f"{nodes} node(s), tp {tp}, {strategy} {layout} ({self.count} simulated)")
            row = simulate_point(prep).rows[0]
            usable = min(prep.capacity(n) for n in prep.cluster.ranks)
            self.prefills[key] = Config(nodes, len(prep.cluster.ranks), tp, strategy, layout, row["latency_s"],
                                        row["compute_s"], row["peak_mem_bytes"], usable, bool(row["oom"]),
                                        sets=_set_items(sets))
        return self.prefills[key]

    def _as_generate(self, err: InputError) -> InputError:
        """An error of a generate request's prefill phase, told in the generate workload's keys."""
        keys = {"workload.sequence": "workload.prompt", "algorithms.0": "workload.prefill"}
        if self.kind != "generate" or err.field not in keys:
            return err
        message = err.message.replace("the sequence", "the prompt").split(" (sweep point")[0]
        return self.base.locate(InputError(message, field=keys[err.field]))

    def generate(self, best: Config) -> list[Config]:
        """A generate request run with ``best``'s prefill: one configuration per decode schedule."""
        key = (best.nodes, best.tp)
        if key not in self.generates:
            entry = dict(self.strategies())[best.strategy]
            sets = self._sets(best.nodes, best.tp, entry, best.layout)
            prep = prepare_point(self._point(sets))
            self.count += 1
            rows = simulate_point(prep).rows
            self.generates[key] = [Config(best.nodes, best.gpus, best.tp, best.strategy, best.layout, r["ttft_s"],
                                          best.compute_s, r["peak_mem_bytes"], best.usable_mem_bytes, bool(r["oom"]),
                                          r["algorithm"], r["tpot_s"], best.sets) for r in rows]
        return self.generates[key]

    def at(self, nodes: int, tps: Sequence[int]) -> list[Config]:
        """Every configuration on ``nodes`` nodes: each (tp, strategy, layout)'s prefill; for generate, each tp's
        fastest fitting prefill with every decode schedule."""
        out: list[Config] = []
        for tp in tps:
            found = [c for s, e in self.strategies() for lay in self.layouts()
                     for c in [self.prefill(nodes, tp, s, e, lay)] if isinstance(c, Config)]
            if self.kind == "prefill":
                out += found
                continue
            fitting = [c for c in found if c.fits]
            if not fitting:
                out += found
                continue
            best = min(fitting, key=lambda c: c.ttft_s)
            decoded = self.generate(best)
            out += decoded + [_with_decode(c, decoded) for c in found if c is not best]
        return out

    def meets(self, c: Config) -> bool:
        return c.fits and c.ttft_s <= self.req.ttft_s and (self.req.tbt_s is None or c.tpot_s <= self.req.tbt_s)


def _name(entry: Any) -> Any:
    return entry.get("name") if isinstance(entry, dict) else entry


def _with_decode(c: Config, decoded: list[Config]) -> Config:
    """A prefill configuration that was not the fastest of its (nodes, tp): its TTFT, with the decode steps' TPOT
    and memory of that (nodes, tp) (the same cluster and KV cache)."""
    fastest = min(decoded, key=lambda d: d.tpot_s)
    return Config(c.nodes, c.gpus, c.tp, c.strategy, c.layout, c.ttft_s, c.compute_s,
                  max(c.peak_mem_bytes, fastest.peak_mem_bytes), c.usable_mem_bytes, c.oom or fastest.oom,
                  fastest.decode, fastest.tpot_s, c.sets)


def _set_items(sets: dict[str, Any]) -> tuple[str, ...]:
    def text(v: Any) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(text(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {text(x)}" for k, x in v.items()) + "}"
        return str(v).lower() if isinstance(v, bool) else str(v)
    return tuple(f"{k}={text(v)}" for k, v in sets.items())


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
    s = _Search(req, base, progress)
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
        usable = min(cluster.specs[n].mem_bytes for n in cluster.ranks) * one.scenario.mem_fraction
        weights = wl.model_preset().params * DTYPE_BYTES[wl.dtype]
        tps = [t for t in tp_candidates(gpn, heads, kv) if weights / t <= usable] or [gpn]  # weights alone: no fit
    else:
        tps = [wl.tp]
    found: dict[int, list[Config]] = {}

    def met_at(n: int) -> bool:
        if n not in found:
            found[n] = s.at(n, tps)
        return any(s.meets(c) for c in found[n])

    probes = [1]
    while probes[-1] < req.max_nodes:
        probes.append(min(req.max_nodes, probes[-1] * 2))
    hit = next((i for i, n in enumerate(probes) if met_at(n)), None)
    if hit is None:
        return _unmet(s, found, req)
    a, b = (probes[hit - 1] + 1, probes[hit]) if hit else (1, 1)
    while a < b:
        mid = (a + b) // 2
        if met_at(mid):
            b = mid
        else:
            a = mid + 1
    rows = _per_strategy(found[b], s)
    smaller = [n for n in found if n < b]
    binding = _binding(s, found[max(smaller)], max(smaller)) if smaller else "none: one node is enough"
    return TtftPlan(True, rows, binding, s.count, s.kind, _reproduce(req, rows[0]), *_names(s))


def _rank(s: _Search) -> Callable[[Config], tuple[bool, int, float, float]]:
    return lambda c: (not s.meets(c), c.gpus, c.ttft_s, c.tpot_s if not math.isnan(c.tpot_s) else 0.0)


def _per_strategy(configs: list[Config], s: _Search) -> list[Config]:
    """The best configuration of each prefill strategy, best first (meets, fewest GPUs, lowest TTFT)."""
    best: dict[str, Config] = {}
    for c in sorted(configs, key=_rank(s)):
        best.setdefault(c.strategy, c)
    return list(best.values())


def _binding(s: _Search, configs: list[Config], nodes: int) -> str:
    """Why ``nodes`` nodes (the largest count below the answer) did not do."""
    fitting = [c for c in configs if c.fits]
    if not fitting:
        return f"memory: {nodes} node(s) do not fit"
    fast = min(fitting, key=lambda c: c.ttft_s)
    if fast.ttft_s > s.req.ttft_s:
        return f"ttft: {nodes} node(s) take at least {seconds(fast.ttft_s)} ({fast.strategy} {fast.layout}, " \
               f"tp {fast.tp}; {fast.bound()})"
    quick = [c for c in fitting if c.ttft_s <= s.req.ttft_s]
    best = min(quick, key=lambda c: c.tpot_s)
    return f"tbt: {nodes} node(s) meet the TTFT but decode at {ms(best.tpot_s)} per token at best ({best.decode})"


def _unmet(s: _Search, found: dict[int, list[Config]], req: TtftRequest) -> TtftPlan:
    every = [c for cs in found.values() for c in cs]
    errors = [e for e in s.prefills.values() if isinstance(e, InputError)]
    if not every and errors:  # no configuration could be built at all: say why
        raise errors[0]
    fitting = [c for c in every if c.fits]
    if not fitting:
        return TtftPlan(False, [], f"memory: nothing fits in {req.max_nodes} node(s) or fewer", s.count, s.kind, [],
                        *_names(s))
    fast = min(fitting, key=lambda c: (c.ttft_s, c.gpus, c.tpot_s if not math.isnan(c.tpot_s) else 0.0))
    rows = _per_strategy([c for c in found[fast.nodes] if c.fits], s)
    rows = [fast, *[c for c in rows if c.strategy != fast.strategy]]
    why = f"cannot go below a TTFT of {seconds(fast.ttft_s)} up to {req.max_nodes} nodes ({fast.bound()})"
    if req.tbt_s is not None:
        low = min((c for c in fitting if not math.isnan(c.tpot_s)), key=lambda c: c.tpot_s, default=None)
        if low is not None:
            why += f"; the lowest TPOT is {ms(low.tpot_s)} ({low.decode} on {low.nodes} node(s))"
    return TtftPlan(False, rows, why, s.count, s.kind, _reproduce(req, fast), *_names(s))


def _names(s: _Search) -> tuple[str, str]:
    model = s.wl.model if isinstance(s.wl.model, str) else "custom"
    return model, s.base.scenario.topology


def _reproduce(req: TtftRequest, c: Config) -> list[str]:
    cmd = ["treering", "run", req.scenario]
    for item in (*req.sets, *c.sets):
        cmd += ["--set", item]
    return cmd

