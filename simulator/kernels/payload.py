"""What every transfer of a schedule carries, as tensor shapes: so that a real receiver can post a receive of the
right size and rebuild the values (a partial state, a KV shard, a flat slice) from one flat message.

A symbolic pass over the schedule in id order tracks, for every (rank, buffer), a descriptor:

* ``("q",)`` the query, ``("out",)`` an output: (b, heads, 1, head_dim);
* ``("kv", lo, hi)`` a KV shard of context positions [lo, hi): k and v, (b, kv_heads, hi - lo, head_dim);
* ``("state",)`` a partial state: o (b, heads, 1, head_dim), l and m (b, heads, 1);
* ``("flat", n)`` a flat vector of n elements;
* prefill schedules (a :class:`~simulator.workloads.prefill_shape.PrefillShape`): row blocks ``("rows", ...)`` and
  running states ``("state-rows", ...)`` that carry their own sizes and positions
  (:mod:`simulator.kernels.prefill`).

Pure: no torch, no simpy.
"""

from __future__ import annotations

import math

from simulator.kernels.decode import Descriptor
from simulator.kernels.prefill import initial_descriptors, rows_shapes
from simulator.kernels.table import kernel
from simulator.schedule.core import Schedule
from simulator.workloads.prefill_shape import PrefillShape
from simulator.workloads.shape import DecodeShape

Shape = DecodeShape | PrefillShape

__all__ = ["Descriptor", "component_shapes", "message_elements", "transfer_layouts"]

def component_shapes(desc: Descriptor, shape: Shape) -> list[tuple[int, ...]]:
    """The arrays a descriptor stands for, in the order they are packed into a message."""
    kind = desc[0]
    if kind in ("rows", "state-rows"):
        return rows_shapes(desc)
    if kind == "flat":
        return [(desc[1],)]
    assert isinstance(shape, DecodeShape), f"a {kind!r} buffer needs a decode shape"
    b, h, kv, d = shape.batch, shape.heads, shape.kv_heads, shape.head_dim
    if kind in ("q", "out"):
        return [(b, h, 1, d)]
    if kind == "kv":
        t = desc[2] - desc[1]
        return [(b, kv, t, d), (b, kv, t, d)]
    if kind == "state":
        return [(b, h, 1, d), (b, h, 1), (b, h, 1)]
    raise ValueError(f"unknown buffer descriptor {desc!r}")


def _initial(sched: Schedule, shape: Shape) -> list[dict[str, Descriptor | None]]:
    if isinstance(shape, PrefillShape):
        return [dict(d) for d in initial_descriptors(sched, shape)]
    held: list[dict[str, Descriptor | None]] = [{} for _ in range(sched.ranks)]
    for rank, names in sched.initial.items():
        for name in names:
            if name == "q":
                held[rank][name] = ("q",)
            elif name.startswith("kv"):
                lo, hi = sched.meta["shards"][rank]
                held[rank][name] = ("kv", lo, hi)
    return held


def transfer_layouts(sched: Schedule, shape: Shape) -> dict[int, list[Descriptor]]:
    """Descriptor of every buffer each send carries, by send op id (a flat slice ``lo:hi`` is ``("flat", n)``)."""
    held = _initial(sched, shape)
    layouts: dict[int, list[Descriptor]] = {}
    for op in sched.ops:
        mine = held[op.rank]
        if op.kind == "send":
            descs = []
            for name in op.args:
                desc = mine.get(name)
                if desc is None:
                    raise ValueError(f"op #{op.id} on rank {op.rank} sends {name!r}, which it does not hold")
                descs.append(("flat", op.hi - op.lo) if op.hi >= 0 else desc)
            layouts[op.id] = descs
        elif op.kind == "recv":
            assert op.match is not None
            if not op.into:
                for name, desc in zip(op.args, layouts[op.match], strict=True):
                    mine[name] = desc
        elif op.kind != "launch" and op.fn:
            mine.update(kernel(op.fn).writes(op, mine, shape))
    return layouts


def message_elements(descs: list[Descriptor], shape: Shape) -> int:
    """Elements in the flat message that carries ``descs``."""
    return sum(math.prod(s) for desc in descs for s in component_shapes(desc, shape))
