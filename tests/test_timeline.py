"""The report's per-rank timeline and the trace stay bounded by what they show, and say what they left out."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from simulator.algorithms import build_schedule, resolve
from simulator.cli import main
from simulator.cluster.topology import load_topology
from simulator.engine.core import simulate
from simulator.report.timeline import MAX_RANKS, bound_timeline, gantt, shown_ranks, timeline_frame
from simulator.report.trace import parse_ranks, parse_window
from simulator.run.prepared import layout_of
from simulator.support.paths import DEFAULT_SCENARIO
from simulator.workloads.shape import DecodeShape


def _frame(rows):
    cols = ["algorithm", "rank", "kind", "name", "start_s", "end_s", "bytes"]
    return pd.DataFrame(rows, columns=cols).assign(ops=1, critical=False, ranks_total=2)


def test_shown_ranks_are_all_or_the_critical_one_and_a_sample():
    assert shown_ranks(16, 3) == list(range(16))
    shown = shown_ranks(1024, 517)
    assert len(shown) == MAX_RANKS and {0, 517, 1023} <= set(shown) and shown == sorted(set(shown))


def test_back_to_back_ops_of_one_kind_merge_into_one_bar():
    frame = _frame([
        ("ring", 0, "compute", "a0", 0.0, 1.0, 10.0), ("ring", 0, "compute", "a1", 1.0, 2.0, 20.0),
        ("ring", 0, "compute", "a2", 3.0, 4.0, 30.0),  # a gap of 1 s: a bar of its own
        ("ring", 0, "send", "s0", 1.0, 2.0, 5.0),  # another kind: not merged with the compute
        ("ring", 1, "compute", "b0", 2.0, 3.0, 1.0),  # another rank
    ])
    out = bound_timeline(frame)
    compute0 = out[(out["rank"] == 0) & (out["kind"] == "compute")].sort_values("start_s")
    assert compute0[["start_s", "end_s", "ops", "bytes"]].values.tolist() == [[0.0, 2.0, 2, 30.0],
                                                                               [3.0, 4.0, 1, 30.0]]
    assert len(out) == 4 and out["ops"].sum() == len(frame)
    # a gap under makespan / resolution is under a pixel: merged too
    assert len(bound_timeline(frame, resolution=2)[lambda d: (d["rank"] == 0) & (d["kind"] == "compute")]) == 1


@pytest.fixture(scope="module")
def ring32():
    cluster = load_topology("dgx-h100", {"nodes": 4})
    shape = DecodeShape(batch=1, heads=16, head_dim=128, kv_heads=16, context=64_000, dtype="bf16")
    name, params = resolve("ring")
    sched = build_schedule(name, params, shape, layout_of(cluster))
    return sched, simulate(sched, cluster)


def test_timeline_frame_shows_the_critical_rank_and_a_sample_and_counts_every_op_of_them(ring32):
    sched, result = ring32
    frame = timeline_frame([("ring", sched, result)])
    shown = sorted(frame["rank"].unique())
    critical = result.critical_rank()
    assert shown == shown_ranks(32, critical) and len(shown) < 32
    assert set(frame.loc[frame["critical"], "rank"]) == {critical}
    assert frame["ops"].sum() == sum(1 for op in sched.ops if op.rank in set(shown))
    assert frame["end_s"].max() == max(r.end for r in result.timeline if r.rank in set(shown))
    fig = gantt(frame)
    title = fig.axes[0].get_title()
    plt.close(fig)
    assert f"of 32 ranks; critical rank {critical} (*)" in title and "ops in" in title


def test_a_timeline_of_an_older_version_is_bounded_on_reading():
    old = pd.DataFrame({"algorithm": "ring", "rank": list(range(40)) * 2, "kind": "compute", "name": "x",
                        "start_s": [0.0] * 40 + [1.0] * 40, "end_s": [1.0] * 40 + [2.0] * 40, "bytes": 1.0})
    fig = gantt(old)
    title = fig.axes[0].get_title()
    plt.close(fig)
    assert title.startswith("ring: 16 of 40 ranks") and title.endswith("32 ops in 16 bars")


def test_trace_limits_say_what_they_left_out(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert main(["trace", str(DEFAULT_SCENARIO), "--point", "2", "-o", str(path), "--ranks", "0-1,5",
                 "--window", "0:0.2ms"]) == 0
    out = capsys.readouterr().out
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    shown = {int(names[e["pid"]].split(": rank ")[1].split()[0]) for e in spans}  # "ring: rank 5 (n0.gpu5)"
    assert shown == {0, 1, 5}
    assert all(e["ts"] <= 200.0 for e in spans)
    cut = trace["otherData"]["left_out"]
    assert cut["ranks"] == {"ring": [13, 16], "tree": [13, 16]} and cut["ops"] > 0
    assert "left out: ranks (ring 13 of 16, tree 13 of 16; " in out and "ops outside --window" in out


def test_trace_limit_errors(tmp_path, capsys):
    path = str(tmp_path / "t.json")
    assert main(["trace", str(DEFAULT_SCENARIO), "-o", path, "--ranks", "0-99"]) == 2
    assert "--ranks: rank 99 is out of range: the point has 8 ranks (0-7)" in capsys.readouterr().err
    assert main(["trace", str(DEFAULT_SCENARIO), "-o", path, "--window", "2ms:1ms"]) == 2
    assert "--window: the window must end after it starts" in capsys.readouterr().err
    assert parse_ranks("3,0-2,3") == [3, 0, 1, 2]
    assert parse_window("1.5ms:") == (0.0015, float("inf"))
