"""treering plan: the search (against brute force), memory headroom, the best when a target is not met, targets
that name their unit, plan files, what-if notes."""

from __future__ import annotations

import itertools
import json

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.plan.decode import PlanRequest, _Search, memory_lower_bound, plan, tp_candidates
from simulator.run.scenario import DecodeWorkload

PLAN_70B = ["plan", "--model", "llama-3.1-70b", "--context", "4M", "--tbt", "50ms", "--algorithms", "tree"]


def _table(out: str) -> dict[str, list[str]]:
    """Rows of the printed plan by algorithm (header line first, then the table)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["algorithm", "met"])
    return {line.split()[0]: line.split() for line in lines[start + 1:] if line.strip()}


def test_three_nodes_meet_the_target_in_full_device_memory(capsys):
    # a node count that is not a power of two: a search over 1, 2, 4, ... would miss 3 nodes, which fit in 80 GB and
    # meet 50 ms
    assert main([*PLAN_70B, "--mem-fraction", "1"]) == 0
    row = _table(capsys.readouterr().out)["tree"]
    assert row[1:5] == ["True", "3", "24", "8"]
    assert 72 < float(row[6]) <= 80  # fits in 80 GB, but not in 90 % of it
    assert " ".join(row[7:]) == "memory: 2 node(s) do not fit at tp 8"


def test_memory_headroom_is_applied_by_default(capsys):
    assert main(PLAN_70B) == 0
    row = _table(capsys.readouterr().out)["tree"]
    assert row[1:3] == ["True", "4"] and float(row[6]) <= 72  # 0.9 x 80 GB
    assert " ".join(row[7:]) == "memory: 3 node(s) do not fit at tp 8"


def test_the_oom_flag_of_scenarios_uses_mem_fraction(tmp_path):
    # the 3-node point above peaks between 72 and 80 GB: out of memory at the default 0.9, not at 1
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ntopology: dgx-h100\ntopology_params: {nodes: 3}\n"
                    "workload: {kind: decode, model: llama-3.1-70b, scope: model, tp: 8, context: 4M}\n"
                    "algorithms: [tree]\nsweep: {mem_fraction: [0.9, 1.0]}\n")
    assert main(["run", str(path), "-o", str(tmp_path / "o"), "--no-report", "--jobs", "1"]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert list(df["oom"]) == [True, False] and (df["context"] == 4 * 2**20).all()
    assert (df["peak_mem_bytes"] > 72e9).all() and (df["peak_mem_bytes"] <= 80e9).all()


def test_best_configuration_and_floor_when_the_target_is_not_met(capsys):
    assert main([*PLAN_70B[:6], "1ms", "--algorithms", "tree,ring", "--max-nodes", "4"]) == 0
    out = capsys.readouterr().out
    rows = _table(out)
    for algo in ("tree", "ring"):
        assert rows[algo][1] == "False" and rows[algo][2] != "NaN"  # the best configuration is shown
        assert " ".join(rows[algo][7:]).startswith("cannot go below ")
    assert "up to 4 nodes: " in out


def test_best_not_met_is_the_fastest_fitting_configuration():
    req = PlanRequest(model="llama-3.1-8b", context=1 << 20, tbt_s=1e-3, topology="dgx-h100", algorithms=["ring"],
                      max_nodes=3)
    (row,) = plan(req)
    search = _Search(req, None)
    every = [search.evaluate("ring", tp, n) for tp in tp_candidates(8, 32, 8) for n in range(1, 4)]
    fastest = min((e for e in every if e.fits), key=lambda e: e.latency_s)
    assert not row.met and row.best is not None
    assert (row.best.nodes, row.best.tp, row.best.latency_s) == (fastest.nodes, fastest.tp, fastest.latency_s)
    assert row.binding.startswith(f"cannot go below {row.best.latency_s * 1e3:.3g} ms up to 3 nodes: ")


@pytest.mark.parametrize("tbt_s", [4.5e-3, 5e-3, 9e-3])
def test_plan_answers_as_brute_force_does(tbt_s):
    """The smallest GPU count (then the lowest latency) that fits and meets the target, over every tp and node
    count, simulated one by one."""
    req = PlanRequest(model="llama-3.1-8b", context=1 << 20, tbt_s=tbt_s, topology="dgx-h100",
                      algorithms=["tree"], max_nodes=6)
    (row,) = plan(req)
    search = _Search(req, None)
    every = [search.evaluate("tree", tp, n) for tp in tp_candidates(8, 32, 8) for n in range(1, 7)]
    meeting = [e for e in every if e.fits and e.latency_s <= tbt_s]
    assert meeting and row.met and row.best is not None
    best = min(meeting, key=lambda e: (e.gpus, e.latency_s))
    assert (row.best.nodes, row.best.tp) == (best.nodes, best.tp)


def test_tp_candidates_divide_the_node_and_suit_the_heads():
    assert tp_candidates(8, 64, 8) == [1, 2, 4, 8]
    assert tp_candidates(72, 64, 8) == [1, 2, 4, 8]
    assert tp_candidates(12, 24, 6) == [1, 2, 3, 6, 12]  # 6 KV heads: tp 4 neither divides nor is divided by them


def test_memory_lower_bound_never_exceeds_the_simulated_peak():
    req = PlanRequest(model="llama-3.1-8b", context=300_000, tbt_s=1.0, topology="dgx-h100", algorithms=["ring"])
    search = _Search(req, None)
    for tp in (1, 8):
        for nodes in (1, 3):
            point = search.point("ring", tp, nodes)
            assert isinstance(point.scenario.workload, DecodeWorkload)
            bound = memory_lower_bound(point.scenario.workload, tp, 8 * nodes)
            peak = search.evaluate("ring", tp, nodes).peak_mem_bytes
            assert 0.9 * peak < bound <= peak


@pytest.mark.parametrize(("tbt", "message"), [
    ("50", "--tbt: give a unit, e.g. 50ms or 50s, got '50'"),
    ("0.05", "--tbt: give a unit, e.g. 0.05ms or 0.05s"),
    ("fast", "--tbt: cannot parse 'fast' as a time"),
    ("0ms", "--tbt: must be positive"),
])
def test_a_target_must_name_its_unit(tbt, message, capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--context", "1M", "--tbt", tbt]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"treering: error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "gpt-5"], "--model: unknown model preset 'gpt-5'"),
    (["--context", "lots"], "--context: expected a token count such as 1048576, 128K or 1M"),
    (["--mem-fraction", "1.5"], "--mem-fraction: must be in (0, 1], got 1.5"),
    (["--eff-mem", "0"], "--eff-mem: must be in (0, 1], got 0.0"),
    (["--tp", "3"], "--tp: must divide the 8 GPUs per node"),
    (["-o", "/dev/null"], "/dev/null: -o: exists and is not a folder (a report folder), a .csv or a .json"),
    (["--algorithms", "tree,nope"], "--algorithms: unknown algorithm 'nope'; valid: ring"),
    (["--dtype", "fp9"], "--dtype: must be one of"),
    (["--topology", "nope"], "--topology: unknown topology preset 'nope'"),
    (["--set", "devices.x.eff_mem=0.5"], "--set: devices.x: no device of topology 'dgx-h100' uses spec 'x'"),
])
def test_plan_errors(args, message, capsys):
    base = {"--model": "llama-3.1-8b", "--context": "1M", "--tbt": "50ms"}
    extra = []
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag in base:
            base[flag] = value
        else:
            extra += [flag, value]
    assert main(["plan", *[x for kv in base.items() for x in kv], *extra]) == 2
    assert capsys.readouterr().err.startswith(f"treering: error: {message}")


def test_plan_writes_csv_and_json(tmp_path, capsys):
    common = ["plan", "--model", "llama-3.2-1b", "--context", "128K", "--tbt", "20ms", "--algorithms", "tree,ring",
              "--max-nodes", "2"]
    assert main([*common, "-o", str(tmp_path / "plan.csv")]) == 0
    assert main([*common, "-o", str(tmp_path / "plan.json")]) == 0
    csv = pd.read_csv(tmp_path / "plan.csv")
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert list(csv["algorithm"]) == ["tree", "ring"] and csv["met"].all()
    assert doc["request"]["context"] == 131072 and doc["request"]["mem_fraction"] == 0.9
    assert [r["nodes"] for r in doc["rows"]] == list(csv["nodes"])
    assert {"binding", "bottleneck", "usable_mem_GB", "evaluated"} <= set(csv.columns)
    assert main([*common, "-o", str(tmp_path / "report")]) == 0  # a folder: the plan's report
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Conclusion" in md and "tree" in md
    assert list(pd.read_csv(tmp_path / "report" / "plan.csv")["algorithm"]) == ["tree", "ring"]


def test_efficiencies_on_plan_change_the_answer():
    req = PlanRequest(model="llama-3.2-1b", context=1 << 16, tbt_s=1.0, topology="dgx-h100", algorithms=["tree"],
                      tp=8, max_nodes=1)
    slow = plan(PlanRequest(**{**req.__dict__, "eff_mem": 0.5}))[0].best
    fast = plan(PlanRequest(**{**req.__dict__, "eff_mem": 1.0}))[0].best
    assert slow is not None and fast is not None
    # the LM head is one memory-bound kernel: launch (3 us) + bytes / (bandwidth x eff_mem)
    assert slow.head_s - 3e-6 == pytest.approx(2 * (fast.head_s - 3e-6), rel=1e-9)
    assert slow.latency_s > fast.latency_s


def test_a_nic_upgrade_capped_by_pcie_is_reported(capsys):
    assert main(["plan", "--model", "llama-3.2-1b", "--context", "128K", "--tbt", "20ms", "--algorithms", "tree",
                 "--max-nodes", "1", "--set", "topology_params.nic_bandwidth=800Gb/s"]) == 0
    err = capsys.readouterr().err
    assert ("treering: note: --set topology_params.nic_bandwidth=800Gb/s is capped by a slower link: GPU -> GPU "
            "across nodes") in err
    assert "pcie (gpu-nic) 64 GB/s caps net (nic-switch) 100 GB/s" in err


def test_a_what_if_in_run_that_changes_no_route_says_so(tmp_path, capsys):
    # one node: the NICs carry nothing
    out = tmp_path / "o"
    assert main(["run", "--set", "topology_params.nic_bandwidth=800Gb/s", "--set", "workload.context=4096",
                 "-o", str(out), "--no-report", "--jobs", "1"]) == 0
    assert ("note: --set topology_params.nic_bandwidth=800Gb/s makes no GPU-to-GPU route of dgx-h100 faster or "
            "slower") in capsys.readouterr().err


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"]), st.sampled_from([1, 2, 4, 8]),
       st.integers(1, 2**24))
def test_memory_lower_bound_never_grows_with_the_node_count(model, tp, context):
    point = _Search(PlanRequest(model=model, context=context, tbt_s=1.0, topology="dgx-h100", algorithms=["tree"]),
                    None).point("tree", tp, 1)
    wl = point.scenario.workload
    assert isinstance(wl, DecodeWorkload)
    bounds = [memory_lower_bound(wl, tp, 8 * n) for n in range(1, 65)]
    assert all(a >= b for a, b in itertools.pairwise(bounds))
    assert bounds[-1] >= wl.model_preset().params / tp * 2  # the weights stay


def test_progress_reports_each_simulated_configuration():
    lines: list[str] = []
    req = PlanRequest(model="llama-3.2-1b", context=1 << 16, tbt_s=1.0, topology="dgx-h100", algorithms=["tree"],
                      tp=8, max_nodes=2)
    (row,) = plan(req, progress=lines.append)
    assert lines == ["tree: tp 8, 1 node(s) (1 simulated)"] and row.evaluated == 1 and row.met


def test_single_on_a_whole_model_runs_on_one_gpu_of_each_head_group(capsys):
    """plan --algorithms single on dgx-a100 crashed in the step's composition (one rank placed on eight)."""
    args = ["plan", "--model", "llama-3.2-1b", "--context", "128K", "--tbt", "1s", "--max-nodes", "2", "--topology",
            "dgx-a100", "--algorithms", "single"]
    assert main(args) == 0
    assert _table(capsys.readouterr().out)["single"][1] == "True"
    for tp in (1, 2):
        (row,) = plan(PlanRequest(model="llama-3.2-1b", context=1 << 17, tbt_s=1.0, topology="dgx-a100",
                                  algorithms=["single"], tp=tp, max_nodes=1))
        assert row.best is not None and row.best.tp == tp and row.best.gpus == 8
    wl_kv = memory_lower_bound(DecodeWorkload(kind="decode", model="llama-3.2-1b", scope="model", context=1 << 17),
                               1, 1)
    step = _Search(PlanRequest(model="llama-3.2-1b", context=1 << 17, tbt_s=1.0, topology="dgx-a100",
                               algorithms=["single"], tp=1, max_nodes=1), None).evaluate("single", 1, 1)
    assert step.peak_mem_bytes >= wl_kv  # the whole KV cache on the one GPU that attends
