"""Refused before any work, and nothing replaced on refusal: every output path and the output folder's lock before
preparation; disk errors that name the file; resumes and reports that trust only whole results; every count bounded
before work (with the estimate and --force); unknown keys named with the closest valid one; the resolved values
of a run said in its header and kept in meta.json; one progress line for both plans."""

from __future__ import annotations

import errno
import json
import pathlib
import time
from pathlib import Path

import pandas as pd
import pytest

import simulator.plan.cli as plan_cli
import simulator.run.commands as run_commands
from simulator.cli import main
from simulator.errors import InputError
from simulator.run.prepare import prepare_point
from simulator.run.scenario import load_scenario
from simulator.support.outdir import LOCK_FILE, output_lock
from simulator.support.progress import progress_line

ROOT = Path(__file__).resolve().parent.parent

DECODE = """\
name: t
topology: dgx-h100
topology_params: {nodes: 1}
workload: {kind: decode, model: {heads: 8, head_dim: 64}, context: %s}
algorithms: [ring, tree]
"""
SWEEP = DECODE % "1000" + "sweep: {topology_params.nodes: [1, 2], workload.context: [1000, 2000, 3000]}\n"
COLLECTIVE = """\
name: c
topology: dgx-h100
topology_params: {nodes: 1}
workload: {kind: collective, collective: allreduce, bytes: 1 MiB}
algorithms: [ring]
"""
GENERATE = """\
name: g
topology: dgx-h100
topology_params: {nodes: 1}
workload: {kind: generate, model: llama-3.1-8b, prompt: 32K, new_tokens: 100000}
algorithms: [ring, tree]
"""


def _write(tmp_path: Path, text: str, name: str = "s.yaml") -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("treering: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _no_work(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{name} ran before the refusal")

    monkeypatch.setattr(module, name, fail)


# -- refuse before working ---------------------------------------------------------------------------------------

def test_a_plan_into_a_path_under_a_file_is_refused_before_it_simulates(tmp_path, capsys, monkeypatch):
    """plan ... -o afile/plan.csv simulated for a minute, printed the table, then failed with a bare File exists."""
    (tmp_path / "afile").write_text("mine\n")
    _no_work(monkeypatch, plan_cli, "plan_ttft")
    _no_work(monkeypatch, plan_cli, "plan")
    args = ["--ttft", "5s", "--tbt", "20ms", "--max-nodes", "16", "-o", str(tmp_path / "afile" / "plan.csv")]
    assert main(["plan", str(ROOT / "scenarios" / "plan-ttft.yaml"), *args]) == 2
    assert _error(capsys) == f"treering: error: {tmp_path / 'afile'}: -o: is not a folder"
    assert main(["plan", "--model", "llama-3.2-1b", "--context", "8K", "--tbt", "1s", "-o",
                 str(tmp_path / "afile" / "plan.json")]) == 2
    assert "is not a folder" in _error(capsys)
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_a_second_run_into_a_busy_folder_is_refused_before_any_preparation(tmp_path, capsys, monkeypatch):
    """Two runs into the same -o: the second was refused only after its preparation, or ran after the first and
    replaced its rows."""
    path = _write(tmp_path, SWEEP)
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("point\n0\n")
    _no_work(monkeypatch, run_commands, "check_points")
    with output_lock(out):  # the first run, still working
        start = time.monotonic()
        assert main(["run", path, "-o", str(out), "--jobs", "1"]) == 2
        assert time.monotonic() - start < 5
    assert "another treering command is writing to this folder" in _error(capsys)
    assert (out / "results.csv").read_text() == "point\n0\n"


def test_a_run_refused_in_preparation_leaves_no_folder_behind(tmp_path, capsys):
    path = _write(tmp_path, DECODE % "1000" + "baseline: nope\n")
    assert main(["run", path, "-o", str(tmp_path / "new"), "--jobs", "1"]) == 2
    assert "baseline: must be one of the algorithms" in _error(capsys)
    assert not (tmp_path / "new").exists()


def test_a_full_disk_names_the_file_and_keeps_the_earlier_results(tmp_path, capsys, monkeypatch):
    path = _write(tmp_path, DECODE % "1000")
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("earlier\n")
    real = pathlib.Path.write_text

    def full(self: Path, *args: object, **kwargs: object) -> int:
        if self.name.endswith(".tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    assert main(["run", path, "-o", str(out), "--jobs", "1"]) == 2
    assert _error(capsys) == f"treering: error: {out / 'results.csv'}: No space left on device"
    assert (out / "results.csv").read_text() == "earlier\n"
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == []


# -- resume and report trust only whole results -----------------------------------------------------------------

def test_resume_drops_duplicated_point_rows_and_says_so(tmp_path, capsys):
    """A results.csv with duplicated rows (17 for a 12-row sweep) was kept as it was by --resume."""
    path = _write(tmp_path, SWEEP)
    out = tmp_path / "out"
    assert main(["run", path, "-o", str(out), "--jobs", "1", "--no-report"]) == 0
    frame = pd.read_csv(out / "results.csv")
    assert len(frame) == 12
    pd.concat([frame, frame.head(5)]).to_csv(out / "results.csv", index=False)
    capsys.readouterr()
    assert main(["run", path, "-o", str(out), "--jobs", "1", "--no-report", "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"treering: note: {out / 'results.csv'}: dropped 5 duplicated row(s) of point(s) 0, 1, 2" in err
    again = pd.read_csv(out / "results.csv")
    assert len(again) == 12 and not again.duplicated(["point", "algorithm"]).any()


def test_report_of_a_results_file_without_rows_is_refused(tmp_path, capsys):
    header = "scenario,algorithm,context,ranks,latency_s,peak_mem_bytes,bytes_moved,point\n"
    (tmp_path / "results.csv").write_text(header)
    assert main(["report", str(tmp_path / "results.csv")]) == 2
    assert _error(capsys) == (f"treering: error: {tmp_path / 'results.csv'}:2: has no result rows (a header only): "
                              "nothing to report; run the scenario again")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != LOCK_FILE) == ["results.csv"]


# -- every count bounded before work ------------------------------------------------------------------------------

def _prepare(tmp_path: Path, text: str, sets: list[str], force: bool = False) -> None:
    prepare_point(load_scenario(_write(tmp_path, text), sets, force)[0])


def test_generate_steps_are_bounded_with_the_estimate(tmp_path):
    """new_tokens: 100000 ran for minutes (1,000 take 8 s)."""
    with pytest.raises(InputError, match=r"workload\.new_tokens: 100,000 decode steps x 2 schedule\(s\) on 8 GPUs "
                                         r"would simulate about 2\.42e\+08 ops \(limit 20,000,000; about 12 min\); "
                                         r"--force runs it anyway"):
        _prepare(tmp_path, GENERATE, [])
    _prepare(tmp_path, GENERATE, [], force=True)
    _prepare(tmp_path, GENERATE, ["workload.new_tokens=1000"])


@pytest.mark.parametrize("channels", ["100000", "1" + "0" * 30])
def test_collective_channels_are_at_most_nccls(tmp_path, channels):
    with pytest.raises(InputError, match=r"algorithms\.0\.channels: must be at most 64 \(NCCL's MAXCHANNELS\)"):
        _prepare(tmp_path, COLLECTIVE, [f"algorithms=[{{name: ring, channels: {channels}}}]"])


def test_a_collective_on_a_thousand_nodes_is_refused_with_its_size(tmp_path):
    sets = ["topology=hgx-h200", "topology_params.nodes=1000"]
    with pytest.raises(InputError, match=r"algorithms\.0: the ring allreduce on 8,000 GPUs x 1 channel\(s\) would "
                                         r"have too many ops: about 3\.2e\+08 .*--force runs it anyway"):
        _prepare(tmp_path, COLLECTIVE, sets)


def test_collective_bytes_fit_the_results_integers(tmp_path, capsys):
    """bytes: 2**64 simulated, then failed writing Parquet and kept nothing."""
    path = _write(tmp_path, COLLECTIVE)
    assert main(["run", path, "-o", str(tmp_path / "out"), "--set", f"workload.bytes={2**64}"]) == 2
    assert "workload.bytes: must be at most 2^53 bytes (9.01 PB), got 18446744073709551616" in _error(capsys)


def test_a_ttft_plan_of_a_million_nodes_is_refused_at_once(capsys, monkeypatch):
    _no_work(monkeypatch, plan_cli.plan_ttft.__globals__["Search"], "at")
    start = time.monotonic()
    assert main(["plan", str(ROOT / "scenarios" / "plan-ttft.yaml"), "--ttft", "1e-30 s", "--max-nodes",
                 "1000000"]) == 2
    assert time.monotonic() - start < 10
    assert _error(capsys).startswith("treering: error: --max-nodes: 1,000,000 nodes of dgx-h100 would have too many "
                                     "nodes and links")


# -- small things users hit -----------------------------------------------------------------------------------------

def test_an_unknown_key_is_named_with_the_closest_valid_one(tmp_path, capsys):
    """contxt: reported only "context: required field is missing"."""
    path = _write(tmp_path, DECODE.replace("context: %s", "contxt: 80k"))
    assert main(["run", path, "-o", str(tmp_path / "out")]) == 2
    assert _error(capsys) == f"treering: error: {path}:4: workload.contxt: unknown key; did you mean context?"
    assert main(["run", _write(tmp_path, DECODE % "1K", "d.yaml"), "-o", str(tmp_path / "out"), "--set",
                 "devices={h100-sxm: {eff_mm: 0.5}}"]) == 2
    assert _error(capsys).endswith("devices.h100-sxm.eff_mm: unknown key; did you mean eff_mem?")


def test_an_explicit_topology_needs_only_set_topology(tmp_path, capsys):
    """--set topology=FILE also needed --set 'topology_params={}' (the scenario's were its preset's)."""
    topo = tmp_path / "two.yaml"
    topo.write_text("name: two\nnodes:\n  - {name: g0, kind: gpu, device: h100-sxm}\n"
                    "  - {name: g1, kind: gpu, device: h100-sxm}\n  - {name: s, kind: switch}\n"
                    "links:\n  - {a: g0, b: s, bandwidth: 450 GB/s, latency: 0.5 us}\n"
                    "  - {a: g1, b: s, bandwidth: 450 GB/s, latency: 0.5 us}\n")
    path = _write(tmp_path, DECODE % "1000")
    assert main(["run", path, "-o", str(tmp_path / "out"), "--no-report", "--set", f"topology={topo}"]) == 0
    assert set(pd.read_csv(tmp_path / "out" / "results.csv")["ranks"]) == {2}
    assert main(["run", path, "-o", str(tmp_path / "out"), "--set", f"topology={topo}", "--set",
                 "topology_params.nodes=2"]) == 2  # parameters the user gives it are still an error
    assert "is an explicit topology and takes no parameters" in _error(capsys)


def test_the_header_and_meta_say_the_resolved_token_counts_and_bandwidths(tmp_path, capsys):
    """80k became 81,920 tokens without the resolved value shown anywhere."""
    path = _write(tmp_path, DECODE % "80k")
    assert main(["run", path, "-o", str(tmp_path / "out"), "--jobs", "1", "--set", "topology_params.nodes=2",
                 "--set", "topology_params.nic_bandwidth=400 Gb/s"]) == 0
    err = capsys.readouterr().err
    assert "treering: t: 1 point(s); context 81,920 tokens; links nvlink 450 GB/s, pcie 64 GB/s, net 50 GB/s" in err
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["resolved"]["tokens"] == {"workload.context": [81920]}
    assert meta["resolved"]["bandwidth_Bps"]["net"] == [50e9]


def test_an_implausible_link_runs_with_force_and_says_its_value(tmp_path, capsys):
    path = _write(tmp_path, DECODE % "1000")
    sets = ["--set", "topology_params.nodes=2", "--set", "topology_params.nic_bandwidth=400 B/s"]
    assert main(["run", path, "-o", str(tmp_path / "out"), "--jobs", "1", "--no-report", *sets]) == 2
    assert "is implausible (expected 1 MB/s .. 1 PB/s)" in _error(capsys)
    assert main(["run", path, "-o", str(tmp_path / "out"), "--jobs", "1", "--no-report", "--force", *sets]) == 0
    assert "net 400 B/s" in capsys.readouterr().err


def test_both_plans_show_one_progress_line(tmp_path, capsys, monkeypatch):
    seen: list[str] = []

    class Recorder:
        def __init__(self, label: str) -> None:
            self.label = label

        def __enter__(self):
            return lambda status: seen.append(f"{self.label}: {status}")

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(plan_cli, "progress_line", Recorder)
    assert main(["plan", "--model", "llama-3.2-1b", "--context", "8K", "--tbt", "1s", "--tp", "8",
                 "--max-nodes", "1", "--algorithms", "tree"]) == 0
    assert seen == ["plan: tree: tp 8, 1 node(s) (1 simulated)"]
    scenario = _write(tmp_path, "name: p\ntopology: dgx-h100\ntopology_params: {nodes: 1}\nworkload: {kind: prefill, "
                                "model: llama-3.2-1b, sequence: 8K}\nalgorithms: [ring]\n")
    assert main(["plan", scenario, "--ttft", "10s", "--max-nodes", "1"]) == 0
    assert seen[1:] and all(s.startswith("plan: 1 node(s), tp 1, ring ") for s in seen[1:])
    with progress_line("plan", enabled=True) as show:
        assert show is not None
        show("tree: tp 8")
    assert "plan: tree: tp 8" in capsys.readouterr().err
    with progress_line("plan") as show:  # stderr is not a terminal here
        assert show is None


def test_the_lock_file_is_all_a_refused_run_leaves_in_an_existing_folder(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    path = _write(tmp_path, DECODE % "1000" + "baseline: nope\n")
    assert main(["run", path, "-o", str(out)]) == 2
    _error(capsys)
    assert {p.name for p in out.iterdir()} <= {LOCK_FILE}
