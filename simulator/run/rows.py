"""Result rows: a column schema (name, unit, meaning) that every workload kind declares once, and the one function
that builds a row from it.

A kind's schema (:attr:`simulator.run.prepared.Kind.columns`) lists its *stable* columns, every row carries them in
that order, then its *optional* columns (``required=False``: ``max_abs_err`` with ``--numeric``, ``model`` and
``tp`` with ``scope: model``...), present where they apply, in the order the kind gives them; then one column per
swept key. :func:`make_row` refuses a row with a stable column missing or a column its kind does not declare, so a
column cannot exist without its meaning. The sweep adds :data:`SWEEP_COLUMNS`, a
scenario's what-ifs :data:`WHATIF_COLUMNS` (before the swept keys). ``treering schema --columns`` and
docs/reference.md ("Result columns") are printed from the same schemas (:func:`columns_markdown`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SHARED", "STABLE", "SWEEP_COLUMNS", "WHATIF_COLUMNS", "Column", "columns_markdown", "make_row", "names",
           "pick"]


@dataclass(frozen=True)
class Column:
    """One result column: its name, unit (empty for names, counts and flags) and meaning."""

    name: str
    unit: str
    meaning: str
    required: bool = True


def _c(name: str, unit: str, meaning: str, required: bool = True) -> Column:
    return Column(name, unit, meaning, required)


# the columns most kinds share, each said once; a kind picks its own from here (:func:`pick`) and adds the rest
SHARED: dict[str, Column] = {c.name: c for c in (
    _c("scenario", "", "the scenario's name"),
    _c("algorithm", "", "the schedule's result label: its registry name, with its non-default parameters"),
    _c("topology", "", "the topology's name"),
    _c("ranks", "", "GPUs the schedule runs on"),
    _c("nodes", "", "servers those GPUs are on"),
    _c("context", "tokens", "tokens of context (KV cache) the step attends to; prefill: the sequence"),
    _c("batch", "", "sequences processed together"),
    _c("heads", "", "query heads"),
    _c("head_dim", "", "dimension of one head"),
    _c("dtype", "", "the activations' (and KV cache's) dtype"),
    _c("latency_s", "s", "the step's simulated time: from the first op's start to the last op's end"),
    _c("compute_s", "s", "kernel time of the critical rank (the rank that finishes last), each kernel as long as "
                         "it takes alone"),
    _c("comm_s", "s", "the rest of the critical rank's latency: waiting on transfers (and other ranks) that its "
                      "compute did not hide, and what transfers holding SMs added to its kernels"),
    _c("bytes_moved", "bytes", "every byte sent, on the wire (NCCL's LL protocol sends 8-byte lines of 4 data "
                               "bytes)"),
    _c("peak_mem_bytes", "bytes", "the largest per-rank peak of live buffers"),
    _c("oom", "", "some GPU's peak is over its usable memory (device memory x mem_fraction; "
                  "simulator.schedule.memory.out_of_memory)"),
    _c("events", "", "engine events simulated"),
    _c("sim_wall_s", "s", "wall-clock seconds the simulation took (build and run)"),
    _c("max_abs_err", "", "--numeric: largest |difference| of the schedule's output from dense attention",
       required=False),
    _c("model", "", "scope: model: the model preset (custom for a model block)", required=False),
    _c("tp", "", "scope: model: the tensor-parallel degree", required=False),
    _c("scope", "", "attention (one layer's attention) or model (the whole model)", required=False),
)}

STABLE = ("scenario", "algorithm", "topology", "ranks", "nodes", "context", "batch", "heads", "head_dim", "dtype",
          "latency_s", "compute_s", "comm_s", "bytes_moved", "peak_mem_bytes", "oom", "events", "sim_wall_s")

# what a scenario's what-ifs add to any kind's rows, after its own columns (simulator.run.whatif; docs/whatifs.md)
WHATIF_COLUMNS = (
    _c("faults_applied", "", "faults: what the scenario's faults did to the cluster (none: a healthy run)",
       required=False),
    _c("trials", "", "variability: simulations of the schedule with durations drawn anew", required=False),
    _c("p50_s", "s", "variability: median of the latency (decode, prefill: latency_s; collective: time_s) over "
                     "the trials", required=False),
    _c("p90_s", "s", "variability: its 90th percentile (numpy's linear interpolation)", required=False),
    _c("p99_s", "s", "variability: its 99th percentile", required=False),
    _c("max_s", "s", "variability: its largest value over the trials", required=False),
    _c("usd_per_hour", "$/h", "cost: every GPU of the cluster (after its faults) at the price per GPU-hour",
       required=False),
    _c("usd_per_m_tokens", "$", "cost: dollars per million tokens, of a whole model (scope: model): generate per "
                                "output token (from tpot_s and the batch), decode per generated token (batch tokens "
                                "per step), prefill per prompt token; train: per token trained", required=False),
    _c("usd_per_request", "$", "cost: scope: model: generate: one request of the batch (its whole latency); "
                               "prefill: one prompt", required=False),
    _c("usd_per_step", "$", "cost: train: one training step (step_s on every GPU of the cluster)", required=False),
)

SWEEP_COLUMNS = (
    _c("point", "", "the sweep point (0-based index into the sweep's cartesian product)"),
    _c("error", "", "why the point failed (its other columns are then the swept keys only)", required=False),
)


def pick(*wanted: str) -> tuple[Column, ...]:
    """The shared columns called ``wanted``, in that order."""
    return tuple(SHARED[name] for name in wanted)


def names(columns: Sequence[Column]) -> tuple[str, ...]:
    """The stable columns' names, in order."""
    return tuple(c.name for c in columns if c.required)


def make_row(kind: str, columns: Sequence[Column], values: Mapping[str, Any],
             swept: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The row of a ``kind`` point: its stable columns in schema order, then the optional columns ``values`` has (in
    its order), then the swept keys. A stable column missing or a column the schema does not declare is refused."""
    declared = {c.name: c for c in columns}
    missing = [c.name for c in columns if c.required and c.name not in values]
    unknown = [k for k in values if k not in declared]
    if missing or unknown:
        raise ValueError(f"{kind} row: missing columns {missing}, undocumented columns {unknown}")
    row = {c.name: values[c.name] for c in columns if c.required}
    row.update((k, v) for k, v in values.items() if not declared[k].required)
    row.update(swept or {})
    return row


def columns_markdown(schemas: Mapping[str, Sequence[Column]]) -> str:
    """The schemas as Markdown: one table per kind (name, unit, meaning; optional columns marked), then the sweep's."""
    out = []
    for kind, columns in (*schemas.items(), ("what-ifs (faults, variability, cost)", WHATIF_COLUMNS),
                          ("every sweep", SWEEP_COLUMNS)):
        out += [f"### {kind}", "", "| column | unit | meaning |", "|---|---|---|"]
        out += [f"| `{c.name}` | {c.unit or '-'} | {c.meaning}{'' if c.required else ' (optional)'} |"
                for c in columns]
        out.append("")
    return "\n".join(out)
