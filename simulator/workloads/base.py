"""What every workload model shares: strict frozen pydantic models, non-negative quantities with units, the
attention shape of a model given inline, and the strict types of the scenario boundary: counts that refuse
booleans, floats and strings and are bounded (:func:`count`), and plain YAML scalars (:data:`Scalar`)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, TypeAlias

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from simulator.errors import InputError
from simulator.support.limits import MAX_COUNT
from simulator.units import checked_quantity, parse_bandwidth, parse_bytes, parse_flops, parse_time

__all__ = ["MAX_COUNT", "MAX_SMALL_COUNT", "Count", "ModelShape", "Scalar", "SmallCount", "Strict", "scalar",
           "unit_value"]

MAX_SMALL_COUNT = 2**16  # heads, head_dim, tp: far beyond any model, small enough to allocate per item

# strict positive integers: ``true``, ``4.0`` and ``"4"`` are refused, and so are absurd sizes
Count: TypeAlias = Annotated[int, Field(strict=True, ge=1, le=MAX_COUNT)]
SmallCount: TypeAlias = Annotated[int, Field(strict=True, ge=1, le=MAX_SMALL_COUNT)]


def scalar(v: Any) -> Any:
    """A plain YAML value (string, number, true/false, null): never a list or a mapping."""
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    kind = "list" if isinstance(v, list) else "mapping" if isinstance(v, dict) else type(v).__name__
    raise ValueError(f"must be a plain value (a number, a string, true or false), got a {kind}")


Scalar = Annotated[Any, AfterValidator(scalar)]


class Strict(BaseModel):
    """A strict, frozen scenario model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)



_KINDS = {parse_bytes: "bytes", parse_bandwidth: "bandwidth", parse_time: "time", parse_flops: "flops"}


def unit_value(parse: Any, v: Any, positive: bool = False, unit: bool = True) -> float:
    """A non-negative (or ``positive``) quantity parsed by ``parse`` (``parse_bytes``, ... or a kind name such as
    ``"bytes"``) within :data:`simulator.units.LIMITS`, written with its unit (``unit=False``: a key that names its
    unit, ``bytes:``, takes a plain number); errors become pydantic's ValueError (located by the caller)."""
    try:
        return checked_quantity(v, parse if isinstance(parse, str) else _KINDS[parse], positive=positive, unit=unit)
    except InputError as err:
        raise ValueError(err.message) from None


class ModelShape(Strict):
    """Attention shape: ``heads`` query heads of ``head_dim``; ``kv_heads`` (GQA) defaults to ``heads``.

    With ``layers``, ``hidden``, ``intermediate`` and ``vocab`` as well it is a whole model of the Llama
    architecture (GQA attention, gated MLP, untied LM head), usable with ``scope: model``.
    """

    heads: SmallCount
    head_dim: SmallCount
    kv_heads: SmallCount | None = None
    layers: SmallCount | None = None
    hidden: Count | None = None
    intermediate: Count | None = None
    vocab: Count | None = None

    WHOLE_MODEL_KEYS: ClassVar[tuple[str, ...]] = ("layers", "hidden", "intermediate", "vocab")

    def missing_for_model(self) -> list[str]:
        """The whole-model keys this block lacks (empty: usable with ``scope: model``)."""
        return [k for k in self.WHOLE_MODEL_KEYS if getattr(self, k) is None]

    @model_validator(mode="after")
    def _gqa(self) -> ModelShape:
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self
