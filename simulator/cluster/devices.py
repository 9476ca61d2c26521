"""Device specs and the roofline compute model.

An op with ``flops`` floating-point operations touching ``nbytes`` bytes of memory takes::

    launch_s + max(flops / (peak_flops[dtype] * eff), nbytes / (mem_bw_Bps * eff_mem))

where ``eff`` is ``eff_flops``, except for attention kernels (the ops whose ``fn`` is in
:data:`simulator.kernels.table.ATTENTION_KERNELS`: the prefill forward and backward block kernels), which take the
device's ``attention_efficiency`` (forward, backward) when given: FlashAttention kernels reach well below dense
matmul peak (FlashAttention-2, arXiv:2307.08691, reports 50-73 % of A100 peak forward). The YAML key is
``attention_efficiency: {forward: 0.6, backward: 0.45}``; each defaults to ``eff_flops``, so it is never a hidden
factor: set it from a measurement of your kernels (e.g. ``benchmarks`` of flash-attn on the device).

A device may also carry ``kernels:``, measured times of its kernels over shapes (:mod:`simulator.kernels.profiles`,
written by ``treering calibrate``). A kernel with a profile for the op's dtype takes the profile's interpolated time
(launch included) instead of the roofline; the others stay on the roofline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import InputError, excerpt
from simulator.kernels.profiles import KernelProfile, parse_kernel_profiles
from simulator.kernels.table import ATTENTION_KERNELS, OPTIONAL_AXES, PROFILE_AXES
from simulator.units import CODE, DTYPE_BYTES, Check, checked_quantity

__all__ = ["ATTENTION_KERNELS", "DeviceSpec", "compute_time", "flops_efficiency", "parse_device_spec",
           "profiled_time", "roofline"]



@dataclass(frozen=True)
class DeviceSpec:
    """A compute device. SI units: FLOP/s, bytes/s, bytes, seconds."""

    name: str
    peak_flops: Mapping[str, float] = field(default_factory=dict)  # dtype -> FLOP/s
    mem_bw_Bps: float = 0.0
    mem_bytes: float = 0.0
    launch_s: float = 0.0
    eff_flops: float = 1.0
    eff_mem: float = 1.0
    attention_eff: Mapping[str, float] = field(default_factory=dict)  # forward/backward -> fraction of peak
    kernels: Mapping[tuple[str, str], KernelProfile] = field(default_factory=dict)  # (fn, dtype) -> profile

    def flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; an unsupported dtype is an :class:`InputError`."""
        try:
            return self.peak_flops[dtype]
        except KeyError:
            have = ", ".join(sorted(self.peak_flops)) or "none"
            raise InputError(f"device {self.name!r} has no peak FLOP/s for dtype {dtype!r} (has: {have})") \
                from None


def flops_efficiency(spec: DeviceSpec, fn: str = "") -> float:
    """The fraction of peak FLOP/s a kernel ``fn`` reaches: its attention efficiency, else ``eff_flops``."""
    which = ATTENTION_KERNELS.get(fn)
    return spec.attention_eff.get(which, spec.eff_flops) if which else spec.eff_flops


def roofline(spec: DeviceSpec, flops: float, nbytes: float, dtype: str, fn: str = "") -> tuple[float, float]:
    """(compute time, memory time) of kernel ``fn`` on ``spec``, in seconds: the two sides of the roofline."""
    t_flops = flops / (spec.flops_for(dtype) * flops_efficiency(spec, fn)) if flops > 0 else 0.0
    t_mem = nbytes / (spec.mem_bw_Bps * spec.eff_mem) if nbytes > 0 else 0.0
    return t_flops, t_mem


def compute_time(spec: DeviceSpec, flops: float, nbytes: float, dtype: str, launch: bool = True,
                 fn: str = "") -> float:
    """Roofline time of one kernel ``fn`` in seconds (launch overhead included unless ``launch`` is False)."""
    return (spec.launch_s if launch else 0.0) + max(roofline(spec, flops, nbytes, dtype, fn))


def profiled_time(spec: DeviceSpec, fn: str, dtype: str, dims: tuple[float, ...]
                  ) -> tuple[float, tuple[str, ...]] | None:
    """(seconds, axes extrapolated on) of kernel ``fn`` of shape ``dims`` from the device's profile, or None when
    the device has no profile of ``fn`` in ``dtype`` (or the op carries no shape)."""
    profile = kernel_profile(spec, fn, dtype, dims)
    return None if profile is None else profile.predict(dims)


def kernel_profile(spec: DeviceSpec, fn: str, dtype: str, dims: tuple[float, ...]) -> KernelProfile | None:
    """The device's profile of kernel ``fn`` in ``dtype``, if it has one and the op carries a shape (``dims``)."""
    return spec.kernels.get((fn, dtype)) if dims else None


_SPEC_KEYS = {"peak_flops", "mem_bw", "mem", "launch_overhead", "eff_flops", "eff_mem", "attention_efficiency",
              "kernels"}


def parse_device_spec(name: str, raw: Any, locate: Any, check: Check = CODE) -> DeviceSpec:
    """Build a :class:`DeviceSpec` from a YAML mapping (its quantities checked as ``check`` says:
    :class:`simulator.units.Check`).

    ``locate(subpath, err)`` turns an :class:`InputError` into a located one (file, line, field).
    Keys: ``peak_flops`` ({dtype: "989 TFLOP/s"}), ``mem_bw``, ``mem``, ``launch_overhead``, ``eff_flops``,
    ``eff_mem``, ``attention_efficiency`` ({forward: 0.6, backward: 0.45}).
    """
    if not isinstance(raw, Mapping):
        raise locate((), InputError("device spec must be a mapping"))
    for key in raw:
        if key not in _SPEC_KEYS:
            raise locate((key,), InputError(f"unknown key; valid keys: {', '.join(sorted(_SPEC_KEYS))}"))
    flops_raw = raw.get("peak_flops", {})
    if not isinstance(flops_raw, Mapping):
        raise locate(("peak_flops",), InputError("must map dtype to FLOP/s"))
    peak: dict[str, float] = {}
    for dtype, val in flops_raw.items():
        if dtype not in DTYPE_BYTES:
            raise locate(("peak_flops", dtype),
                         InputError(f"unknown dtype; valid: {', '.join(DTYPE_BYTES)}"))
        peak[dtype] = _positive("flops", val, ("peak_flops", dtype), locate, check)
    return DeviceSpec(
        name=name,
        peak_flops=peak,
        mem_bw_Bps=_positive("bandwidth", raw.get("mem_bw", "1 TB/s"), ("mem_bw",), locate, check),
        mem_bytes=_positive("bytes", raw.get("mem", "80 GB"), ("mem",), locate, check),
        launch_s=_non_negative("time", raw.get("launch_overhead", 0), ("launch_overhead",), locate, check),
        eff_flops=_fraction(raw.get("eff_flops", 1.0), ("eff_flops",), locate),
        eff_mem=_fraction(raw.get("eff_mem", 1.0), ("eff_mem",), locate),
        attention_eff=_attention_eff(raw.get("attention_efficiency", {}), locate),
        kernels=_kernels(raw.get("kernels", {}), locate),
    )


def _kernels(raw: Any, locate: Any) -> dict[tuple[str, str], KernelProfile]:
    if not raw:
        return {}
    return parse_kernel_profiles(raw, PROFILE_AXES, list(DTYPE_BYTES),
                                 lambda sub, err: locate(("kernels", *sub), err), OPTIONAL_AXES)


def _attention_eff(raw: Any, locate: Any) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        raise locate(("attention_efficiency",), InputError("must map forward/backward to a fraction of peak"))
    valid = sorted(set(ATTENTION_KERNELS.values()))
    out = {}
    for key, value in raw.items():
        if key not in valid:
            raise locate(("attention_efficiency", key), InputError(f"unknown key; valid keys: {', '.join(valid)}"))
        out[key] = _fraction(value, ("attention_efficiency", key), locate)
    return out


def _positive(kind: str, value: Any, path: tuple[Any, ...], locate: Any, check: Check = CODE) -> float:
    try:
        return checked_quantity(value, kind, positive=True, unit=check.unit, plausible=check.plausible)
    except InputError as err:
        raise locate(path, err) from None


def _non_negative(kind: str, value: Any, path: tuple[Any, ...], locate: Any, check: Check = CODE) -> float:
    try:
        return checked_quantity(value, kind, positive=False, unit=check.unit, plausible=check.plausible)
    except InputError as err:
        raise locate(path, err) from None


def _fraction(value: Any, path: tuple[Any, ...], locate: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise locate(path, InputError(f"must be a number in (0, 1], got {excerpt(value)}"))
    return float(value)
