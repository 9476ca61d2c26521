"""treering plan SCENARIO --ttft [--tbt]: answers checked against the scenario's own simulated figures at two
cluster sizes, the unreachable case, memory respected, the reproduce command, bad input located."""

from __future__ import annotations

import itertools
import json
import shlex
from pathlib import Path

import pytest
import yaml

from simulator.cli import main
from simulator.plan.ttft import LAYOUTS, TtftRequest, plan_ttft
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
