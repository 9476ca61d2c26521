"""treering plan SCENARIO --ttft [--tbt]: answers checked against the scenario's own simulated figures at two
cluster sizes, the unreachable case, memory respected, the reproduce command, bad input located."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shlex
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.plan.cli import _write as _write_plan
from simulator.plan.cli import ttft_frame
from simulator.plan.decode import Evaluation, PlanRequest
from simulator.plan.decode import _row as decode_row
from simulator.plan.ttft import LAYOUTS, Config, TtftPlan, TtftRequest, plan_ttft
from simulator.plan.verdict import Targets, binding
from simulator.run.prepare import run_point
from simulator.run.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
PREFILL = {"name": "ttft", "topology": "dgx-h100", "topology_params": {"nodes": 1},
           "workload": {"kind": "prefill", "model": "llama-3.2-1b", "scope": "model", "sequence": "128K",
                        "layout": "zigzag"},
           "algorithms": ["ring", "allgather", "ulysses"]}
GENERATE = {"name": "gen", "topology": "dgx-h100", "topology_params": {"nodes": 1},
            "workload": {"kind": "generate", "model": "llama-3.2-1b", "scope": "model", "prompt": "16K",
                         "new_tokens": 2, "prefill": "ring", "layout": "zigzag"},
            "algorithms": ["ring", "tree"]}


def _write(tmp_path: Path, tree: dict, name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return str(path)


def _ttft(path: str, nodes: int, strategy: str, layout: str) -> float:
    point = load_scenario(path, [f"topology_params.nodes={nodes}", f"workload.layout={layout}",
                                 f"algorithms=[{strategy}]"])[0]
    return run_point(point)[0]["latency_s"]


@pytest.fixture(scope="module")
def prefill_figures(tmp_path_factory):
    """(scenario path, {(nodes, strategy, layout): simulated TTFT}) at 1 and 2 nodes, with treering run's path."""
    path = _write(tmp_path_factory.mktemp("ttft"), PREFILL)
    figures = {(n, s, lay): _ttft(path, n, s, lay)
               for n, s, lay in itertools.product((1, 2), PREFILL["algorithms"], LAYOUTS)}
    return path, figures


def test_target_between_two_cluster_sizes_picks_the_larger_and_its_fastest_strategy(prefill_figures):
    path, figures = prefill_figures
    one = min(v for (n, _, _), v in figures.items() if n == 1)
    two = min(v for (n, _, _), v in figures.items() if n == 2)
    assert two < one
    result = plan_ttft(TtftRequest(path, ttft_s=(one + two) / 2, tp=1, max_nodes=2))
    best = result.rows[0]
    assert result.met and (best.nodes, best.gpus, best.tp) == (2, 16, 1)
    assert best.ttft_s == two == figures[(2, best.strategy, best.layout)]
    runner = result.rows[1]  # the best of another strategy on the same cluster
    assert runner.strategy != best.strategy and runner.nodes == 2
    assert runner.ttft_s == min(v for (n, s, _), v in figures.items() if n == 2 and s == runner.strategy)
    assert result.binding.startswith(f"ttft: 1 node(s) take at least {one * 1e3:.3g} ms")


def test_a_target_one_node_meets_says_so(prefill_figures):
    path, figures = prefill_figures
    one = min(v for (n, _, _), v in figures.items() if n == 1)
    result = plan_ttft(TtftRequest(path, ttft_s=one * 1.001, tp=1, max_nodes=2))
    assert result.met and result.rows[0].nodes == 1 and result.rows[0].ttft_s == one
    assert result.binding == "none: one node is enough"


def test_unreachable_target_shows_the_lowest_ttft_and_exits_0(prefill_figures, capsys):
    path, figures = prefill_figures
    assert main(["plan", path, "--ttft", "1us", "--tp", "1", "--max-nodes", "2"]) == 0
    out = capsys.readouterr().out
    lowest = min(figures.values())
    assert "not met; the lowest TTFT: " in out and f"TTFT {lowest * 1e3:.3g} ms" in out
    assert f"binding: cannot go below a TTFT of {lowest * 1e3:.3g} ms up to 2 nodes" in out


def test_the_reproduce_command_gives_the_planned_figures(tmp_path, capsys):
    path = _write(tmp_path, GENERATE)
    assert main(["plan", path, "--ttft", "10s", "--tbt", "1s", "--max-nodes", "1"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("reproduce: "))
    argv = shlex.split(line.removeprefix("reproduce: "))
    assert argv[:3] == ["treering", "run", path]
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    result = plan_ttft(TtftRequest(path, ttft_s=10.0, tbt_s=1.0, max_nodes=1))
    best = result.rows[0]
    rows = {r["algorithm"]: r for r in run_point(load_scenario(path, sets)[0])}
    assert rows[best.decode]["ttft_s"] == best.ttft_s and rows[best.decode]["tpot_s"] == best.tpot_s
    assert best.tpot_s == min(r["tpot_s"] for r in rows.values())


def test_memory_is_respected_70b_needs_tensor_parallelism(tmp_path):
    tree = {**PREFILL, "workload": {**PREFILL["workload"], "model": "llama-3.1-70b", "sequence": "8K"}}
    path = _write(tmp_path, tree)
    alone = run_point(load_scenario(path, ["workload.tp=1", "algorithms=[ring]"])[0])[0]
    assert alone["oom"] and alone["peak_mem_bytes"] > 70.6e9 * 2  # bf16 weights on one GPU
    result = plan_ttft(TtftRequest(path, ttft_s=100.0, max_nodes=1))
    best = result.rows[0]
    assert result.met and best.tp >= 2 and best.fits and best.peak_mem_bytes <= best.usable_mem_bytes


def test_tbt_binds_when_decode_is_too_slow(tmp_path):
    path = _write(tmp_path, GENERATE)
    slow = plan_ttft(TtftRequest(path, ttft_s=100.0, tbt_s=1e-9, tp=1, max_nodes=1))
    assert not slow.met and "the lowest TPOT is" in slow.binding


@pytest.mark.parametrize(("extra", "message"), [
    (["--ttft=-1s"], "treering: error: --ttft: must be positive"),
    (["--ttft", "2"], "treering: error: --ttft: give a unit"),
    (["--ttft", "2s", "--tbt", "0ms"], "treering: error: --tbt: must be positive"),
    (["--ttft", "2s", "--model", "llama-3.1-8b"], "treering: error: --model: the scenario sets it"),
    (["--ttft", "2s", "--tp", "3"], "treering: error: --tp: must divide the 8 GPUs per node and suit the model's 32 "
                                    "heads and 8 KV heads; candidates: 1, 2, 4, 8"),
    (["--ttft", "2s", "--mem-fraction", "1"], "treering: error: --mem-fraction: the scenario sets it (change it with "
                                              "--set mem_fraction=F)"),
])
def test_bad_targets_exit_2_located(tmp_path, capsys, extra, message):
    path = _write(tmp_path, GENERATE)
    assert main(["plan", path, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_ttft_on_a_decode_workload_exits_2_at_its_kind(capsys):
    path = ROOT / "scenarios" / "quickstart.yaml"
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "kind:" in text)
    assert main(["plan", str(path), "--ttft", "2s"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"treering: error: {path}:{line}: workload.kind: --ttft plans prefill and generate "
                          "workloads, not decode")


def test_a_prompt_no_cluster_can_split_is_refused_located(tmp_path, capsys):
    path = _write(tmp_path, {**GENERATE, "workload": {**GENERATE["workload"], "prompt": 4}})
    assert main(["plan", path, "--ttft", "2s", "--max-nodes", "1", "--tp", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"treering: error: {path}:") and "workload.prompt: the prompt (4 tokens) must have" in err


def test_ttft_needs_a_scenario_and_tbt_a_generate_workload(tmp_path, capsys):
    assert main(["plan", "--ttft", "2s"]) == 2
    assert capsys.readouterr().err.startswith("treering: error: --ttft: needs a prefill or generate scenario")
    assert main(["plan", _write(tmp_path, PREFILL), "--ttft", "2s", "--tbt", "50ms"]) == 2
    assert capsys.readouterr().err.startswith("treering: error: --tbt: a prefill workload has no tokens to decode")
    assert main(["plan", "--model", "llama-3.1-8b", "--context", "1M"]) == 2
    assert capsys.readouterr().err.startswith("treering: error: --tbt: required")


def test_plan_files_json_and_report(tmp_path, capsys):
    path = _write(tmp_path, GENERATE)
    args = ["plan", path, "--ttft", "10s", "--tbt", "1s", "--max-nodes", "1", "--tp", "1"]
    assert main([*args, "-o", str(tmp_path / "p.json")]) == 0
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["met"] and doc["rows"][0]["met"] and doc["rows"][0]["nodes"] == 1
    assert doc["reproduce"][:3] == ["treering", "run", path] and doc["request"]["ttft_s"] == 10.0
    assert main([*args, "-o", str(tmp_path / "rep")]) == 0
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "target: 10 s to first token and 1000 ms between tokens" in report
    assert "Smallest configuration that meets a time to first token of 10 s" in report


# -- verdicts: every row judged from the targets and its own values -------------------------------------------------

def _config(strategy: str, ttft_s: float, tpot_s: float, oom: bool = False) -> Config:
    return Config(5, 40, 4, strategy, "zigzag", ttft_s, 4.17, 39.06e9, 72e9, oom, "tree", tpot_s)


def test_a_runner_up_within_both_targets_is_met_in_the_table_and_the_json(tmp_path):
    """plan-ttft.yaml --ttft 5s --tbt 20ms: the allgather row (TTFT 4.793 s, TPOT 18.97 ms) meets both targets."""
    targets = Targets(ttft_s=5.0, tbt_s=0.020)
    result = TtftPlan([_config("ring", 4.406, 0.01897), _config("allgather", 4.793, 0.01897)], "ttft: ...", 156,
                      "generate", ["treering", "run", "s.yaml"], "llama-3.1-70b", "dgx-h100", targets)
    assert result.met and list(ttft_frame(result)["met"]) == [True, True]
    args = argparse.Namespace(argv=["plan"])
    _write_plan(tmp_path / "x.json", ttft_frame(result), result, TtftRequest("s.yaml", 5.0, 0.020), args)
    assert [row["met"] for row in json.loads((tmp_path / "x.json").read_text())["rows"]] == [True, True]


_TIMES = st.one_of(st.floats(1e-6, 100.0), st.just(math.nan))


@given(rows=st.lists(st.tuples(_TIMES, _TIMES, st.booleans()), min_size=1, max_size=5),
       ttft=st.floats(1e-6, 100.0), tbt=st.one_of(st.none(), st.floats(1e-6, 100.0)))
@settings(max_examples=200, deadline=None)
def test_met_iff_every_target_is_met_and_it_fits(rows, ttft, tbt):
    configs = [_config(f"s{i}", a, b, oom) for i, (a, b, oom) in enumerate(rows)]
    result = TtftPlan(configs, "", 1, "generate", [], targets=Targets(ttft_s=ttft, tbt_s=tbt))
    expected = [not c.oom and c.ttft_s <= ttft and (tbt is None or c.tpot_s <= tbt) for c in configs]
    assert list(ttft_frame(result)["met"]) == expected
    assert result.met == expected[0]
    bound = binding(result.targets, [c.values for c in configs])
    assert (bound is None) == any(expected)
    if bound == "memory":
        assert all(c.oom for c in configs)


@given(evs=st.lists(st.tuples(st.floats(1e-6, 1.0), st.booleans(), st.integers(1, 8)), max_size=6),
       tbt=st.floats(1e-6, 1.0))
@settings(max_examples=200, deadline=None)
def test_decode_plan_rows_met_iff_a_configuration_fits_within_the_target(evs, tbt):
    found = [Evaluation("ring", n, 8 * n, 8, lat, 1e9, 72e9, oom, 0.0, 0.0, 0.0, 0.0, "nvlink")
             for lat, oom, n in evs]
    req = PlanRequest("llama-3.1-8b", 1024, tbt, "dgx-h100", ["ring"])
    row = decode_row("ring", found, {}, req, len(found))
    assert row.met == any(not e.oom and e.latency_s <= tbt for e in found)
    assert row.met == (row.best is not None and row.best.meets(req.targets))
