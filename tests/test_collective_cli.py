"""The collective workload end to end: nccl-tests columns, bus factors, the report, located errors."""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest

from simulator.cli import main
from simulator.run.kinds import KINDS
from simulator.run.rows import names

COLLECTIVE_COLUMNS = names(KINDS["collective"].columns)

COLL = """
name: c
topology: dgx-h100
topology_params: {nodes: 1}
workload: {kind: collective, collective: allreduce, bytes: 1 MiB, dtype: bf16}
algorithms: [auto, ring, {name: ring, protocol: LL128, channels: 2}]
sweep:
  workload.bytes: [64 KiB, 16 MiB]
"""


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


FACTORS = {"allreduce": 2 * 7 / 8, "allgather": 7 / 8, "reduce-scatter": 7 / 8, "alltoall": 7 / 8, "broadcast": 1.0,
           "reduce": 1.0}


def test_rows_carry_nccl_tests_columns_and_bus_factors(tmp_path, capsys):
    text = COLL.replace("workload.bytes: [64 KiB, 16 MiB]",
                        f"workload.bytes: [64 KiB, 16 MiB]\n  workload.collective: [{', '.join(FACTORS)}]")
    assert main(["run", str(write(tmp_path, text)), "-o", str(tmp_path / "o")]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert list(df.columns[: len(COLLECTIVE_COLUMNS)]) == list(COLLECTIVE_COLUMNS)
    assert set(df["collective"]) == set(FACTORS) and set(df["bytes"]) == {64 * 1024, 16 * 1024 * 1024}
    assert (df["algbw_GBps"] * 1e9 * df["time_s"] - df["bytes"]).abs().max() < 1e-3
    factor = df["collective"].map(FACTORS)
    assert ((df["busbw_GBps"] - df["algbw_GBps"] * factor).abs() < 1e-9).all()
    assert (tmp_path / "o" / "busbw.png").exists()
    fixed = df[df["algorithm"] == "ring[protocol=LL128,channels=2]"]
    assert set(fixed["protocol"]) == {"LL128"} and set(fixed["channels"]) == {2}
    assert set(df[df["collective"] == "alltoall"]["chosen"].str.split("/").str[0]) == {"pairwise"}
    small = df[(df["algorithm"] == "auto") & (df["bytes"] == 64 * 1024) & (df["collective"] == "allreduce")]
    assert small.iloc[0]["chosen"] == "ring/LL"  # inside one node, small: NCCL's ring with LL


@pytest.mark.parametrize(("change", "expected"), [
    (("collective: allreduce", "collective: allsum"),
     "c.yaml:4: workload.collective: unknown collective 'allsum'; valid: allreduce, allgather"),
    (("bytes: 1 MiB", "bytes: 0"), "c.yaml:4: workload.bytes: must be positive, got 0"),
    (("bytes: 1 MiB", "bytes: -5"), "c.yaml:4: workload.bytes: must not be negative, got -5"),
    (("[auto, ring,", "[auto, rign,"), "c.yaml:5: algorithms.1: unknown collective algorithm 'rign'; valid: auto"),
    (("protocol: LL128", "protocol: LL64"), "c.yaml:5: algorithms.2.protocol: must be one of auto, LL, LL128"),
    (("channels: 2", "channels: 0"), "c.yaml:5: algorithms.2.channels: must be a positive integer, got 0"),
    (("collective: allreduce", "collective: allgather"),
     "c.yaml:5: algorithms.2: allgather has no algorithm 'tree'; valid: auto, ring"),
    (("[auto, ring,", "[auto, nvls,"), "c.yaml:5: algorithms.1: nvls needs one NVSwitch server with NVLink SHARP"),
])
def test_collective_errors_are_located(change, expected, tmp_path, capsys):
    text = COLL.replace(*change)
    if "nvls" in change[1]:
        text = text.replace("topology_params: {nodes: 1}", "topology_params: {nodes: 2}")
    if "allgather" in change[1]:
        text = text.replace("{name: ring, protocol: LL128, channels: 2}", "tree")
    assert main(["run", str(write(tmp_path, text)), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"treering: error: {tmp_path}/{expected}"), err
