"""The nccl-tests log parser on real logs (tests/fixtures/nccltests/README.md cites them) and on broken ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.nccl.logs import parse_nccl_tests, read_nccl_tests

FIX = Path(__file__).parent / "fixtures" / "nccltests"
ALLREDUCE = FIX / "all_reduce_h100_2x8_a3mega.log"
ALLGATHER = FIX / "all_gather_gb10_2x1.log"


def test_allreduce_16_ranks_from_the_command_line():
    (run,) = read_nccl_tests(str(ALLREDUCE))
    assert (run.collective, run.ranks, len(run.rows)) == ("allreduce", 16, 31)
    assert [r.nbytes for r in run.rows] == [8 * 2**k for k in range(31)]  # -b 8 -e 8G -f 2
    first, last = run.rows[0], run.rows[-1]
    assert (first.count, first.dtype, first.redop, first.root) == (2, "float", "sum", -1)
    assert first.out_of_place.time_s == pytest.approx(135.8e-6) and first.in_place.time_s == pytest.approx(123.5e-6)
    assert last.out_of_place.busbw_Bps == 338.82e9 and last.in_place.algbw_Bps == 179.92e9
    assert run.avg_busbw_Bps == pytest.approx(70.742e9)
    assert last.line == 62 and last.out_of_place.wrong == "0"


def test_columns_are_read_where_nccl_tests_puts_them():
    """nccl-tests prints algbw = size / time and busbw = algbw x 2(n-1)/n for allreduce, (n-1)/n for allgather,
    each printed to 0.01 GB/s: the parsed columns must satisfy both on every row of a real log."""
    for path, factor in ((ALLREDUCE, 2 * 15 / 16), (ALLGATHER, 1 / 2)):
        (run,) = read_nccl_tests(str(path))
        for row in run.rows:
            for m in (row.out_of_place, row.in_place):
                assert m is not None
                # both printed to 0.01 GB/s: busbw off by at most half a digit plus factor x half a digit
                assert m.busbw_Bps == pytest.approx(m.algbw_Bps * factor, abs=0.005e9 * (1 + factor) + 1)
                if row.nbytes >= 2**20:
                    assert m.algbw_Bps == pytest.approx(row.nbytes / m.time_s, rel=2e-3, abs=0.006e9)


def test_allgather_from_the_banner_and_tag_output_lines():
    text = ALLGATHER.read_text()
    (run,) = parse_nccl_tests(text, "gb10.log")
    assert (run.collective, run.ranks, run.rows[0].nbytes, run.rows[0].redop) == ("allgather", 2, 16 * 2**30, "none")
    tagged = "".join(f"[1,0]<stdout>:{line}\n" for line in text.splitlines())  # mpirun --tag-output
    assert parse_nccl_tests(tagged, "tagged.log") == [
        type(run)(**{**run.__dict__, "source": "tagged.log"})]


def test_several_runs_in_one_log():
    runs = parse_nccl_tests(ALLREDUCE.read_text() + ALLGATHER.read_text(), "both.log")
    assert [(r.collective, r.ranks, len(r.rows)) for r in runs] == [("allreduce", 16, 31), ("allgather", 2, 1)]


def test_in_place_not_available_is_none():
    text = ALLGATHER.read_text().replace("373792   45.96   22.98       0", "N/A     N/A     N/A     N/A")
    (run,) = parse_nccl_tests(text, "na.log")
    assert run.rows[0].in_place is None and run.rows[0].out_of_place.algbw_Bps == 45.88e9


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace("   24361  176.31", "   24361"), "all.log:61: row: expected 13 columns"),
    (lambda t: t.replace("12646  169.81", "12646  fast"), "all.log:60: algbw: 'fast' is not a number"),
    (lambda t: t.replace("   123.5    0.00", "  -123.5    0.00"), "all.log:32: time: must not be negative, got -123.5"),
    (lambda t: t.replace("all_reduce_perf", "my_benchmark"), "all.log:30: collective: cannot tell which collective"),
    (lambda t: "\n".join(x for x in t.splitlines() if "Rank" not in x), "all.log:14: ranks: no '# Rank N ...' lines"),
    (lambda t: t.split("#       size")[0], "all.log:1: no nccl-tests result table"),
])
def test_malformed_logs_raise_located_errors(edit, message):
    with pytest.raises(InputError) as err:
        parse_nccl_tests(edit(ALLREDUCE.read_text()), "all.log")
    assert message in str(err.value) and "\n" not in str(err.value)
