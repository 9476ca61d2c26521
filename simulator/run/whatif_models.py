"""The scenario's what-if keys as pydantic models: ``faults:``, ``variability:``, ``cost:`` (docs/whatifs.md).

Light (pydantic and the cluster's plain :class:`~simulator.cluster.faults.Fault` only): :mod:`simulator.run.scenario`
validates them with every other key (located errors); :mod:`simulator.run.whatif` applies them to a point.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from simulator.cluster.prices import owned, rented
from simulator.errors import InputError, excerpt
from simulator.workloads.base import Strict

if TYPE_CHECKING:
    from simulator.cluster.faults import Fault

__all__ = ["MAX_BANDWIDTH_FACTOR", "MAX_CV", "MAX_SLOWDOWN", "MIN_BANDWIDTH_FACTOR", "Cost", "FaultEntry",
           "Variability"]

MAX_SLOWDOWN = 100.0  # a device 100 times slower is a failed one: name it down instead
MIN_BANDWIDTH_FACTOR = 1e-3  # below a thousandth of its bandwidth a link is down: say so
MAX_BANDWIDTH_FACTOR = 1.0  # a fault degrades; a faster link is a topology_params what-if
MAX_CV = 2.0  # a coefficient of variation beyond 2 is not run-to-run noise


def _number(v: Any, low: float, high: float, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
        raise ValueError(f"{what} must be a number in [{low:g}, {high:g}], got {excerpt(v)}")
    return float(v)


class FaultEntry(Strict):
    """One fault: ``{device: P, slowdown: s}``, ``{link: A-B, bandwidth_factor: f}``, ``{link: A-B, down: true}`` or
    ``{node: P, down: true}`` (patterns shell-style: :mod:`simulator.cluster.faults`)."""

    device: str | None = Field(None, min_length=1, max_length=200, description="device (GPU) name pattern")
    link: str | None = Field(None, min_length=3, max_length=400, description="link pattern A-B (both directions)")
    node: str | None = Field(None, min_length=1, max_length=200, description="server name pattern (n7: n7.*)")
    slowdown: float | None = Field(None, description=f"a device's kernels take this many times longer, in [1, "
                                                     f"{MAX_SLOWDOWN:g}]")
    bandwidth_factor: float | None = Field(None, description=f"a link carries this fraction of its bandwidth, in "
                                                             f"[{MIN_BANDWIDTH_FACTOR:g}, {MAX_BANDWIDTH_FACTOR:g}]")
    down: bool | None = Field(None, description="the link or server has failed")

    @field_validator("slowdown", mode="before")
    @classmethod
    def _slowdown(cls, v: Any) -> float | None:
        return None if v is None else _number(v, 1.0, MAX_SLOWDOWN, "a slowdown")

    @field_validator("bandwidth_factor", mode="before")
    @classmethod
    def _factor(cls, v: Any) -> float | None:
        return None if v is None else _number(v, MIN_BANDWIDTH_FACTOR, MAX_BANDWIDTH_FACTOR, "a bandwidth factor")

    @model_validator(mode="after")
    def _one_kind(self) -> FaultEntry:
        targets = [k for k in ("device", "link", "node") if getattr(self, k) is not None]
        if len(targets) != 1:
            raise ValueError("a fault names exactly one of device, link, node")
        target = targets[0]
        if target == "device" and (self.slowdown is None or self.bandwidth_factor is not None or self.down):
            raise ValueError("a device fault is {device: NAME, slowdown: s}")
        if target == "link" and ((self.bandwidth_factor is None) == (self.down is not True)
                                 or self.slowdown is not None):
            raise ValueError("a link fault is {link: A-B, bandwidth_factor: f} or {link: A-B, down: true}")
        if target == "node" and (self.down is not True or self.slowdown is not None
                                 or self.bandwidth_factor is not None):
            raise ValueError("a node fault is {node: NAME, down: true}")
        return self

    def fault(self) -> Fault:
        """The cluster's plain :class:`Fault` (imported here: the scenario's models load no graph library)."""
        from simulator.cluster.faults import Fault

        if self.device is not None:
            return Fault("device", self.device, slowdown=float(self.slowdown or 1.0))
        if self.link is not None:
            return Fault("link", self.link, bandwidth_factor=float(self.bandwidth_factor or 1.0),
                         down=bool(self.down))
        return Fault("node", str(self.node), down=True)


class Variability(Strict):
    """Run-to-run variability: each kernel's and transfer's duration drawn per trial from a lognormal of mean 1 and
    these coefficients of variation (:mod:`simulator.engine.trials`)."""

    kernel_cv: float = Field(0.0, description=f"CV of each kernel's duration, in [0, {MAX_CV:g}]")
    link_cv: float = Field(0.0, description=f"CV of each transfer's drain time over its route, in [0, {MAX_CV:g}]")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="the random generator's seed: same seed, same trials")
    trials: int = Field(100, ge=1, description="simulations per algorithm (simulator.support.limits.MAX_TRIALS)")

    @field_validator("kernel_cv", "link_cv", mode="before")
    @classmethod
    def _cv(cls, v: Any) -> float:
        return _number(v, 0.0, MAX_CV, "a coefficient of variation")


class Cost(Strict):
    """What the cluster's GPUs cost: a named offer of the price table (``topologies/prices.yaml``), or your own price
    per GPU-hour, or an owned GPU's figures (:mod:`simulator.cluster.prices`)."""

    offer: str | None = Field(None, min_length=1, max_length=100, description="an offer of topologies/prices.yaml")
    usd_per_gpu_hour: float | None = Field(None, description="your own price: dollars per GPU-hour")
    owned: dict[str, Any] | None = Field(None, description=(
        "an owned GPU: {usd_per_gpu, years, tdp_watts, pue, usd_per_kwh} (purchase written off over years, plus "
        "power at TDP x PUE)"))

    @field_validator("usd_per_gpu_hour", mode="before")
    @classmethod
    def _price(cls, v: Any) -> float | None:
        try:
            return None if v is None else rented(v, "usd_per_gpu_hour")
        except InputError as err:
            raise ValueError(err.message) from None

    @field_validator("owned", mode="before")
    @classmethod
    def _owned(cls, v: Any) -> dict[str, Any] | None:
        if v is None:
            return None
        try:
            owned(v)
        except InputError as err:
            raise ValueError(f"{(err.field or '').removeprefix('owned.')}: {err.message}") from None
        return dict(v)

    @model_validator(mode="after")
    def _one(self) -> Cost:
        if sum(x is not None for x in (self.offer, self.usd_per_gpu_hour, self.owned)) != 1:
            raise ValueError("give one of offer, usd_per_gpu_hour, owned")
        return self
