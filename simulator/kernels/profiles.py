"""Profiled kernel times over shapes: what ``treering calibrate`` measures and the engine interpolates.

A roofline charges a kernel ``max(flops / peak, bytes / bandwidth)`` whatever its shape. Real kernels are not that
simple: the same bytes cost more when the head dimension is small (more rows of softmax per byte), when several
query heads share a KV head (more FLOPs per byte), or when the working set falls out of a cache level. A
:class:`KernelProfile` holds one kernel's measured times in one dtype over a regular grid of its shape parameters
(its *axes*, named by the kernel table: e.g. ``attend`` over ``kv_bytes``, ``head_dim``, ``group``), and predicts a
shape's time by multilinear interpolation of log time over log coordinates (a power law between neighbouring grid
points). Outside the grid it extrapolates linearly in log-log space from the nearest segment and says so: a
prediction names the axes it extrapolated on.

One axis is not smooth: ``group``, the query heads that share a KV head, is the row count (M) of the kernel's two
matrix products, and a BLAS library (or a GPU kernel) runs M in tiles of a fixed height, the rows left over apart.
Measured on a 2-CPU AVX2 machine (``benchmarks/attend_shapes.py``: fp64, 64 MiB of KV, head_dim 96, ms): group 1
18.0, 2 30.6, 3 46.5, 4 24.6, 5 40.0, 7 72.4, 8 29.2, 9 42.5, 11 81.6, 12 45.8: a tile of 4 streams the KV once,
every row left over streams it again, and a power law through groups 1 and 4 put group 2 at 21 ms. So a profile
whose ``group`` grid holds every integer from 1 to some K >= 3 finds the tile height ``m`` from its own times
(:meth:`KernelProfile.tile`: the first group whose time, its log averaged over the profile's largest slice of its
first axis, drops by a tenth or more from the group below; ``2 m - 1 <= K``; ``m`` divides every profiled group
above K, of which there must be one), and an integer group ``g = q m + r`` beyond K that is not itself profiled costs
its full tiles plus what its ``r`` left-over rows cost next to one tile: ``max(T(q m), T(q m) + T(m + r) - T(m))``,
each read off the profile as above. Without a tile (a kernel whose time rises smoothly with the group, as bf16
emulated on that CPU does), within 1..K, on a profiled group or for a fractional one, the grid is interpolated as
usual.

In the topology YAML, under a device spec::

    kernels:
      attend:
        fp32:
          axes: [kv_bytes, head_dim, group]
          grid: [[32768, 262144, 2097152], [32, 128], [1, 4]]
          seconds: [...]   # one median per grid point, row-major (last axis fastest)
          spread: [...]    # optional: each point's interquartile range over its median
          loaded: 2        # optional (default 1): copies of the kernel run at once on the host while timed
          alone:           # optional, with loaded > 1: time alone / time loaded, along the first axis
            kv_bytes: [32768, 2097152, 268435456]
            ratio: [0.97, 0.86, 0.95]

A kernel's axes may end in ones a profile leaves out (``attend``'s ``rows``, the batch x KV heads its bytes split
into, which calibrate profiles where asked: ``--attend-rows``); such a profile reads a shape's leading
values (:meth:`KernelProfile.own`) and its time does not depend on the rest.

A profile timed ``loaded`` is what the kernel costs while the host's other cores run the same kernel (the ranks of a
lockstep schedule); run alone (ring-q's hops, a rank another waits on) it is faster, by how much it contends for the
memory system: measured on a 2-CPU VM, 0.83-0.93 for a 64 MiB fp32 attend, 0.98-1.01 for an emulated-bf16 one whose
arithmetic dominates (wall time of two gloo ranks; the thread's CPU time moves a little less:
``docs/validation.md``). ``alone`` records that ratio at a few values of the first axis (the other axes at a
reference shape, :mod:`.profile_kernels`); a shape's ratio is interpolated in log space along the first axis (flat
beyond the ends) whatever its other axes, and the engine lets the kernel run that much faster while nothing else
contends (:mod:`simulator.engine.host`).

Pure data and numpy: no simpy, no torch.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from simulator.errors import InputError, excerpt

__all__ = ["TILED_AXIS", "KernelProfile", "extrapolated_text", "parse_kernel_profiles", "profile_to_yaml"]

TILED_AXIS = "group"  # the rows of a kernel's matrix products, run in tiles (see the module docstring)
TILE_DROP = 0.9  # a tile: the first row count at which the time falls to this fraction of the one below, or less


@dataclass(frozen=True)
class KernelProfile:
    """Measured seconds of ``kernel`` in ``dtype`` on the grid ``grid`` (one sorted tuple of values per axis)."""

    kernel: str
    dtype: str
    axes: tuple[str, ...]
    grid: tuple[tuple[float, ...], ...]
    seconds: tuple[float, ...]  # row-major over the grid, last axis fastest
    spread: tuple[float, ...] = ()
    loaded: int = 1  # copies of the kernel that ran at once on the host while it was timed (this one included)
    alone_at: tuple[float, ...] = ()  # values of the first axis where the kernel was also timed alone
    alone: tuple[float, ...] = ()  # time alone / time loaded there

    def __post_init__(self) -> None:
        if len(self.axes) != len(self.grid):
            raise ValueError(f"{len(self.axes)} axes but {len(self.grid)} grid value lists")
        for name, values in zip(self.axes, self.grid, strict=True):
            if not values or any(v <= 0 for v in values) or list(values) != sorted(set(values)):
                raise ValueError(f"axis {name}: values must be positive and strictly increasing, got {list(values)}")
        if len(self.seconds) != math.prod(len(v) for v in self.grid):
            raise ValueError(f"{len(self.seconds)} times for a grid of "
                             f"{' x '.join(str(len(v)) for v in self.grid)} points")
        if any(not s > 0 for s in self.seconds):
            raise ValueError("every measured time must be positive")
        if self.spread and len(self.spread) != len(self.seconds):
            raise ValueError(f"{len(self.spread)} spreads for {len(self.seconds)} times")
        if isinstance(self.loaded, bool) or not isinstance(self.loaded, int) or self.loaded < 1:
            raise ValueError(f"loaded must be a positive integer (copies run at once), got {self.loaded!r}")
        if len(self.alone) != len(self.alone_at):
            raise ValueError(f"alone: {len(self.alone_at)} {self.axes[0]} values but {len(self.alone)} ratios")
        if self.alone_at:
            if self.loaded < 2:
                raise ValueError("alone: ratios to a loaded time need loaded >= 2")
            if any(not 0 < v < math.inf for v in self.alone_at) or list(self.alone_at) != sorted(set(self.alone_at)):
                raise ValueError(f"alone: {self.axes[0]} values must be positive, finite and strictly increasing, got "
                                 f"{list(self.alone_at)}")
            if any(not 0 < r < math.inf for r in self.alone):
                raise ValueError(f"alone: every ratio must be positive and finite, got {list(self.alone)}")

    def alone_ratio(self, dims: Sequence[float]) -> float:
        """Time alone / time loaded of a shape ``dims``: the ``alone`` ratios interpolated in log space along the
        first axis (flat beyond the measured values), within [1 / loaded, 1] (no faster than ``loaded`` times, never
        slower alone); 1 without ratios."""
        if not self.alone_at:
            return 1.0
        x = math.log(dims[0])
        xs = [math.log(v) for v in self.alone_at]
        logs = [math.log(r) for r in self.alone]
        if x <= xs[0]:
            log_r = logs[0]
        elif x >= xs[-1]:
            log_r = logs[-1]
        else:  # xs[i] <= x < xs[i + 1]
            i = bisect.bisect_right(xs, x) - 1
            w = (x - xs[i]) / (xs[i + 1] - xs[i])
            log_r = (1 - w) * logs[i] + w * logs[i + 1]
        return min(1.0, max(1.0 / self.loaded, math.exp(log_r)))

    def tile(self) -> tuple[int, int] | None:
        """(tile height m, K) of the tiled axis (see the module docstring), or None: no such axis, its grid does
        not hold every integer 1..K with K >= 3, or no drop of the time marks a tile."""
        if TILED_AXIS not in self.axes:
            return None
        axis = self.axes.index(TILED_AXIS)
        values = self.grid[axis]
        dense = 0
        while dense < len(values) and values[dense] == dense + 1:
            dense += 1
        if dense < 3 or dense == len(values):  # full tiles beyond K are read off profiled groups above it
            return None
        log_t = np.log(np.asarray(self.seconds, dtype=float)).reshape([len(v) for v in self.grid])
        if axis != 0:  # the largest slice of the first axis (a kernel's size: its own work weighs most there)
            log_t = log_t[-1]
            axis -= 1
        rows = np.moveaxis(log_t, axis, -1).reshape(-1, len(values))[:, :dense].mean(axis=0)
        for g in range(2, (dense + 1) // 2 + 1):  # 2 m - 1 <= K: every left-over count next to a full tile
            if rows[g - 1] - rows[g - 2] <= math.log(TILE_DROP):
                # the profiled groups above K must be whole tiles (else T(q m) would mix in left-over rows)
                return (g, dense) if all(v % g == 0 for v in values[dense:]) else None
        return None

    def predict(self, dims: Sequence[float]) -> tuple[float, tuple[str, ...]]:
        """(seconds, the axes on which ``dims`` lies outside the profiled range) for a shape ``dims``: the grid
        interpolated in log space, a tiled group beyond the dense counts priced by its tiles (module docstring)."""
        dims = self.own(dims)
        tile = self._tile
        if tile is not None:
            axis = self.axes.index(TILED_AXIS)
            g = dims[axis]
            m, dense = tile
            if g > dense and float(g).is_integer() and g not in self.grid[axis]:  # q full tiles, r rows left
                q, r = divmod(int(g), m)
                at = list(dims)
                at[axis] = q * m
                full, outside = self._interpolate(at)
                if r:
                    at[axis] = m + r
                    extra = self._interpolate(at)[0]
                    at[axis] = m
                    extra -= self._interpolate(at)[0]
                    full = max(full + extra, full)  # left-over rows never make it faster
                if g > self.grid[axis][-1] and TILED_AXIS not in outside:  # beyond the rows profiled: said so
                    outside = tuple(a for a in self.axes if a in outside or a == TILED_AXIS)
                return full, outside
        return self._interpolate(dims)

    def own(self, dims: Sequence[float]) -> tuple[float, ...]:
        """A shape's values on this profile's axes: the kernel's shape may name trailing axes the profile leaves
        out (attend's ``rows`` where a calibration did not profile them), its time then taken as not depending on
        them."""
        if len(dims) < len(self.axes):
            raise ValueError(f"kernel {self.kernel}: {len(dims)} shape values for axes {self.axes}")
        return tuple(dims[:len(self.axes)])

    @cached_property
    def _tile(self) -> tuple[int, int] | None:
        return self.tile()  # kept in the instance's __dict__ (not a field: equality and hashing ignore it)

    def _interpolate(self, dims: Sequence[float]) -> tuple[float, tuple[str, ...]]:
        """Multilinear interpolation of log time over log coordinates (extrapolating beyond the grid)."""
        log_t = np.log(np.asarray(self.seconds, dtype=float)).reshape([len(v) for v in self.grid])
        outside: list[str] = []
        # reduce one axis at a time: interpolate (or extrapolate) along the first axis, then the next
        for name, values, x in zip(self.axes, self.grid, dims, strict=True):
            if x <= 0:
                raise ValueError(f"kernel {self.kernel}: {name} must be positive, got {x}")
            if len(values) == 1:
                log_t = log_t[0]
                if x != values[0]:
                    outside.append(name)
                continue
            if not values[0] <= x <= values[-1]:
                outside.append(name)
            lv = np.log(np.asarray(values, dtype=float))
            i = int(np.clip(np.searchsorted(lv, math.log(x)) - 1, 0, len(lv) - 2))
            w = (math.log(x) - lv[i]) / (lv[i + 1] - lv[i])
            log_t = (1 - w) * log_t[i] + w * log_t[i + 1]
        return float(np.exp(log_t)), tuple(outside)

    def ranges(self) -> str:
        """The profiled range of every axis, for messages."""
        return ", ".join(f"{a} {v[0]:g}..{v[-1]:g}" for a, v in zip(self.axes, self.grid, strict=True))


def extrapolated_text(extrapolated: Mapping[tuple[str, str, str], tuple[str, ...]]) -> str:
    """What a run's ``extrapolated`` (device, kernel, dtype) -> axes says, as one cell: ``attend fp32: kv_bytes``."""
    return "; ".join(f"{fn} {dt}: {', '.join(axes)}" for (_, fn, dt), axes in sorted(extrapolated.items()))


def profile_to_yaml(p: KernelProfile) -> dict[str, Any]:
    """The YAML mapping of one profile (what :func:`parse_kernel_profiles` reads back)."""
    out: dict[str, Any] = {"axes": list(p.axes), "grid": [[_num(v) for v in vals] for vals in p.grid],
                           "seconds": [float(f"{s:.6g}") for s in p.seconds]}
    if p.spread:
        out["spread"] = [float(f"{s:.3g}") for s in p.spread]
    if p.loaded > 1:
        out["loaded"] = p.loaded
    if p.alone_at:
        out["alone"] = {p.axes[0]: [_num(v) for v in p.alone_at], "ratio": [float(f"{r:.4g}") for r in p.alone]}
    return out


def _num(v: float) -> float | int:
    return int(v) if float(v).is_integer() else float(f"{v:.6g}")


def parse_kernel_profiles(raw: Any, axes_of: Mapping[str, tuple[str, ...]], dtypes: Sequence[str],
                          locate: Callable[[tuple[Any, ...], InputError], InputError],
                          optional: Mapping[str, int] | None = None) -> dict[tuple[str, str], KernelProfile]:
    """``kernels:`` of a device spec -> {(kernel, dtype): profile}. ``axes_of`` gives each profilable kernel's
    axes (the kernel table's), ``optional`` how many of its trailing axes a profile may leave out;
    ``locate(subpath, err)`` places an error in the file."""
    if not isinstance(raw, Mapping):
        raise locate((), InputError("must map kernel name -> dtype -> profile"))
    out: dict[tuple[str, str], KernelProfile] = {}
    for kernel, per_dtype in raw.items():
        if kernel not in axes_of:
            raise locate((kernel,), InputError(f"no profile for this kernel; profiled kernels: "
                                               f"{', '.join(sorted(axes_of))}"))
        if not isinstance(per_dtype, Mapping):
            raise locate((kernel,), InputError("must map dtype -> profile"))
        for dtype, body in per_dtype.items():
            path = (kernel, dtype)
            if dtype not in dtypes:
                raise locate(path, InputError(f"unknown dtype; valid: {', '.join(dtypes)}"))
            out[(str(kernel), str(dtype))] = _profile(str(kernel), str(dtype), body, axes_of[kernel],
                                                      (optional or {}).get(kernel, 0), path, locate)
    return out


def _profile(kernel: str, dtype: str, body: Any, axes: tuple[str, ...], optional: int, path: tuple[Any, ...],
             locate: Callable[[tuple[Any, ...], InputError], InputError]) -> KernelProfile:
    if not isinstance(body, Mapping):
        raise locate(path, InputError("must be a mapping with axes, grid and seconds"))
    unknown = set(body) - {"axes", "grid", "seconds", "spread", "loaded", "alone"}
    if unknown:
        key = sorted(unknown, key=str)[0]
        raise locate((*path, key), InputError("unknown key; valid keys: axes, grid, seconds, spread, loaded, alone"))
    for key in ("axes", "grid", "seconds"):
        if key not in body:
            raise locate(path, InputError(f"missing {key!r}"))
    allowed = [list(axes[:n]) for n in range(len(axes), len(axes) - optional - 1, -1)]
    if not isinstance(body["axes"], list) or [str(a) for a in body["axes"]] not in allowed:
        also = "".join(f" or {a}" for a in allowed[1:])
        raise locate((*path, "axes"), InputError(f"must be {list(axes)}{also} for kernel {kernel}, got "
                                                 f"{excerpt(body['axes'])}"))
    axes = tuple(str(a) for a in body["axes"])
    grid, seconds, spread = body["grid"], body["seconds"], body.get("spread", [])
    for key, value in (("grid", grid), ("seconds", seconds), ("spread", spread)):
        if not isinstance(value, list):
            raise locate((*path, key), InputError(f"must be a list, got {excerpt(value)}"))
    alone_at, alone = _alone(body.get("alone"), axes[0], (*path, "alone"), locate)
    try:
        return KernelProfile(kernel, dtype, tuple(axes), tuple(tuple(float(v) for v in _list(vals)) for vals in grid),
                             tuple(float(s) for s in seconds), tuple(float(s) for s in spread),
                             body.get("loaded", 1), alone_at, alone)
    except (TypeError, ValueError) as err:
        raise locate(path, InputError(str(err))) from None


def _alone(raw: Any, axis: str, path: tuple[Any, ...], locate: Callable[[tuple[Any, ...], InputError], InputError]
           ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A profile's ``alone: {<first axis>: [...], ratio: [...]}`` as (values, ratios); ((), ()) when absent."""
    if raw is None:
        return (), ()
    if not isinstance(raw, Mapping):
        raise locate(path, InputError(f"must map {axis} and ratio to lists, got {excerpt(raw)}"))
    for key in raw:
        if key not in (axis, "ratio"):
            raise locate((*path, key), InputError(f"unknown key; valid keys: {axis}, ratio"))
    out = []
    for key in (axis, "ratio"):
        if key not in raw:
            raise locate(path, InputError(f"missing {key!r}"))
        values = raw[key]
        if not isinstance(values, list) or not values:
            raise locate((*path, key), InputError(f"must be a non-empty list, got {excerpt(values)}"))
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise locate((*path, key, i), InputError(f"must be a number, got {excerpt(v)}"))
        out.append(tuple(float(v) for v in values))
    return out[0], out[1]


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"each grid entry must be a list of values, got {excerpt(value)}")
    return value
