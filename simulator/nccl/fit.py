"""``treering calibrate --from-nccl-tests``: fit a topology's bandwidths and NCCL's protocol latencies to nccl-tests.

The forward model is the simulator's own: every size of the logs is the collective that ``auto`` picks (NCCL's
choice of algorithm, protocol and channels, :mod:`simulator.collectives.tuner`), run by the engine on the topology.
A handful of physical parameters are fitted, each a factor on the base topology:

* ``intra_bandwidth``: every link inside a server (NVLink to the NVSwitch, the mesh's links, PCIe to the host);
  what a channel gets of it follows from the rings that share it (:mod:`simulator.collectives.fabric`);
* ``inter_bandwidth``: every link that leaves a server (NIC to leaf or rail switch, and the fabric behind it);
* ``PROTO.HW`` for each protocol (LL, LL128, Simple): the per-hop latency over the slowest hardware class the runs
  cross (``net`` when a run spans servers, else the server's ``nvlink`` / ``pci``), ring's and tree's scaled alike
  (NCCL's ratio between them kept). Base latencies and the faster class's hops stay at NCCL's values: with one
  rank count the log cannot tell a base latency from a hop's (both add the same to every size).

The fit is ``scipy.optimize.least_squares`` on log time: first on the tuner's closed forms (continuous: the fastest
candidate's prediction; from NCCL's latencies and from 4x them, the better kept), then on the engine from there
(the fitted topology reproduces the log under the engine, which ``treering validate --nccl-tests`` runs), with
one pass of jumps per parameter (:func:`_polish`) where
``auto``'s choice flips and the engine's time jumps. Each (size, choice, values it depends on) is simulated once.
A parameter the log does not determine (its largest effect on a size's time is under :data:`MIN_SENSITIVITY` per
e-fold at the fit: a bandwidth that never binds, a protocol ``auto`` never picks) is reported as such; it keeps the
value the fit left it at (for a protocol's latency: one at which ``auto`` does not pick it, like the log's NCCL).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from simulator.cluster.nccl_keys import PROTOCOLS, latency_key
from simulator.cluster.size_curve import SizeCurve
from simulator.cluster.topology import Cluster, load_topology
from simulator.collectives import fabric_of
from simulator.collectives.protocols import hop_latency
from simulator.collectives.standalone import collective_schedule
from simulator.collectives.tuner import choose, predict
from simulator.engine.core import simulate
from simulator.errors import InputError
from simulator.nccl.logs import NcclTestsRun, read_nccl_tests
from simulator.nccl.validate import OPERATIONS, nccl_dtype
from simulator.units import DTYPE_BYTES

__all__ = ["MAX_SIZES", "MIN_SENSITIVITY", "MIN_SIZES", "Fit", "Param", "Sample", "apply", "base_topology",
           "fit_logs", "parameters", "predicted", "read_samples", "simulated"]

MIN_SIZES = 6  # sizes a fit needs (five parameters at most)
MAX_SIZES = 256  # sizes a fit takes at most: it simulates each tens of times (31 sizes: minutes)
MIN_SENSITIVITY = 0.02  # d log(time) / d log(parameter) below which a parameter is not determined by the log
_STEP = 1e-3  # finite-difference step of the Jacobian, in log of a parameter
_JUMPS = (0.5, 0.8, 0.95, 1.05, 1.25, 2.0)  # factors of the polishing pass (:func:`_polish`)
_MAX_NFEV = 30  # least-squares iterations at most on the closed forms
_MAX_NFEV_ENGINE = 12  # ... and on the engine (each evaluates every size 1 + parameters times)
_START_SCALE = 4.0  # the closed-form fit's second start: every latency this many times NCCL's
_BOUND = math.log(1e4)  # a factor of at most 10^4 either way from the start
_DEVICE_PRESETS = {"H100": "dgx-h100", "H200": "hgx-h200", "B200": "hgx-b200", "A100": "dgx-a100",
                   "MI300X": "mi300x"}
_RANK_LINE = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:)?#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)"
                        r"\s+device\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$")


@dataclass(frozen=True)
class Sample:
    """One measured size: nccl-tests' out-of-place time of ``operation`` on ``nbytes`` per rank."""

    log: str
    line: int
    operation: str
    ranks: int
    nbytes: int
    dtype: str
    time_s: float


@dataclass(frozen=True)
class Param:
    """A fitted quantity: ``name``, its start (SI: bytes/s or seconds) and ``kind`` (``bandwidth`` or ``time``)."""

    name: str
    kind: str
    start: float


@dataclass(frozen=True)
class Fit:
    """A fit's outcome: the cluster, every parameter's value, which were held, how many engine runs it took."""

    cluster: Cluster
    params: tuple[Param, ...]
    values: dict[str, float]
    held: dict[str, str]  # name -> why it kept its start
    simulations: int  # collectives the engine simulated


def read_samples(logs: Sequence[str]) -> tuple[list[Sample], list[NcclTestsRun]]:
    """Every size of every run of the logs (sizes with no time, or a time of 0, nan or inf, are skipped; a log with
    no size left is refused); one rank count for all."""
    samples: list[Sample] = []
    runs: list[NcclTestsRun] = []
    for log in logs:
        before = len(samples)
        for run in (log_runs := read_nccl_tests(log)):
            if run.collective not in OPERATIONS:
                raise InputError(f"collective {run.collective!r} is not modelled; treering models "
                                 f"{', '.join(OPERATIONS)}", file=run.source, line=run.line)
            if runs and run.ranks != runs[0].ranks:
                raise InputError(f"this run has {run.ranks} ranks, the one at {runs[0].source}:{runs[0].line} "
                                 f"{runs[0].ranks}: fit one cluster size at a time", file=run.source, line=run.line,
                                 field="ranks")
            runs.append(run)
            dtype = nccl_dtype(run)
            samples += [Sample(log, row.line, run.collective, run.ranks, row.nbytes, dtype,
                               row.out_of_place.time_s)
                        for row in run.rows if row.nbytes > 0 and 0 < row.out_of_place.time_s < math.inf]
        if len(samples) == before:
            raise InputError("no size of the log has a measured time (every out-of-place time is 0, nan or inf, or "
                             "every size is 0): nothing to fit", file=log, line=log_runs[0].line,
                             field="--from-nccl-tests")
    if len(samples) > MAX_SIZES:
        raise InputError(f"{len(samples):,} sizes to fit (at most {MAX_SIZES}: the fit simulates each size tens of "
                         "times); fit fewer logs or sizes at a time (nccl-tests -f 4 halves the sizes)",
                         file=samples[MAX_SIZES].log, line=samples[MAX_SIZES].line, field="--from-nccl-tests")
    return samples, runs


def base_topology(logs: Sequence[str], runs: Sequence[NcclTestsRun], topology: str | None, force: bool = False
                  ) -> tuple[Cluster, str]:
    """The cluster the logs ran on, sized to their rank count, and how it was chosen.

    ``topology``: a preset name or file (a parametric one gets ``nodes`` = ranks / GPUs per node); None: the DGX-style
    preset of the GPU model the log's ``# Rank`` lines name, with their host count as nodes."""
    ranks = runs[0].ranks
    if topology is None:
        name, params, how = _inferred(logs, ranks)
        return load_topology(name, params, force=force), how
    cluster = load_topology(topology, force=force)
    per_node = len(cluster.ranks) // max(1, cluster.num_hosts)
    if len(cluster.ranks) != ranks:
        sized = None
        if ranks % per_node == 0:
            try:
                sized = load_topology(topology, {"nodes": ranks // per_node}, force=force)
            except InputError:
                sized = None
        if sized is None or len(sized.ranks) != ranks:
            raise InputError(f"the topology has {len(cluster.ranks)} GPUs and cannot be sized to the run's {ranks} "
                             f"ranks (a parametric preset is sized by its nodes)", file=runs[0].source,
                             line=runs[0].line, field="--topology")
        cluster = sized
    return cluster, f"{topology} ({cluster.num_hosts} node(s) of {per_node} GPUs, given by --topology)"


def _inferred(logs: Sequence[str], ranks: int) -> tuple[str, dict[str, int], str]:
    host_of: dict[int, str] = {}  # rank -> host, from the logs' "#  Rank N Group G Pid P on HOST device ..." lines
    models: set[str] = set()
    for log in logs:
        for line in Path(log).read_text(encoding="utf-8", errors="replace").splitlines():
            if m := _RANK_LINE.match(line.strip()):
                host_of[int(m.group(1))] = m.group(2)
                models.add(m.group(3))
    found = sorted({preset for key, preset in _DEVICE_PRESETS.items() for model in models if key in model.upper()})
    if len(found) != 1 or len(host_of) != ranks:
        said = ", ".join(sorted(models)) or "no GPU model"
        raise InputError(f"cannot infer the cluster from the log (it names {said}); give --topology (a preset such "
                         f"as dgx-h100, or a topology file)", file=logs[0], field="--topology")
    per_host = {host: list(host_of.values()).count(host) for host in set(host_of.values())}
    gpus = max(per_host.values())
    if set(per_host.values()) != {gpus}:
        raise InputError(f"the log's hosts run different numbers of ranks ({sorted(per_host.values())}); give "
                         f"--topology", file=logs[0], field="--topology")
    nodes = len(per_host)
    how = (f"preset {found[0]} with nodes: {nodes}, gpus_per_node: {gpus} (inferred from the log's rank lines: "
           f"{nodes} host(s), {', '.join(sorted(models))})")
    return found[0], {"nodes": nodes, "gpus_per_node": gpus}, how


def _group(cluster: Cluster, u: str, v: str) -> str | None:
    """``intra`` (a link inside a server, NICs' own links excepted), ``inter`` (a link leaving a server) or None."""
    kinds = (cluster.graph.nodes[u].get("kind"), cluster.graph.nodes[v].get("kind"))
    if cluster.host_of(u) != cluster.host_of(v):
        return "inter"
    return None if "nic" in kinds else "intra"


def parameters(cluster: Cluster, multi_node: bool) -> list[Param]:
    """The fitted quantities of ``cluster`` (module docstring), at their starting values."""
    params = []
    for group in ("intra", "inter"):
        bws = [bw for u, v, bw in cluster.graph.edges(data="bandwidth") if _group(cluster, u, v) == group]
        if bws:
            params.append(Param(f"{group}_bandwidth", "bandwidth", max(bws)))
    hw = "net" if multi_node else fabric_of(cluster).intra
    params += [Param(f"{proto}.{hw}", "time", hop_latency("ring", proto, hw, cluster.nccl_latency))
               for proto in PROTOCOLS]
    return params


def apply(base: Cluster, params: Sequence[Param], values: dict[str, float]) -> Cluster:
    """``base`` with every parameter set to ``values`` (links scaled by value / start; latencies written to its
    ``nccl_latency`` table, ring's and tree's alike)."""
    graph = base.graph.copy()
    scale = {p.name.removesuffix("_bandwidth"): values[p.name] / p.start for p in params if p.kind == "bandwidth"}
    for u, v, data in graph.edges(data=True):
        group = _group(base, u, v)
        if group in scale:
            data["bandwidth"] = data["bandwidth"] * scale[group]
            if "by_size" in data:  # the bandwidth at each size too (the weight is nominal / at(n): it would cancel)
                curve = data["by_size"]
                data["by_size"] = SizeCurve(curve.sizes, tuple(b * scale[group] for b in curve.bandwidth))
    table = dict(base.nccl_latency)
    for p in params:
        if p.kind == "time":
            proto, hw = p.name.split(".")
            for algo in ("ring", "tree"):
                table[latency_key(algo, proto, hw)] = hop_latency(algo, proto, hw, base.nccl_latency) * (
                    values[p.name] / p.start)
    return dataclasses.replace(base, graph=graph, nccl_latency=table)


def _elements(s: Sample) -> tuple[int, int]:
    elem = DTYPE_BYTES[s.dtype]
    return max(1, s.nbytes // elem), elem


def predicted(cluster: Cluster, samples: Sequence[Sample]) -> np.ndarray:
    """Seconds per sample by the tuner's closed forms (the choice ``auto`` makes, predicted)."""
    fabric = fabric_of(cluster)
    ranks = list(range(len(cluster.ranks)))
    switch = fabric.nvls and fabric.nodes == 1
    out = []
    for s in samples:
        n, elem = _elements(s)
        choice = choose(s.operation, ranks, n, fabric, elem_bytes=elem, dtype=s.dtype, switch=switch)
        out.append(predict(s.operation, ranks, n, choice, fabric, elem_bytes=elem, dtype=s.dtype))
    return np.array(out)


def simulated(cluster: Cluster, samples: Sequence[Sample]) -> tuple[np.ndarray, list[str]]:
    """Seconds per sample by the engine (what ``treering run`` and ``validate --nccl-tests`` give), and the
    ``algorithm/protocol`` ``auto`` chose."""
    fabric = fabric_of(cluster)
    times, chosen = [], []
    for s in samples:
        n, elem = _elements(s)
        sched, choice = collective_schedule(cluster, fabric, s.operation, n, elem, s.dtype)
        times.append(simulate(sched, cluster).makespan)
        chosen.append(f"{choice.algo}/{choice.protocol}")
    return np.array(times), chosen


def fit_logs(base: Cluster, samples: Sequence[Sample]) -> Fit:
    """Fit :func:`parameters` of ``base`` to ``samples`` (module docstring); refuses too few sizes."""
    if len(samples) < MIN_SIZES:
        s = samples[0] if samples else None
        raise InputError(f"too few sizes to fit: {len(samples)}, the fit needs at least {MIN_SIZES} (run nccl-tests "
                         f"over a range of sizes, e.g. -b 8 -e 8G -f 2)", file=s.log if s else None,
                         line=s.line if s else None, field="--from-nccl-tests")
    params = parameters(base, base.num_hosts > 1)
    measured = np.log([s.time_s for s in samples])
    engine = _Engine(base, params, samples)

    def closed_forms(values: dict[str, float]) -> np.ndarray:
        return np.log(predicted(apply(base, params, values), samples))

    # the tuner's closed forms first (continuous in the parameters: the minimum over the candidates), to start the
    # engine's fit in the right basin (the engine's time jumps where auto's choice changes)
    # from NCCL's latencies and from latencies _START_SCALE times them (where a cap, such as NCCL's LL bandwidth,
    # flattens the sizes that would otherwise pull the latencies up, the descent from NCCL's values can stop in a
    # basin where another protocol explains the log): the better closed-form fit goes on
    fits = [_least_squares(params, {p.name: p.start * (1.0 if p.kind == "bandwidth" else scale) for p in params},
                           measured, closed_forms, _MAX_NFEV) for scale in (1.0, _START_SCALE)]
    values = min(fits, key=lambda v: float(np.sum((closed_forms(v) - measured) ** 2)))
    values = _least_squares(params, values, measured, engine.log_times, _MAX_NFEV_ENGINE)
    polished = _polish(params, values, measured, engine.log_times)
    if polished != values:  # a jump got the fit out of a local minimum: descend again from there
        values = _least_squares(params, polished, measured, engine.log_times, _MAX_NFEV_ENGINE)
    return Fit(apply(base, params, values), tuple(params), values, _held(base, params, values, samples),
               engine.simulations)


class _Engine:
    """The engine's log time per sample for parameter values, each (sample, choice, the values its time depends
    on) simulated once: a protocol's latency moves only the sizes that ``auto`` runs with that protocol."""

    def __init__(self, base: Cluster, params: Sequence[Param], samples: Sequence[Sample]) -> None:
        self.base, self.params, self.samples = base, list(params), list(samples)
        self.cache: dict[tuple[object, ...], float] = {}
        self.simulations = 0

    def log_times(self, values: dict[str, float]) -> np.ndarray:
        cluster = apply(self.base, self.params, values)
        fabric = fabric_of(cluster)
        ranks = list(range(len(cluster.ranks)))
        switch = fabric.nvls and fabric.nodes == 1
        out = []
        for i, s in enumerate(self.samples):
            n, elem = _elements(s)
            choice = choose(s.operation, ranks, n, fabric, elem_bytes=elem, dtype=s.dtype, switch=switch)
            key = (i, choice, *(values[p.name] for p in self.params
                                if p.kind == "bandwidth" or p.name.startswith(f"{choice.protocol}.")))
            if key not in self.cache:
                sched, _ = collective_schedule(cluster, fabric, s.operation, n, elem, s.dtype, choice.algo,
                                               choice.protocol, choice.channels)
                self.cache[key] = math.log(simulate(sched, cluster).makespan)
                self.simulations += 1
            out.append(self.cache[key])
        return np.array(out)


Model = Callable[[dict[str, float]], np.ndarray]


def _least_squares(params: Sequence[Param], values: dict[str, float], measured: np.ndarray, model: Model,
                   max_nfev: int) -> dict[str, float]:
    def with_x(x: np.ndarray) -> dict[str, float]:
        return {**values, **{p.name: p.start * math.exp(xi) for p, xi in zip(params, x, strict=True)}}

    def residuals(x: np.ndarray) -> np.ndarray:
        return model(with_x(x)) - measured

    x0 = np.clip([math.log(values[p.name] / p.start) for p in params], -_BOUND + 1e-6, _BOUND - 1e-6)
    result = least_squares(residuals, x0, bounds=(-_BOUND, _BOUND), diff_step=_STEP, x_scale=1.0, xtol=1e-8,
                           ftol=1e-10, gtol=1e-10, max_nfev=max_nfev)
    return with_x(result.x)


def _polish(params: Sequence[Param], values: dict[str, float], measured: np.ndarray, model: Model
            ) -> dict[str, float]:
    """One pass of jumps of each parameter by the factors :data:`_JUMPS`, each kept if it lowers the squared error:
    where ``auto``'s choice changes, the engine's time jumps, and a descent can stop at a local minimum."""
    def cost(v: dict[str, float]) -> float:
        return float(np.sum((model(v) - measured) ** 2))

    best = cost(values)
    for p in params:
        for factor in _JUMPS:
            trial = {**values, p.name: values[p.name] * factor}
            c = cost(trial)
            if c < best:
                best, values = c, trial
    return values


def _held(base: Cluster, params: Sequence[Param], values: dict[str, float], samples: Sequence[Sample]
          ) -> dict[str, str]:
    """The parameters whose largest effect on a sample's log time, either way, is below :data:`MIN_SENSITIVITY`:
    the log does not determine them (they keep the value the fit left them at, which any larger one would match)."""
    at = np.log(predicted(apply(base, params, values), samples))
    held = {}
    step = 0.05
    for p in params:
        effect = 0.0
        for sign in (1.0, -1.0):
            moved = dict(values)
            moved[p.name] = values[p.name] * math.exp(sign * step)
            effect = max(effect, float(np.max(np.abs(np.log(predicted(apply(base, params, moved), samples)) - at))))
        if effect / step < MIN_SENSITIVITY:
            why = ("another link binds" if p.kind == "bandwidth"
                   else f"auto picks {p.name.split('.')[0]} for no size, or its hops are hidden")
            held[p.name] = f"not determined by the log, no size depends on it ({why})"
    return held
