"""The configurations ``treering plan SCENARIO --ttft`` simulates (:mod:`simulator.plan.ttft`): the request, one
simulated configuration, and the search state that builds, simulates and caches them by (nodes, tp, strategy,
layout)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simulator.algorithms import label, resolve
from simulator.algorithms.prefill import PREFILL_REGISTRY
from simulator.errors import InputError
from simulator.models.precision import weight_bytes, weight_precision
from simulator.models.step import dense_on_one_server, group_kv_bytes
from simulator.plan.decode import ms
from simulator.plan.verdict import Targets, Values, met
from simulator.run.prepare import prepare_point, simulate_point
from simulator.run.prepared import PointOutcome, PreparedPoint, cluster_for
from simulator.run.scenario import Point, scenario_points
from simulator.schedule.memory import usable_bytes
from simulator.workloads.generate import GenerateWorkload
from simulator.workloads.prefill import PrefillWorkload

__all__ = ["LAYOUTS", "STRATEGIES", "Config", "Progress", "Search", "TtftRequest", "seconds"]

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

    @property
    def targets(self) -> Targets:
        return Targets(ttft_s=self.ttft_s, tbt_s=self.tbt_s)


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
    def values(self) -> Values:
        """What the verdicts of :mod:`simulator.plan.verdict` judge."""
        return Values(oom=self.oom, ttft_s=self.ttft_s, tbt_s=self.tpot_s)

    def meets(self, targets: Targets) -> bool:
        return met(targets, oom=self.oom, ttft_s=self.ttft_s, tbt_s=self.tpot_s)

    @property
    def exposed_comm_s(self) -> float:
        """The prefill's time beyond its critical rank's kernels: communication its compute did not hide."""
        return self.ttft_s - self.compute_s

    def bound(self) -> str:
        """What the TTFT is made of: ``compute 0.97 s, network 0.05 s exposed: compute-bound``."""
        kind = "compute" if self.compute_s >= self.exposed_comm_s else "network"
        return f"compute {seconds(self.compute_s)}, network {seconds(self.exposed_comm_s)} exposed: {kind}-bound"


def seconds(x: float) -> str:
    """``1.04 s`` or ``27.3 ms``: three significant digits."""
    return f"{x:.3g} s" if x >= 1 else ms(x)


class Search:
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
        self.memo: dict[Any, Any] = {}  # dense layers built and simulated once (_simulated)
        self.met_tp: int | None = None  # the tp of the last count meets_at found to meet (tried first)

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
            row = _simulated(prep, self.memo).rows[0]
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
            rows = _simulated(prep, self.memo).rows
            self.generates[key] = [Config(best.nodes, best.gpus, best.tp, best.strategy, best.layout, r["ttft_s"],
                                          best.compute_s, r["peak_mem_bytes"], best.usable_mem_bytes, bool(r["oom"]),
                                          r["algorithm"], r["tpot_s"], best.sets) for r in rows]
        return self.generates[key]

    def at(self, nodes: int, tps: Sequence[int]) -> list[Config]:
        """Every configuration on ``nodes`` nodes: each (tp, strategy, layout)'s prefill; for generate, each tp's
        fastest fitting prefill with every decode schedule."""
        return [c for tp in tps for c in self._at_tp(nodes, tp)]

    def _at_tp(self, nodes: int, tp: int) -> list[Config]:
        """:meth:`at`'s configurations of one tp."""
        found = [c for s, e in self.strategies() for lay in self.layouts()
                 for c in [self.prefill(nodes, tp, s, e, lay)] if isinstance(c, Config)]
        if self.kind == "prefill":
            return found
        fitting = [c for c in found if c.fits]
        if not fitting:
            return found
        best = min(fitting, key=lambda c: c.ttft_s)
        decoded = self.generate(best)
        return decoded + [_with_decode(c, decoded) for c in found if c is not best]

    def meets_at(self, nodes: int, tps: Sequence[int]) -> bool:
        """Whether a configuration on ``nodes`` nodes meets the targets (``any`` of :meth:`at`'s), simulating tp
        after tp until one does (the last to meet first), and none of a tp whose every prefill is out of memory
        (:meth:`cannot_fit`)."""
        first = [tp for tp in tps if tp == self.met_tp]  # the tp that met last: likely to meet on a near count
        for tp in first + [tp for tp in tps if tp != self.met_tp]:
            if not self.cannot_fit(nodes, tp) and any(map(self.meets, self._at_tp(nodes, tp))):
                self.met_tp = tp
                return True
        return False

    def cannot_fit(self, nodes: int, tp: int) -> bool:
        """Every prefill of ``tp`` on ``nodes`` nodes is out of memory, by a lower bound of
        :func:`simulator.models.step.prefill_model`'s peak (``scope: model``): every GPU holds its 1/tp of the
        weights and, for every layer, the KV cache of its context-parallel group's tokens (a cached prefix's share
        too), over the most memory any of its GPUs may use, on every layout."""
        if self.wl.scope != "model" or not self.strategies():
            return False
        entry = self.strategies()[0][1]
        for layout in self.layouts():
            try:
                point = self._point(self._sets(nodes, tp, entry, layout), "prefill")
            except InputError:  # not a configuration: prefill() says why
                return False
            wl = point.scenario.workload
            cluster = cluster_for(point)
            if not isinstance(wl, PrefillWorkload) or len(cluster.ranks) % tp:
                return False
            cp = len(cluster.ranks) // tp
            shape = wl.shape()
            least = min(group_kv_bytes(shape, tp, cp))
            usable = max(usable_bytes(cluster.specs[n].mem_bytes, point.scenario.mem_fraction)
                         for n in cluster.ranks)
            weights = weight_bytes(wl.model_preset(), weight_precision(wl.weights(), shape.dtype), tp)
            if weights + wl.model_preset().layers * least <= usable:
                return False
        return True

    def meets(self, c: Config) -> bool:
        return c.meets(self.req.targets)


def _simulated(prep: PreparedPoint, memo: dict[Any, Any]) -> PointOutcome:
    """The point simulated for its latencies, compute and memory: a dense layer on alike servers built on one, and
    once per cluster and arguments while ``memo`` lives (:func:`simulator.models.step.dense_on_one_server`: the
    same floats; bytes and events are not read here)."""
    if prep.point.scenario.variability is not None:  # varied durations: no two servers alike
        return simulate_point(prep)
    with dense_on_one_server(memo):
        return simulate_point(prep)


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
