from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.errors import InputError
from simulator.units import parse_bandwidth, parse_bytes, parse_flops, parse_time, parse_time_strict, parse_tokens


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
