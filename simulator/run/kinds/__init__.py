"""One module per workload kind (its checks, simulation, rows and row schema), and the table of them.

A new workload kind is one module here that defines ``KIND`` (a :class:`simulator.run.prepared.Kind`), its workload
model in :mod:`simulator.workloads`, and one entry below; the CLI, the sweep, ``trace``, reports' columns and
``treering schema --columns`` read this table.
"""

from __future__ import annotations

from simulator.errors import InputError
from simulator.run.kinds import collective, decode, flows, generate, prefill, train
from simulator.run.prepared import Kind

__all__ = ["KINDS", "kind_of"]

KINDS: dict[str, Kind] = {k.name: k for k in (decode.KIND, prefill.KIND, generate.KIND, collective.KIND, flows.KIND,
                                              train.KIND)}


def kind_of(name: str) -> Kind:
    """The kind called ``name``; an unknown name is an error that lists the known ones."""
    try:
        return KINDS[name]
    except KeyError:
        raise InputError(f"unknown workload kind {name!r}; valid: {', '.join(KINDS)}", field="workload.kind") from None
