"""Bandwidth that depends on the message size: what a transport measured over sizes, as the engine reads it.

A link's (or a host's copy) ``bandwidth`` is one figure; a loopback transport is not that simple. Measured on a
2-CPU machine (every rank sending N bytes to the next at once, gloo over TCP): 2 MiB at 2.0 GB/s, 32-64 MiB at
1.5-1.9 GB/s in every round, 256 MiB at 2.2 GB/s; a line through the sizes keeps the slope and drops a ~12 ms
intercept that a 64 MiB message pays and a 128 KiB one does not. A :class:`SizeCurve` holds the bandwidth measured
at a few sizes: a flow of ``n`` bytes loads the resource as if its bandwidth were :meth:`SizeCurve.at` ``(n)``
(linear in log-log between the measured sizes, flat beyond them): the engine gives the flow the weight
``nominal / at(n)`` on it (:class:`simulator.engine.network.FlowNetwork`).

In a topology YAML::

    links:
    - {src: local.tx, dst: local.rx, bandwidth: 2.3 GB/s,
       bandwidth_by_size: {bytes: [262144, 16777216, 268435456], bandwidth: [1.5 GB/s, 1.6 GB/s, 2.2 GB/s]}}
    host_copy_bw_by_size:
      local: {bytes: [...], bandwidth: [...]}

Pure data.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simulator.errors import InputError
from simulator.units import checked_quantity

__all__ = ["SizeCurve", "parse_size_curve"]


@dataclass(frozen=True)
class SizeCurve:
    """Bandwidth (bytes/s) measured at message sizes (bytes), both sorted by size."""

    sizes: tuple[float, ...]
    bandwidth: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.bandwidth):
            raise ValueError("a size curve needs as many bandwidths as sizes, at least one")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)) or self.sizes[0] <= 0:
            raise ValueError("a size curve's sizes must be positive and increasing")
        if any(not (b > 0 and math.isfinite(b)) for b in self.bandwidth):
            raise ValueError("a size curve's bandwidths must be positive and finite")

    def at(self, nbytes: float) -> float:
        """Bandwidth a message of ``nbytes`` sees: log-log interpolation, the end's value beyond the sizes."""
        sizes, bw = self.sizes, self.bandwidth
        if nbytes <= sizes[0]:
            return bw[0]
        if nbytes >= sizes[-1]:
            return bw[-1]
        i = bisect.bisect_right(sizes, nbytes) - 1  # sizes[i] <= nbytes < sizes[i + 1]
        if nbytes == sizes[i]:
            return bw[i]
        return bw[i] * (bw[i + 1] / bw[i]) ** (math.log(nbytes / sizes[i]) / math.log(sizes[i + 1] / sizes[i]))

    def weight(self, nominal: float, nbytes: float) -> float:
        """How many times its bytes a message of ``nbytes`` loads a resource of ``nominal`` bytes/s."""
        return nominal / self.at(nbytes)

    def to_yaml(self) -> dict[str, list[Any]]:
        return {"bytes": [int(s) if float(s).is_integer() else s for s in self.sizes],
                "bandwidth": [f"{b:.6g} B/s" for b in self.bandwidth]}


def parse_size_curve(raw: Any, locate: Callable[[tuple[Any, ...], InputError], InputError],
                     path: Sequence[Any]) -> SizeCurve:
    """``{bytes: [...], bandwidth: [...]}`` (sizes increasing; bandwidths with units or in B/s)."""
    base = tuple(path)
    if not isinstance(raw, Mapping):
        raise locate(base, InputError("must be a mapping {bytes: [sizes], bandwidth: [one per size]}"))
    for key in raw:
        if key not in ("bytes", "bandwidth"):
            raise locate((*base, key), InputError("unknown key; valid keys: bandwidth, bytes"))
    for key in ("bytes", "bandwidth"):
        if key not in raw:
            raise locate(base, InputError(f"missing field {key!r}: a mapping {{bytes: [sizes], bandwidth: [one per "
                                          "size]}"))
    sizes, bws = raw["bytes"], raw["bandwidth"]
    for key, values in (("bytes", sizes), ("bandwidth", bws)):
        if not isinstance(values, list) or not values:
            raise locate((*base, key), InputError("must be a non-empty list"))
    if len(sizes) != len(bws):
        raise locate((*base, "bandwidth"), InputError(f"needs one bandwidth per size: {len(sizes)} sizes, "
                                                      f"{len(bws)} bandwidths"))
    parsed_sizes, parsed_bws = [], []
    for i, (s, b) in enumerate(zip(sizes, bws, strict=True)):
        try:
            parsed_sizes.append(checked_quantity(s, "bytes", positive=True, unit=False))  # the key names the unit
        except InputError as err:
            raise locate((*base, "bytes", i), err) from None
        try:
            parsed_bws.append(checked_quantity(b, "bandwidth", positive=True))
        except InputError as err:
            raise locate((*base, "bandwidth", i), err) from None
        if i and parsed_sizes[i] <= parsed_sizes[i - 1]:
            raise locate((*base, "bytes", i), InputError("sizes must increase"))
    return SizeCurve(tuple(parsed_sizes), tuple(parsed_bws))
