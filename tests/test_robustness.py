"""Bad input of every kind (malformed or hostile YAML, out-of-range quantities and counts, unsafe names, damaged
results, unwritable outputs, a second writer) exits 2 with one located line, and leaves the output folder as it
was."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main
from simulator.errors import excerpt
from simulator.support.yaml_lines import load_yaml_text
from simulator.units import checked_quantity, parse_quantity

BASE = """\
name: t
topology: dgx-h100
topology_params: {nodes: 1}
workload: {kind: decode, model: {heads: 16, head_dim: 128}, batch: 1, context: 4096, dtype: bf16}
algorithms: [ring, tree]
"""
BOMB = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))

# name -> (scenario text, extra arguments, expected fragment of the error line)
CASES: dict[str, tuple[str, list[str], str]] = {
    # 1. YAML loading
    "unhashable key": (BASE + "? [a]\n: 1\n", [], "s.yaml:6: a mapping key must be a plain value"),
    "bad int tag": (BASE.replace("name: t", "name: !!int x"), [], "s.yaml:1: invalid YAML value 'x' for tag !!int"),
    "4301-digit integer": (BASE + "x: " + "1" * 4301 + "\n", [], "s.yaml:6: integer of 4301 digits"),
    "1000 nested lists": (BASE + "x: " + "[" * 1000 + "\n", [], "s.yaml: invalid YAML: nested too deeply"),
    "bad int tag in --set": (BASE, ["--set", "name=!!int x"], "--set: name: invalid YAML value 'x'"),
    "alias bomb": (BASE + BOMB, [], "expands (through aliases) to over 1,000,000 values"),
    # 2. quantities
    "bandwidth overflow": (BASE, ["--set", "topology_params.nic_bandwidth=1e9999999 Gb/s"],
                           "topology_params.nic_bandwidth: bandwidth out of range"),
    "401-digit bandwidth": (BASE, ["--set", f"topology_params.nic_bandwidth={'9' * 39} B/s"],
                            "a bandwidth of 1e+39 B/s is outside"),
    "bandwidth without a unit": (BASE, ["--set", "topology_params.nic_bandwidth=400", "--set",
                                        "topology_params.nodes=2"],
                                 "--set: topology_params.nic_bandwidth: give a unit, e.g. '450 GB/s' or '400 Gb/s', "
                                 "got 400"),
    "latency without a unit": (BASE, ["--set", "topology_params.nic_latency='2'"],
                               "topology_params.nic_latency: give a unit, e.g. '2 us'"),
    "a link of 400 B/s": (BASE, ["--set", "topology_params.nic_bandwidth=400 B/s", "--set", "topology_params.nodes=2"],
                          "topology_params.nic_bandwidth: a bandwidth of 400 B/s is implausible (expected 1 MB/s .. "
                          "1 PB/s): check its unit, or --force uses it anyway"),
    "a 10 PB/s link": (BASE, ["--set", "topology_params.intra_bandwidth=10 PB/s"], "a bandwidth of 10 PB/s is "
                       "implausible"),
    # 3. validators that assumed types
    "zip with an integer key": (BASE + "sweep: {zip: [{1: [1, 2]}]}\n", [],
                                "s.yaml:6: sweep.zip.0.1: a swept key must be a dotted path"),
    "algorithm name a list": (BASE.replace("[ring, tree]", "[{name: [ring]}]"), [],
                              "s.yaml:5: algorithms.0: must be a plain value"),
    # 4. accepted, then failing mid-run
    "fp8 on a100": (BASE.replace("dgx-h100", "dgx-a100").replace("bf16", "fp8"), [],
                    "workload.dtype: device 'a100-sxm' has no peak FLOP/s for dtype 'fp8'"),
    "flow from a device to itself": (BASE.replace(
        "{kind: decode, model: {heads: 16, head_dim: 128}, batch: 1, context: 4096, dtype: bf16}",
        "{kind: flows, flows: [{src: n0.gpu0, dst: n0.gpu0, bytes: 1 GB}]}"), [],
        "workload.flows.0: a flow needs two different devices"),
    "batch 10**30": (BASE.replace("batch: 1", "batch: " + "1" + "0" * 30), [],
                     "s.yaml:4: workload.batch: must be at most 9007199254740992"),
    "tiny bandwidth": (BASE, ["--set", "topology_params.intra_bandwidth=4.9e-324 B/s"],
                       "a bandwidth of 4.94e-324 B/s is outside"),
    "huge latency": (BASE, ["--set", "topology_params.intra_latency=1e308 s"], "a time of 1e+308 s is outside"),
    # 6. output paths and names
    "name escaping out/": (BASE.replace("name: t", "name: ../escaped"), [], "name: must be a plain name"),
    "name dot": (BASE.replace("name: t", "name: ."), [], "name: must be a plain name"),
    "name empty": (BASE.replace("name: t", "name: ''"), [], "name: must be a plain name"),
    "name with NUL": (BASE.replace("name: t", 'name: "a\\0b"'), [], "name: must be a plain name"),
    # 7. sizes
    "10**30 nodes": (BASE, ["--set", "topology_params.nodes=" + "1" + "0" * 30],
                     "topology_params.nodes: must be at most 9007199254740992, got 1000000000000000000000000000000"),
    "a million nodes": (BASE, ["--set", "topology_params.nodes=1000000"],
                        "topology_params.nodes: this topology (1,000,000 nodes x 8 GPUs"),
    "100000 GPUs on a mesh": (BASE, ["--set", "topology_params.gpus_per_node=100000", "--set",
                                     "topology_params.intra=mesh"], "would have too many nodes and links"),
    "arity 1e9": (BASE.replace("[ring, tree]", "[{name: tree-p2p, arity: 1000000000}]"), [],
                  "algorithms.0.arity: must be an integer from 2 to 1024"),
    "a 100 x 100 x 100 sweep": (BASE + "sweep: {workload.context: [%s], workload.batch: [%s], "
                                "topology_params.spines: [%s]}\n" % ((", ".join(map(str, range(1, 101))),) * 3),
                                [], "s.yaml:6: sweep: the sweep has 1,000,000 points (limit 10,000); --force"),
    "ring on 2048 ranks": (BASE, ["--set", "topology_params.nodes=256"],
                           "algorithms.0: the ring schedule on 2,048 ranks would have too many ops"),
    # 9. silently ignored or coerced
    "context: true": (BASE.replace("context: 4096", "context: true"), [], "workload.context: expected a token count"),
    "batch: yes": (BASE.replace("batch: 1", "batch: yes"), [], "workload.batch: must be an integer, got True"),
    "key swept twice": (BASE + "sweep:\n  workload.context: [1024]\n  zip: [{workload.context: [2048]}]\n", [],
                        "sweep.zip.0.workload.context: swept twice (also at sweep.workload.context)"),
    "no algorithms": (BASE.replace("[ring, tree]", "[]"), [], "s.yaml:5: algorithms: must not be empty"),
}


@pytest.fixture
def previous(tmp_path: Path) -> Path:
    """An output folder holding the results of an earlier run."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("previous\n")
    return out


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _untouched(out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == ["results.csv"]
    assert (out / "results.csv").read_text() == "previous\n"


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_scenarios_exit_2_with_one_line_and_keep_previous_results(case, tmp_path, previous, capsys, monkeypatch):
    text, extra, expected = CASES[case]
    (tmp_path / "s.yaml").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "s.yaml", "-o", str(previous), "--jobs", "1", *extra]) == 2
    err = _error_line(capsys)
    assert err.startswith("treering: error: ") and expected in err, err
    _untouched(previous)


def test_non_utf8_and_non_regular_files(tmp_path, capsys):
    (tmp_path / "s.yaml").write_bytes(BASE.encode() + b"x: \xff\n")
    assert main(["run", str(tmp_path / "s.yaml")]) == 2
    assert f"{tmp_path}/s.yaml:6: not UTF-8 text (byte 0xff)" in _error_line(capsys)
    assert main(["run", "/dev/zero"]) == 2
    assert "/dev/zero: cannot read file: not a regular file" in _error_line(capsys)
    assert main(["run", str(tmp_path)]) == 2
    assert "cannot read file: a folder" in _error_line(capsys)


def test_quantities_never_raise_anything_but_input_errors():
    from simulator.errors import InputError

    for value in ("1e9999999 Gb/s", 10**401, "inf", float("nan"), float("inf"), "9" * 500 + " B", "1e-9999999 s",
                  [1], {"a": 1}, True, None):
        with pytest.raises(InputError):
            checked_quantity(value, "bandwidth", positive=True)
    assert parse_quantity("6.6 us", "time") == 6.6e-06
    assert checked_quantity("0 s", "time", positive=False) == 0.0


def test_messages_quote_a_short_excerpt_of_huge_values():
    pairs = zip("abcdefghijklmn", "bcdefghijklmno", strict=True)
    tree = load_yaml_text("a: &a [1, 2]\n" + "".join(f"{c}: &{c} [*{p}, *{p}]\n" for p, c in pairs))
    assert len(excerpt(tree["o"])) <= 60 and len(excerpt("x" * 10**6)) <= 60 and len(excerpt(10**5000)) <= 60


def test_builder_topologies_refuse_ignored_keys_and_pass_the_others(tmp_path, capsys):
    preset = (Path(__file__).parents[1] / "topologies" / "dgx-h100.yaml").read_text()
    (tmp_path / "a.yaml").write_text(preset + "message_overhead: 5 us\n")
    assert main(["topo", "show", str(tmp_path / "a.yaml")]) == 2
    assert "message_overhead: a builder topology takes message_overhead under params:" in _error_line(capsys)
    (tmp_path / "b.yaml").write_text(preset + "colective_overhead: 5 us\n")
    assert main(["topo", "show", str(tmp_path / "b.yaml")]) == 2
    assert "colective_overhead: unknown key" in _error_line(capsys)
    (tmp_path / "c.yaml").write_text(preset.replace("  spines: 2", "  spines: null"))
    assert main(["topo", "show", str(tmp_path / "c.yaml")]) == 2
    assert "params.spines: needs a value (default 2), got null" in _error_line(capsys)
    (tmp_path / "d.yaml").write_text("name: d\nbuilder: cluster\nparams: [nodes, 2]\n")
    assert main(["topo", "show", str(tmp_path / "d.yaml")]) == 2
    assert "d.yaml:3: params: must be a mapping" in _error_line(capsys)
    from simulator.cluster.topology import load_topology

    (tmp_path / "e.yaml").write_text(preset + "collective_overhead: 5 us\n")
    assert load_topology(str(tmp_path / "e.yaml")).collective_start_s == 5e-6


@pytest.mark.parametrize("argv, expected", [
    (["plan", "--model", "llama-3.1-8b", "--context", "inf", "--tbt", "50ms"],
     "--context: must be a positive integer, got 'inf'"),
    (["plan", "--model", "llama-3.1-8b", "--context", "1" + "0" * 400, "--tbt", "50ms"], "--context:"),
    (["plan", "--model", "llama-3.1-8b", "--context", "1M", "--tbt", "50ms", "--algorithms", ","],
     "--algorithms: needs at least one algorithm name"),
    (["plan", "--model", "llama-3.1-8b", "--context", "1M", "--tbt", "1ns", "--max-nodes", "1000000"],
     "--max-nodes: 1,000,000 nodes of dgx-h100 would have too many nodes and links"),
    (["plan", "--model", "llama-3.1-8b", "--context", "1M", "--tbt=-1ms"], "--tbt: must be positive"),
    (["topo", "show", "dgx-h100", "--set", "nodes=1000000"], "topology_params.nodes: this topology"),
])
def test_command_line_errors(argv, expected, capsys):
    assert main(argv) == 2
    err = _error_line(capsys)
    assert err.startswith("treering: error: ") and expected in err, err


@pytest.mark.parametrize("argv", [["plan", "--model", "llama-3.1-8b", "--context", "1M", "--tbt", "50ms", "--tp", "0"],
                                  ["plan", "--model", "llama-3.1-8b", "--context", "1M", "--tbt", "50ms",
                                   "--max-nodes", "0"],
                                  ["run", "--jobs", "0"], ["run", "--timeline-point", "-1"]])
def test_counts_are_checked_when_the_arguments_are_parsed(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "must be an integer >=" in _error_line(capsys)


# 5. resume and report on damaged files
DAMAGED = {
    "no point column": ("a,b\n1,2\n", "results.csv:1: cannot resume from it: missing column(s) point"),
    "text point": ("point,x\nfoo,2\n", "results.csv:2: point: must be a point index of this sweep (0 to 0), got 'foo'"),
    "fractional point": ("point,x\n0.5,2\n", "results.csv:2: point: must be a point index of this sweep"),
    "negative point": ("point,x\n-1,2\n", "results.csv:2: point: must be a point index of this sweep"),
    "utf-16": ("point\n0\n".encode("utf-16"), "results.csv:1: cannot resume from it: not UTF-8 text"),
    "negative latency": ("point,latency_s\n0,-1\n",
                         "results.csv:2: latency_s: cannot resume from it: must be a finite number >= 0, got -1"),
    "empty": ("", "results.csv:1: cannot resume from it: empty file"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_resume_refuses_damaged_results(case, tmp_path, capsys):
    content, expected = DAMAGED[case]
    out = tmp_path / "out"
    out.mkdir()
    path = out / "results.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    (tmp_path / "s.yaml").write_text(BASE)
    assert main(["run", str(tmp_path / "s.yaml"), "-o", str(out), "--resume", "--jobs", "1", "--no-report"]) == 2
    assert expected in _error_line(capsys)
    assert path.read_bytes() == (content if isinstance(content, bytes) else content.encode())


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("good")
    (tmp / "s.yaml").write_text(BASE)
    assert main(["run", str(tmp / "s.yaml"), "-o", str(tmp / "out"), "--jobs", "1", "--no-report"]) == 0
    return tmp / "out" / "results.csv"


def test_report_refuses_damaged_results_and_meta(results, tmp_path, capsys):
    good = pd.read_csv(results)
    cases = {"missing columns": (good.drop(columns=["ranks"]), "missing column(s) ranks"),
             "nan latency": (good.assign(latency_s=float("nan")), "latency_s: must be a finite number >= 0, got nan"),
             "inf latency": (good.assign(latency_s=float("inf")), "latency_s: must be a finite number >= 0, got inf")}
    for frame, expected in cases.values():
        frame.to_csv(tmp_path / "results.csv", index=False)
        assert main(["report", str(tmp_path / "results.csv"), "-o", str(tmp_path / "rep")]) == 2
        assert expected in _error_line(capsys)
    (tmp_path / "results.csv").write_text(results.read_text()[:-40])  # truncated mid-row
    assert main(["report", str(tmp_path)]) == 2
    assert "results.csv:3: " in _error_line(capsys)
    (tmp_path / "results.csv").write_text(results.read_text())
    for meta, expected in (("{bad", "meta.json: not JSON"), ("[1]", "meta.json:1: must be a JSON object"),
                           ('{"capacity_bytes": -1}', "meta.json: capacity_bytes: Input should be greater than 0")):
        (tmp_path / "meta.json").write_text(meta)
        assert main(["report", str(tmp_path)]) == 2
        assert expected in _error_line(capsys)
    assert not (tmp_path / "report.md").exists()


# 6. output paths
def test_unwritable_outputs_are_refused_before_simulating(results, tmp_path, capsys):
    scen = tmp_path / "s.yaml"
    scen.write_text(BASE)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "results.csv").mkdir()
    for out, expected in ((tmp_path / "afile" / "sub", "cannot create the output folder"),
                          (tmp_path / "dangling", "is a dangling symbolic link"),
                          (tmp_path / "o", "o/results.csv: -o: is a folder where treering writes a file"),
                          (Path("/proc/treering-cannot-write"), "cannot create the output folder")):
        assert main(["run", str(scen), "-o", str(out), "--jobs", "1"]) == 2
        assert expected in _error_line(capsys)
    assert main(["trace", str(scen), "-o", str(tmp_path)]) == 2
    assert "is a folder; give a file name" in _error_line(capsys)


def test_outputs_get_the_users_umask(tmp_path):
    (tmp_path / "s.yaml").write_text(BASE)
    old = os.umask(0o027)
    try:
        assert main(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out"), "--jobs", "1"]) == 0
    finally:
        os.umask(old)
    for name in ("results.csv", "results.parquet", "report.md", "meta.json"):
        assert stat.S_IMODE((tmp_path / "out" / name).stat().st_mode) == 0o640, name


def test_swept_mappings_and_mixed_types_become_columns(tmp_path):
    text = BASE.replace("{heads: 16, head_dim: 128}", "llama-3.1-8b") + (
        "sweep:\n  workload.model: [llama-3.1-8b, {heads: 16, head_dim: 128}]\n  workload.context: [4096, 4K]\n")
    (tmp_path / "s.yaml").write_text(text)
    assert main(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out"), "--jobs", "1", "--no-report"]) == 0
    frame = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert set(frame["workload.model"]) == {"llama-3.1-8b", '{"heads":16,"head_dim":128}'}
    assert len(frame) == 2 * 2 * 2


def test_a_second_writer_is_refused(tmp_path, capsys):
    from simulator.support.outdir import output_lock

    (tmp_path / "s.yaml").write_text(BASE)
    out = tmp_path / "out"
    out.mkdir()
    with output_lock(out):  # as another treering process would hold it
        assert main(["run", str(tmp_path / "s.yaml"), "-o", str(out), "--jobs", "1"]) == 2
    assert "another treering command is writing to this folder" in _error_line(capsys)
    assert main(["run", str(tmp_path / "s.yaml"), "-o", str(out), "--jobs", "1", "--no-report"]) == 0


def test_a_field_named_by_a_huge_key_is_cut_in_the_message(tmp_path, capsys):
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nbuilder: cluster\nparams:\n  nodes: 2\n  " + "x" * 500 + ": 0\n")
    assert main(["topo", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 600 and "params.xxx" in err and "unknown builder parameter" in err
