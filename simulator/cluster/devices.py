"""Device specs and the roofline compute model.

An op with ``flops`` floating-point operations touching ``nbytes`` bytes of memory takes::

    launch_s + max(flops / (peak_flops[dtype] * eff), nbytes / (mem_bw_Bps * eff_mem))

times the device's ``slowdown`` (1 but on a straggler named by a scenario's ``faults:``,
:mod:`simulator.cluster.faults`; a profiled or tiled time is multiplied by it too), where ``eff`` is ``eff_flops``,
except for attention kernels (the ops whose ``fn`` is in
:data:`simulator.kernels.table.ATTENTION_KERNELS`: the prefill forward and backward block kernels), which take the
device's ``attention_efficiency`` (forward, backward) when given: FlashAttention kernels reach well below dense
matmul peak (FlashAttention-2, arXiv:2307.08691, reports 50-73 % of A100 peak forward). The YAML key is
``attention_efficiency: {forward: 0.6, backward: 0.45}``; each defaults to ``eff_flops``, so it is never a hidden
factor: set it from a measurement of your kernels (e.g. ``benchmarks`` of flash-attn on the device).

A device may also carry ``kernels:``, measured times of its kernels over shapes (:mod:`simulator.kernels.profiles`,
written by ``treering calibrate``). A kernel with a profile for the op's dtype takes the profile's interpolated time
(launch included) instead of the roofline; the others stay on the roofline.

A GPU whose spec names its FlashAttention implementation and the facts it runs on (``attention_kernels``,
``sm_count``, ``sfu_rate``: the special-function units' exp2 per second) times the attention blocks by their tiles
(:mod:`simulator.kernels.tiles`, docs/kernels.md) rather than by the roofline. A measured profile comes first, then
an ``attention_efficiency`` set for the pass (a measurement of the user's kernels), then the tiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import InputError, excerpt
from simulator.kernels.profiles import KernelProfile, parse_kernel_profiles
from simulator.kernels.table import ATTENTION_KERNELS, OPTIONAL_AXES, PROFILE_AXES
from simulator.kernels.tiles import IMPLEMENTATIONS, attention_time
from simulator.units import CODE, DTYPE_BYTES, Check, checked_quantity

__all__ = [
    "ATTENTION_KERNELS",
    "DeviceSpec",
    "compute_time",
    "duration_with_sms_held",
    "flops_efficiency",
    "parse_device_spec",
    "profiled_time",
    "roofline",
]



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
    sm_count: int = 0  # streaming multiprocessors (0: not given, no tile model)
    sfu_flops: float = 0.0  # special-function unit results (exp2) per second, whole device
    attention_kernels: str = ""  # the FlashAttention implementation it runs (simulator.kernels.tiles)
    slowdown: float = 1.0  # every kernel takes this many times longer (a straggler: simulator.cluster.faults)

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
    return ((spec.launch_s if launch else 0.0) + max(roofline(spec, flops, nbytes, dtype, fn))) * spec.slowdown


def duration_with_sms_held(spec: DeviceSpec, held: int, flops: float, nbytes: float, dtype: str, fn: str,
                           dims: tuple[float, ...], fused: bool) -> float:
    """A kernel's seconds on ``spec`` while ``held`` of its SMs are taken by other work (NCCL's CTAs: the engine's
    contention), timed as the engine times it alone (:func:`profiled_time`, else the roofline) on the SMs left:
    an attention block by its tiles on ``sm_count - held`` SMs (their waves re-quantized), a measured profile as if
    wholly SM-bound, a roofline kernel ``launch + max(t_flops sm_count / (sm_count - held), t_mem)`` (the launch
    and the memory side do not stretch)."""
    sms = spec.sm_count
    left = sms - held
    if left <= 0:
        raise ValueError(f"{held} SMs held of the {sms} of {spec.name}")
    profiled = None if fused else profiled_time(spec, fn, dtype, dims, sms=left)
    if profiled is not None:
        return profiled[0]
    t_flops, t_mem = roofline(spec, flops, nbytes, dtype, fn)
    return ((0.0 if fused else spec.launch_s) + max(t_flops * sms / left, t_mem)) * spec.slowdown


def profiled_time(spec: DeviceSpec, fn: str, dtype: str, dims: tuple[float, ...], sms: int = 0
                  ) -> tuple[float, tuple[str, ...]] | None:
    """(seconds, axes extrapolated on) of kernel ``fn`` of shape ``dims`` from the device's profile, else, for an
    attention block on a GPU with tile facts and no ``attention_efficiency`` set for its pass, from its tiles
    (nothing extrapolated); None when neither applies (the op then takes the roofline). ``sms`` > 0: on that many
    of the device's SMs (its tiles scheduled on them; a profile's time scaled as if wholly SM-bound)."""
    profile = kernel_profile(spec, fn, dtype, dims)
    if profile is not None:
        hit, outside = profile.predict(dims)
        return (hit * spec.slowdown * spec.sm_count / sms if sms > 0 else hit * spec.slowdown), outside
    which = ATTENTION_KERNELS.get(fn)
    if not which or not dims or which in spec.attention_eff:  # a measured efficiency of the pass comes first
        return None
    tiled = attention_time(spec, which == "backward", dtype, dims, sms=sms)
    return None if tiled is None else (tiled * spec.slowdown, ())


def kernel_profile(spec: DeviceSpec, fn: str, dtype: str, dims: tuple[float, ...]) -> KernelProfile | None:
    """The device's profile of kernel ``fn`` in ``dtype``, if it has one and the op carries a shape (``dims``)."""
    return spec.kernels.get((fn, dtype)) if dims else None


_SPEC_KEYS = {"peak_flops", "mem_bw", "mem", "launch_overhead", "eff_flops", "eff_mem", "attention_efficiency",
              "kernels", "sm_count", "sfu_rate", "attention_kernels"}


def parse_device_spec(name: str, raw: Any, locate: Any, check: Check = CODE) -> DeviceSpec:
    """Build a :class:`DeviceSpec` from a YAML mapping (its quantities checked as ``check`` says:
    :class:`simulator.units.Check`).

    ``locate(subpath, err)`` turns an :class:`InputError` into a located one (file, line, field).
    Keys: ``peak_flops`` ({dtype: "989 TFLOP/s"}), ``mem_bw``, ``mem``, ``launch_overhead``, ``eff_flops``,
    ``eff_mem``, ``attention_efficiency`` ({forward: 0.6, backward: 0.45}), ``sm_count``, ``sfu_rate`` ("3.9
    TFLOP/s": exp2 per second), ``attention_kernels`` (``flash-attention-2`` or ``-3``).
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
        sm_count=_count(raw.get("sm_count", 0), ("sm_count",), locate),
        sfu_flops=_non_negative("flops", raw.get("sfu_rate", 0), ("sfu_rate",), locate, check),
        attention_kernels=_implementation(raw.get("attention_kernels", ""), locate),
    )


def _count(value: Any, path: tuple[Any, ...], locate: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise locate(path, InputError(f"must be a whole number >= 0, got {excerpt(value)}"))
    return value


def _implementation(value: Any, locate: Any) -> str:
    if value != "" and value not in IMPLEMENTATIONS:
        raise locate(("attention_kernels",), InputError(f"unknown implementation {excerpt(value)}; valid: "
                                                        f"{', '.join(IMPLEMENTATIONS)}"))
    return str(value)


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
