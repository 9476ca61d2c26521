"""The ``collective`` workload: one collective operation, in nccl-tests terms.

``bytes`` is nccl-tests' ``size``: the per-rank buffer (allreduce, broadcast, reduce: the whole buffer; allgather:
the gathered output; reduce-scatter: the input; alltoall: the send buffer). ``algorithms:`` then names collective
algorithms (``auto``, ``ring``, ``tree``, ``nvls``, ...; an entry may fix ``protocol`` and ``channels``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

from simulator.errors import excerpt
from simulator.support.limits import MAX_COUNT
from simulator.units import parse_bytes
from simulator.workloads.base import Strict, unit_value

__all__ = ["OPERATIONS", "CollectiveWorkload"]

# the operations a collective workload may run (simulator.collectives.channels builds each; named here, where the
# scenario's models read them without loading the collectives: `treering schema` answers at once)
OPERATIONS = ("allreduce", "allgather", "reduce-scatter", "alltoall", "broadcast", "reduce")


class CollectiveWorkload(Strict):
    """One collective over every GPU of the topology: ``collective`` of ``bytes`` per rank in ``dtype``."""

    kind: Literal["collective"]
    collective: str
    bytes: float
    dtype: Literal["fp64", "fp32", "bf16", "fp16", "fp8"] = "bf16"

    @field_validator("collective")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in OPERATIONS:
            raise ValueError(f"unknown collective {v!r}; valid: {', '.join(OPERATIONS)}")
        return v

    @field_validator("bytes", mode="before")
    @classmethod
    def _bytes(cls, v: Any) -> float:
        x = unit_value(parse_bytes, v, unit=False)  # the key names the unit
        if x <= 0:
            raise ValueError(f"must be positive, got {v!r}")
        if x > MAX_COUNT:  # a count of bytes (and of elements) that floats and the results' int64 hold exactly
            raise ValueError(f"must be at most 2^53 bytes ({MAX_COUNT / 1e15:.3g} PB), got {excerpt(v)}")
        return x
