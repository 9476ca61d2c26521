"""A sweep point prepared once: what every workload kind's module receives and returns, and what a kind is.

A :class:`Kind` (one per workload kind, in :data:`simulator.run.kinds.KINDS`) says how to prepare a point
(every point-level check, located at file:line), how to simulate it into rows (on its :attr:`Kind.columns`) and how
to give its simulated schedules (timelines, traces). :func:`simulator.run.prepare.prepare_point` calls ``prepare``
once per point; the sweep, ``trace``, ``plan`` and ``validate`` then work from the :class:`PreparedPoint`. A
prepared point sent to a worker process travels without its cluster, which the worker takes from its own cache of
clusters (:func:`cluster_for`: inherited from the parent where workers are forked, else loaded once per topology):
nothing is checked again there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.algorithms import Layout
from simulator.cluster import Cluster, load_topology
from simulator.cluster.faults import apply_faults
from simulator.cluster.topology import override_devices
from simulator.collectives.fabric import fabric_of
from simulator.engine import SimResult
from simulator.errors import InputError
from simulator.run.rows import Column
from simulator.run.scenario import Point
from simulator.schedule.core import Schedule
from simulator.schedule.memory import usable_bytes
from simulator.support.yaml_lines import load_yaml

__all__ = ["Algorithm", "Kind", "PointOutcome", "PreparedPoint", "Run", "cluster_for", "faults_applied", "layout_of",
           "topology_params"]

Run = tuple[str, Schedule, SimResult]  # (label, schedule, its simulation)

_CLUSTERS: dict[tuple[str, str, str, str, str], Cluster] = {}
_FAULTS: dict[tuple[str, str, str, str, str], str] = {}  # the same key -> what its faults did (faults_applied)


def topology_params(point: Point) -> dict[str, Any]:
    """The parameters the point's topology is built with: the scenario's ``topology_params``, except where
    ``--set topology=FILE`` names an explicit topology (no ``builder:``) and no ``--set`` or sweep gives
    parameters: the scenario file's parameters were its preset's, and an explicit topology takes none."""
    sc = point.scenario
    params = dict(sc.topology_params)
    given = [k for k, (file, _) in (point.origins or {}).items() if file == "--set"] + [k for k, _ in point.swept]
    if params and "topology" in given and not any(k.split(".")[0] == "topology_params" for k in given) \
            and _explicit(sc.topology, point.base_dir):
        return {}
    return params


def _explicit(ref: str, base_dir: Path) -> bool:
    """``ref`` is a topology file without ``builder:`` (a file that cannot be read is load_topology's to report)."""
    if not (ref.endswith((".yaml", ".yml")) or "/" in ref):
        return False  # a preset's name: presets are parametric
    path = Path(ref) if Path(ref).is_absolute() or Path(ref).exists() else base_dir / ref
    try:
        raw = load_yaml(path)
    except InputError:
        return False
    return isinstance(raw, Mapping) and "builder" not in raw


def _cluster_key(point: Point) -> tuple[str, str, str, str, str]:
    sc = point.scenario
    devices = {name: o.model_dump(exclude_none=True) for name, o in sc.devices.items()}
    faults = [f.model_dump(exclude_none=True) for f in sc.faults or ()]
    return (sc.topology, json.dumps(topology_params(point), sort_keys=True), str(point.base_dir),
            json.dumps(devices, sort_keys=True), json.dumps(faults))  # plain scalars: never repr() an unbounded value


def cluster_for(point: Point) -> Cluster:
    """The point's cluster (cached per topology, parameters and faults: :mod:`simulator.cluster.faults`); errors
    located in the scenario file."""
    key = _cluster_key(point)
    if key not in _CLUSTERS:
        sc = point.scenario
        devices = {name: o.model_dump(exclude_none=True) for name, o in sc.devices.items()}
        try:
            cluster = override_devices(load_topology(sc.topology, topology_params(point), point.base_dir,
                                                     point.force), devices)
            _CLUSTERS[key], _FAULTS[key] = apply_faults(cluster, [f.fault() for f in sc.faults or ()])
        except InputError as err:
            raise point.locate(err) from None
    return _CLUSTERS[key]


def faults_applied(point: Point) -> str:
    """What the point's ``faults:`` did to its cluster, in words (``none`` for none: the rows' ``faults_applied``)."""
    cluster_for(point)
    return _FAULTS[_cluster_key(point)]


def layout_of(cluster: Cluster, ranks: int | None = None) -> Layout:
    """Ranks on the cluster's first ``ranks`` GPUs, with their server indices and the fabric their collectives run
    on as NCCL runs them; ranks that share host CPU cores (``host_cores``: processes talking over loopback, as gloo
    does in validation) run collectives as plain decompositions, without NCCL's channels and protocols.

    One layout per cluster and ``ranks``, kept on the cluster: every point of a sweep on that cluster shares it, and
    with it what its fabric works out once (channels' trees, the tuner's choices: ``Fabric.memo``)."""
    memo = cluster.owned("layouts")
    key = ranks or len(cluster.ranks)
    hit: Layout | None = memo.get(key)
    if hit is None:
        fabric = None if cluster.host_cores else fabric_of(cluster)
        hit = memo[key] = Layout(cluster.host_indices(cluster.ranks[:key]), fabric)
    return hit


@dataclass(frozen=True)
class Algorithm:
    """One schedule of a point: its registry name, validated parameters and result label."""

    name: str
    params: dict[str, Any]
    label: str


@dataclass(frozen=True)
class PreparedPoint:
    """A checked sweep point: its cluster and layout, the algorithms to run, the workload's shape, and what else its
    kind prepared (``extra``: e.g. a flows workload's schedule, a generate workload's prefill schedule)."""

    point: Point
    cluster: Cluster
    kind: str
    numeric: bool = False
    algorithms: tuple[Algorithm, ...] = ()
    shape: Any = None  # DecodeShape, PrefillShape (generate: its prompt's) or None
    layout: Layout | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def workload(self) -> Any:
        return self.point.scenario.workload

    def capacity(self, node: str) -> float:
        """Bytes a device may use before the point is out of memory: its memory x the scenario's mem_fraction."""
        return usable_bytes(self.cluster.specs[node].mem_bytes, self.point.scenario.mem_fraction)

    def __reduce__(self) -> tuple[Callable[..., PreparedPoint], tuple[Any, ...]]:
        """Pickled without the cluster: the receiving process takes it from its cache (:func:`cluster_for`); the
        cluster's own layout (:func:`layout_of`, whose fabric refers to the cluster) travels as a mark, and is taken
        from the receiving process's cluster."""
        layout: Layout | _ClusterLayout | None = self.layout
        ranks = self.layout.ranks if self.layout is not None else 0
        if self.layout is not None and self.cluster.owned("layouts").get(ranks) is self.layout:
            layout = _ClusterLayout(ranks)
        return _restore, (self.point, self.kind, self.numeric, self.algorithms, self.shape, layout,
                          dict(self.extra))


@dataclass(frozen=True)
class _ClusterLayout:
    """A pickled point's layout where it is its cluster's own (:func:`layout_of` of ``ranks`` GPUs)."""

    ranks: int


def _restore(point: Point, kind: str, numeric: bool, algorithms: tuple[Algorithm, ...], shape: Any,
             layout: Layout | _ClusterLayout | None, extra: dict[str, Any]) -> PreparedPoint:
    cluster = cluster_for(point)
    if isinstance(layout, _ClusterLayout):
        layout = layout_of(cluster, layout.ranks)
    return PreparedPoint(point, cluster, kind, numeric, algorithms, shape, layout, extra)


@dataclass(frozen=True)
class PointOutcome:
    """The rows of one point and, when asked for, the simulated schedules they came from (for its timeline)."""

    rows: list[dict[str, Any]]
    runs: list[Run] | None = None


@dataclass(frozen=True)
class Kind:
    """One workload kind: its row schema and how its points are prepared, simulated and traced.

    * ``prepare(point, cluster, numeric)``: every check of the point (errors located), once;
    * ``simulate(prep, keep_runs)``: its rows (values for :func:`simulator.run.rows.make_row`, on ``columns``) and,
      with ``keep_runs``, the simulated schedules the rows came from (or ones like them: ``scope: model`` gives one
      layer's attention);
    * ``runs(prep, record_links)``: every schedule of the point simulated (traces record link utilisation);
    * ``numeric``: None where ``--numeric`` applies, else why it does not.
    """

    name: str
    columns: tuple[Column, ...]
    prepare: Callable[[Point, Cluster, bool], PreparedPoint]
    simulate: Callable[[PreparedPoint, bool], tuple[list[dict[str, Any]], list[Run] | None]]
    runs: Callable[[PreparedPoint, bool], list[Run]]
    numeric: str | None = None
