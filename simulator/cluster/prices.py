"""What a GPU-hour costs: the price table (``topologies/prices.yaml``) and the cost arithmetic (docs/whatifs.md).

An offer is rented (``usd_per_gpu_hour``) or owned (``owned: {usd_per_gpu, years, tdp_watts, pue, usd_per_kwh}``:
the purchase written off evenly over its years, plus the GPU's power at its TDP, the whole hour, times the
facility's PUE, at the electricity price). Every offer of the shipped table cites its source and date.

From a price per GPU-hour and a simulated time (pure functions, seconds and dollars):

* ``usd_per_hour = gpus x usd_per_gpu_hour``;
* a step that yields ``tokens`` tokens in ``seconds`` costs ``usd_per_hour x seconds / 3600`` for them:
  ``usd_per_m_tokens = usd_per_hour x seconds / 3600 / tokens x 1e6`` (a decode step: one token per sequence of the
  batch; a generate request: the time per output token, TPOT, per sequence; a prefill: the prompt's tokens).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simulator.cluster.presets import PRICE_TABLE
from simulator.errors import InputError, excerpt
from simulator.support.paths import TOPOLOGY_DIR
from simulator.support.yaml_lines import line_of, load_yaml

__all__ = ["HOURS_PER_YEAR", "MAX_USD_PER_GPU_HOUR", "Offer", "Owned", "load_offers", "owned", "rented",
           "usd_per_m_tokens"]

HOURS_PER_YEAR = 8760.0


@dataclass(frozen=True)
class Owned:
    """A GPU bought and run: its price, years written off, TDP (W), the facility's PUE, electricity ($/kWh)."""

    usd_per_gpu: float
    years: float
    tdp_watts: float
    pue: float
    usd_per_kwh: float

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_gpu / (self.years * HOURS_PER_YEAR) + self.tdp_watts / 1000 * self.pue * self.usd_per_kwh


@dataclass(frozen=True)
class Offer:
    """A named price: the device it is for (a spec name of topologies/devices.yaml, or empty: any) and $/GPU-hour."""

    name: str
    device: str
    usd_per_gpu_hour: float
    source: str = ""
    date: str = ""
    owned: bool = False  # bought and run (its price per hour is a write-off and power), not rented


_OWNED_KEYS = {"usd_per_gpu": (0.0, 1e7), "years": (0.0, 50.0), "tdp_watts": (0.0, 1e5), "pue": (1.0, 5.0),
               "usd_per_kwh": (0.0, 10.0)}
_OFFER_KEYS = {"device", "usd_per_gpu_hour", "owned", "source", "date"}
MAX_USD_PER_GPU_HOUR = 1000.0


def owned(raw: Any, where: str = "owned") -> Owned:
    """An :class:`Owned` from ``{usd_per_gpu, years, tdp_watts, pue, usd_per_kwh}`` (an :class:`InputError` at
    ``where.KEY`` for a missing, unknown or out-of-range value)."""
    if not isinstance(raw, Mapping):
        raise InputError(f"must be a mapping {{{', '.join(_OWNED_KEYS)}}}", field=where)
    for key in raw:
        if key not in _OWNED_KEYS:
            raise InputError(f"unknown key; valid keys: {', '.join(_OWNED_KEYS)}", field=f"{where}.{key}")
    values = {}
    for key, (low, high) in _OWNED_KEYS.items():
        v = raw.get(key)
        positive = key != "pue"
        ok = (not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
              and (low < v if positive else low <= v) and v <= high)
        if not ok or not isinstance(v, (int, float)):
            bound = f"in ({low:g}, {high:g}]" if positive else f"in [{low:g}, {high:g}]"
            raise InputError(f"must be a number {bound}, got {excerpt(v)}", field=f"{where}.{key}")
        values[key] = float(v)
    return Owned(**values)


def load_offers(path: str | None = None) -> dict[str, Offer]:
    """The offers of the price table (default: the shipped ``topologies/prices.yaml``), by name; an error is
    located in that file. A table is parsed once per version of its file (every point of a sweep asks)."""
    src = str(path or TOPOLOGY_DIR / PRICE_TABLE)
    try:
        stat = os.stat(src)
    except OSError:
        return _parsed(src, None)  # load_yaml says what is wrong with the path
    return dict(_parsed(src, (stat.st_mtime_ns, stat.st_size)))


@functools.lru_cache(maxsize=8)
def _parsed(src: str, version: tuple[int, int] | None) -> dict[str, Offer]:
    """:func:`load_offers` of ``src`` as it is at ``version`` (its modification time and size)."""
    raw = load_yaml(src)
    offers = raw.get("offers") if isinstance(raw, Mapping) else None
    if not isinstance(offers, Mapping) or not offers:
        raise InputError("a price table maps offers: {NAME: {device, usd_per_gpu_hour | owned, source, date}}",
                         file=src, line=1)
    out = {}
    for name, spec in offers.items():
        try:
            out[str(name)] = _offer(str(name), spec)
        except InputError as err:
            parts = tuple(int(p) if p.isdigit() else p for p in (err.field or "").split(".") if p)
            raise err.located(file=src, line=line_of(raw, ("offers", name, *parts))) from None
    return out


def _offer(name: str, spec: Any) -> Offer:
    if not isinstance(spec, Mapping):
        raise InputError("must be a mapping {device, usd_per_gpu_hour | owned, source, date}")
    for key in spec:
        if key not in _OFFER_KEYS:
            raise InputError(f"unknown key; valid keys: {', '.join(sorted(_OFFER_KEYS))}", field=str(key))
    if ("usd_per_gpu_hour" in spec) == ("owned" in spec):
        raise InputError("give one of usd_per_gpu_hour, owned")
    if not spec.get("source") or not spec.get("date"):
        raise InputError("every offer cites its source and date")
    price = (owned(spec["owned"]).usd_per_gpu_hour if "owned" in spec
             else rented(spec["usd_per_gpu_hour"], "usd_per_gpu_hour"))
    return Offer(name, str(spec.get("device", "")), price, str(spec["source"]), str(spec["date"]), "owned" in spec)


def rented(v: Any, field: str) -> float:
    """A price per GPU-hour in (0, :data:`MAX_USD_PER_GPU_HOUR`] dollars."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= MAX_USD_PER_GPU_HOUR:
        raise InputError(f"must be a number of dollars in (0, {MAX_USD_PER_GPU_HOUR:g}], got {excerpt(v)}",
                         field=field)
    return float(v)


def usd_per_m_tokens(usd_per_hour: float, seconds: float, tokens: float) -> float:
    """Dollars per million tokens when ``tokens`` tokens take ``seconds`` on hardware costing ``usd_per_hour``."""
    return usd_per_hour * seconds / 3600.0 / tokens * 1e6
