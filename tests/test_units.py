from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.errors import InputError
from simulator.units import (
    SI,
    checked_quantity,
    format_quantity,
    parse_bandwidth,
    parse_bytes,
    parse_flops,
    parse_time,
    parse_time_strict,
    parse_tokens,
)


@pytest.mark.parametrize(("text", "value"), [
    ("450 GB/s", 450e9), ("400 Gb/s", 50e9), ("200Gb/s", 25e9), ("25 GiB/s", 25 * 2**30), ("1e9", 1e9),
    (3.5e9, 3.5e9), ("64 GB/s", 64e9), ("100 Gbps", 12.5e9),
])
def test_bandwidth(text, value):
    assert parse_bandwidth(text) == pytest.approx(value, rel=1e-15)


@pytest.mark.parametrize(("text", "value"), [
    ("1.5 us", 1.5e-6), ("2 us", 2e-6), ("936 ns", 936e-9), ("6.6 us", 6.6e-6), ("1 ms", 1e-3), ("0.1 s", 0.1),
    ("3µs", 3e-6), (0, 0.0),
])
def test_time(text, value):
    assert parse_time(text) == pytest.approx(value, rel=1e-15)


def test_sub_unit_prefixes_are_exact():
    assert parse_time("6.6 us") == 6.6e-06
    assert parse_time("468 ns") == 468e-9


@pytest.mark.parametrize(("text", "value"), [
    ("80 GiB", 80 * 2**30), ("80 GB", 80e9), ("1 KiB", 1024), ("1.5 MB", 1.5e6), ("8 b", 1.0), ("1e9", 1e9),
])
def test_bytes(text, value):
    assert parse_bytes(text) == pytest.approx(value, rel=1e-15)


@pytest.mark.parametrize(("text", "value"), [("989 TFLOP/s", 989e12), ("165.2 TFLOPS", 165.2e12),
                                             ("1.979 PFLOP/s", 1.979e15)])
def test_flops(text, value):
    assert parse_flops(text) == pytest.approx(value, rel=1e-15)


@pytest.mark.parametrize("bad", ["450 GB", "fast", "10 GB/z", "", True, None, "inf GB/s", [1]])
def test_bad_bandwidth_is_an_input_error(bad):
    with pytest.raises(InputError, match="bandwidth"):
        parse_bandwidth(bad)


def test_time_rejects_bandwidth_units():
    with pytest.raises(InputError, match="write it like '2 us'"):
        parse_time("5 GB/s")


@given(st.integers(1, 10**7))
def test_token_counts_with_suffixes(k):
    assert parse_tokens(k) == k and parse_tokens(str(k)) == k
    assert parse_tokens(f"{k}K") == k * 1024 and parse_tokens(f"{k} k") == k * 1024
    assert parse_tokens(f"{k}M") == k * 2**20


@pytest.mark.parametrize("bad", ["", "M", "1.2.3K", "0", "-1K", "0.3", True, None, "1e400"])
def test_token_counts_refused(bad):
    with pytest.raises(InputError):
        parse_tokens(bad)


@pytest.mark.parametrize("bare", ["50", " 50 ", 50, 0.05])
def test_a_strict_time_names_its_unit(bare):
    with pytest.raises(InputError, match="give a unit"):
        parse_time_strict(bare)
    assert parse_time_strict("50ms") == pytest.approx(0.05) and parse_time_strict("50 us") == pytest.approx(5e-5)


# -- what a user's file or command line must write: a unit, and a plausible value ----------------------------------

@pytest.mark.parametrize(("value", "kind"), [(400, "bandwidth"), ("400", "bandwidth"), (2e-6, "time"),
                                             ("80e9", "bytes"), (989e12, "flops")])
def test_a_bare_number_needs_a_unit(value, kind):
    with pytest.raises(InputError, match=r"^give a unit, e\.g\. '"):
        checked_quantity(value, kind, positive=True)


def test_zero_a_computed_value_and_a_size_under_bytes_need_no_unit():
    assert checked_quantity(0, "time", positive=False) == 0.0
    assert checked_quantity(SI(5e10), "bandwidth", positive=True) == 5e10
    assert checked_quantity(1e9, "bytes", positive=True, unit=False) == 1e9


@pytest.mark.parametrize(("value", "kind", "shown"), [
    ("400 B/s", "bandwidth", "400 B/s"), ("10 PB/s", "bandwidth", "10 PB/s"), ("2 s", "time", "2 s"),
    ("80 KB", "bytes", "80 kB"), ("1 MFLOP/s", "flops", "1 MFLOP/s"),
])
def test_implausible_values_are_refused_unless_forced(value, kind, shown):
    with pytest.raises(InputError, match=f"^a [a-zA-Z ]+ of {shown} is implausible .*--force uses it anyway"):
        checked_quantity(value, kind, positive=True, plausible=True)
    assert checked_quantity(value, kind, positive=True) > 0  # --force: plausible=False
    assert checked_quantity(SI(checked_quantity(value, kind, positive=True)), kind, positive=True, plausible=True)


@pytest.mark.parametrize(("x", "kind", "text"), [
    (5e10, "bandwidth", "50 GB/s"), (400.0, "bandwidth", "400 B/s"), (6.6e-6, "time", "6.6 us"),
    (80e9, "bytes", "80 GB"), (989e12, "flops", "989 TFLOP/s"), (0.0, "time", "0 ps"),
])
def test_quantities_are_shown_with_a_prefix(x, kind, text):
    assert format_quantity(x, kind) == text
