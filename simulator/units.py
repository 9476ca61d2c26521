"""Parse human quantities into SI floats: bytes, bytes/s, seconds, FLOP/s.

>>> parse_bandwidth("450 GB/s")
450000000000.0
>>> parse_bandwidth("400 Gb/s")  # bits: divided by 8
50000000000.0
>>> parse_time("1.5 us")
1.5e-06
>>> parse_bytes("80 GiB")
85899345920.0
>>> parse_flops("989 TFLOP/s")
989000000000000.0

The parsers take plain numbers (``1e9`` or ``"1e9"``) as already in SI base units. Errors raise
:class:`~simulator.errors.InputError` with a message naming the expected unit; the caller adds the location.
Text longer than :data:`MAX_QUANTITY_CHARS`, overflow, ``inf`` and ``nan`` are errors, never exceptions of their
own.

:func:`checked_quantity` is the one checked parser that topologies, device specs, builders and workloads call. It
adds what a user's file or command line must satisfy:

* a unit: a bare number other than 0 is refused ("give a unit": is ``400`` meant in Gb/s, GB/s or B/s?), except a
  :class:`SI` value (computed by the code, e.g. a builder's expansion), sizes under a key that names the unit
  (``bytes:``) and mappings built by code (:data:`CODE`), whose callers pass ``unit=False``;
* the sign, and the range of :data:`LIMITS` (a bandwidth of 4.9e-324 B/s or a latency of 1e308 s parse, but no
  simulation of them means anything);
* with ``plausible``, the range of :data:`PLAUSIBLE` (a link of 400 B/s or of 10 PB/s is a unit mistaken, not a
  machine): topologies and device specs are checked so unless ``--force``.
"""

from __future__ import annotations

import decimal
import math
import re
from dataclasses import dataclass
from decimal import Decimal

from simulator.errors import InputError, excerpt

__all__ = ["CODE", "DTYPE_BYTES", "LIMITS", "MAX_QUANTITY_CHARS", "PLAUSIBLE", "SI", "Check", "checked_quantity",
           "format_quantity", "parse_bandwidth", "parse_bytes", "parse_flops", "parse_quantity", "parse_time",
           "parse_time_strict", "parse_tokens", "user_check"]

DTYPE_BYTES: dict[str, int] = {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # bytes of one element

MAX_QUANTITY_CHARS = 64
# kind -> (smallest positive value, largest value) that a simulation can mean, SI units
LIMITS: dict[str, tuple[float, float]] = {
    "bytes": (1e-3, 1e21),  # up to a zettabyte
    "bandwidth": (1.0, 1e30),  # a byte per second .. (tests model "free" links at 1e30 B/s)
    "time": (1e-15, 1e7),  # a femtosecond .. about 4 months
    "flops": (1.0, 1e30),
}
# kind -> (smallest, largest) non-zero value a real cluster has: outside, a unit was most likely mistaken
# (``400 B/s`` for 400 Gb/s); refused in topologies and device specs unless --force
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "bytes": (1e6, 1e15),  # a device's memory: 1 MB .. 1 PB
    "bandwidth": (1e6, 1e15),  # a link or a memory: 1 MB/s .. 1 PB/s
    "time": (1e-12, 1.0),  # a latency or overhead: 1 ps .. 1 s
    "flops": (1e9, 1e18),  # a device: 1 GFLOP/s .. 1 EFLOP/s
}


@dataclass(frozen=True)
class Check:
    """What a parsed quantity must satisfy beyond its sign and :data:`LIMITS`: its ``unit`` written (a user's file
    or command line), and a ``plausible`` value (a user's topology or device spec, without ``--force``)."""

    unit: bool = True
    plausible: bool = False


CODE = Check(unit=False)  # a mapping built by code (tests, the engine's own clusters): plain SI numbers


def user_check(force: bool) -> Check:
    """A user's topology or device spec: units written, values plausible unless ``force``."""
    return Check(unit=True, plausible=not force)


class SI(float):
    """A quantity already in SI base units, computed by the code (a builder's links, an importer's figures): taken
    as it is, without the unit that a user must write, and not judged for plausibility (its inputs were)."""

    __slots__ = ()


_CONTEXT = decimal.Context(prec=40, Emax=10_000, Emin=-10_000)
_SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_IEC = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9, "ps": 1e-12,
         "sec": 1.0, "min": 60.0, "h": 3600.0}
_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_RE = re.compile(rf"^\s*{_NUM}\s*([A-Za-zµμ/]*(?:/s)?)\s*$")

# unit kind -> (base unit spellings -> multiplier per base unit)
_BASES: dict[str, dict[str, float]] = {
    "bytes": {"B": 1.0, "byte": 1.0, "bytes": 1.0, "b": 0.125, "bit": 0.125, "bits": 0.125},
    "bandwidth": {"B/s": 1.0, "Bps": 1.0, "b/s": 0.125, "bps": 0.125, "bit/s": 0.125},
    "flops": {"FLOP/s": 1.0, "FLOPS": 1.0, "flop/s": 1.0, "flops": 1.0, "FLOP": 1.0},
}
_SI_UNIT = {"bytes": "B", "bandwidth": "B/s", "time": "s", "flops": "FLOP/s"}
_NOUN = {"bytes": "byte size", "bandwidth": "bandwidth", "time": "time", "flops": "FLOP rate"}
_EXAMPLES = {"bytes": "'80 GiB'", "bandwidth": "'450 GB/s' or '400 Gb/s'", "time": "'2 us'",
             "flops": "'989 TFLOP/s'"}


def _multiplier(unit: str, kind: str) -> float | None:
    if kind == "time":
        return _TIME.get(unit)
    for base, mult in _BASES[kind].items():
        if unit == base:
            return mult
        if unit.endswith(base):
            prefix = unit[: -len(base)]
            if prefix in _IEC:
                return _IEC[prefix] * mult
            if prefix in _SI:
                return _SI[prefix] * mult
    return None


def parse_quantity(value: object, kind: str) -> float:
    """Parse ``value`` as a quantity of ``kind`` (bytes, bandwidth, time, flops) into SI units."""
    if kind not in _EXAMPLES:
        raise ValueError(f"unknown unit kind {kind!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"expected a {_NOUN[kind]} such as {_EXAMPLES[kind]}, got {excerpt(value)}")
    try:
        result = _parse(value, kind)
    except (ArithmeticError, ValueError):  # overflow, a literal too big for a float, decimal traps
        raise InputError(f"{_NOUN[kind]} out of range, got {excerpt(value)}") from None
    if not math.isfinite(result):
        raise InputError(f"{_NOUN[kind]} must be finite, got {excerpt(value)}")
    return result


def _parse(value: int | float | str, kind: str) -> float:
    if not isinstance(value, str):
        return float(value)
    match = _RE.match(value) if len(value) <= MAX_QUANTITY_CHARS else None
    mult = _multiplier(match.group(2), kind) if match and match.group(2) else (1.0 if match else None)
    if match is None or mult is None:
        raise InputError(f"cannot parse {excerpt(value)} as a {_NOUN[kind]}; write it like {_EXAMPLES[kind]}")
    # scale in decimal so that '6.6 us' is the double nearest 6.6e-06, as the literal would be
    scale = Decimal(mult) if mult >= 1 else 1 / Decimal(round(1 / mult))
    return float(_CONTEXT.multiply(Decimal(match.group(1)), scale))


def _bare(value: object) -> bool:
    """A number written without a unit (``400``, ``"400"``), not a :class:`SI` value."""
    if isinstance(value, SI):
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return True
    match = _RE.match(value) if isinstance(value, str) and len(value) <= MAX_QUANTITY_CHARS else None
    return match is not None and not match.group(2)


def checked_quantity(value: object, kind: str, *, positive: bool, unit: bool = True, plausible: bool = False
                     ) -> float:
    """A quantity that is ``positive`` (> 0) or else non-negative (>= 0), within the range of :data:`LIMITS`;
    written with its unit (``unit``: a bare 0 is 0 in any unit) and, with ``plausible``, within :data:`PLAUSIBLE`
    (module docstring)."""
    x = parse_quantity(value, kind)
    if unit and x != 0 and _bare(value):
        raise InputError(f"give a unit, e.g. {_EXAMPLES[kind]}, got {excerpt(value)}")
    low, high = LIMITS[kind]
    if x < 0 or (positive and x == 0):
        raise InputError(f"must {'be positive' if positive else 'not be negative'}, got {excerpt(value)}")
    if x > high or 0 < x < low:
        raise InputError(f"a {_NOUN[kind]} of {x:.3g} {_SI_UNIT[kind]} is outside {low:g} .. {high:g}, "
                         f"got {excerpt(value)}")
    if plausible and not isinstance(value, SI) and x != 0:
        low, high = PLAUSIBLE[kind]
        if not low <= x <= high:
            raise InputError(f"a {_NOUN[kind]} of {format_quantity(x, kind)} is implausible (expected "
                             f"{format_quantity(low, kind)} .. {format_quantity(high, kind)}): check its unit, or "
                             f"--force uses it anyway; got {excerpt(value)}")
    return x


_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))
_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"), (1e-12, "ps"))


def format_quantity(x: float, kind: str) -> str:
    """``450 GB/s``, ``400 B/s``, ``0.6 us``, ``80 GB``: four significant digits, SI prefixes (powers of 1000).

    >>> format_quantity(5e10, "bandwidth"), format_quantity(6e-7, "time"), format_quantity(85899345920.0, "bytes")
    ('50 GB/s', '600 ns', '85.9 GB')
    """
    if kind == "time":
        scale, name = next(((s, u) for s, u in _TIME_UNITS if abs(x) >= s), _TIME_UNITS[-1])
        return f"{x / scale:.4g} {name}"
    base = {"bytes": "B", "bandwidth": "B/s", "flops": "FLOP/s"}[kind]
    scale, prefix = next(((s, p) for s, p in _PREFIXES if abs(x) >= s), _PREFIXES[-1])
    if abs(x) >= 1e18:
        scale, prefix = 1e15, "P"
    return f"{x / scale:.4g} {prefix}{base}"


def parse_bytes(value: object) -> float:
    """Bytes: '80 GiB', '1.5 MB', '1e9' (SI and IEC prefixes; 'b' means bits)."""
    return parse_quantity(value, "bytes")


def parse_bandwidth(value: object) -> float:
    """Bytes per second: '450 GB/s', '400 Gb/s' (bits), '25 GiB/s'."""
    return parse_quantity(value, "bandwidth")


def parse_time(value: object) -> float:
    """Seconds: '2 us', '1.5 ms', '936 ns', '0.1 s'."""
    return parse_quantity(value, "time")


def parse_flops(value: object) -> float:
    """FLOP/s: '989 TFLOP/s', '165 TFLOPS'."""
    return parse_quantity(value, "flops")


def parse_time_strict(value: object) -> float:
    """Seconds from a time that names its unit: '50ms', '50 ms', '0.05 s'. A bare number is refused (is 50 seconds
    or milliseconds meant?)."""
    match = _RE.match(value) if isinstance(value, str) else None
    if match is not None and not match.group(2):
        raise InputError(f"give a unit, e.g. {str(value).strip()}ms or {str(value).strip()}s, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise InputError(f"give a unit, e.g. {value}ms or {value}s, got {value!r}")
    return parse_time(value)


_TOKEN_SUFFIX = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


def parse_tokens(value: object) -> int:
    """Token counts: ``1048576``, ``128K`` (x 1024), ``1M`` (x 2^20), ``1.5M``; shared by the CLI and the YAML.

    >>> parse_tokens("128K"), parse_tokens("1M"), parse_tokens(4096)
    (131072, 1048576, 4096)
    """
    if isinstance(value, bool):
        raise InputError(f"expected a token count such as 1048576, 128K or 1M, got {value!r}")
    if isinstance(value, int):
        number = float(value)
    elif isinstance(value, float):
        number = value
    elif isinstance(value, str):
        t = value.strip().lower()
        suffix = t[-1] if t and t[-1] in "kmg" else ""
        try:
            number = float(t[: len(t) - len(suffix)].strip()) * _TOKEN_SUFFIX[suffix]
        except ValueError:
            raise InputError(f"expected a token count such as 1048576, 128K or 1M, got {value!r}") from None
    else:
        raise InputError(f"expected a token count such as 1048576, 128K or 1M, got {value!r}")
    if not math.isfinite(number) or number < 1 or number != int(number):
        raise InputError(f"must be a positive integer, got {value!r}")
    return int(number)
