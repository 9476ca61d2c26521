"""Property-based fuzzing of every input boundary: YAML text, quantities, scenario trees, result files
and command lines. Whatever the input: exit status 0 or 2, never a traceback, never over a time budget, and a failed
command leaves the previous outputs as they were.

A few hundred examples run in CI. Run it long with ``pytest tests/test_fuzz.py --hypothesis-profile=long`` (the
profiles are registered in ``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.cluster.topology import load_topology
from simulator.errors import InputError
from simulator.report.read import read_csv_checked, resumable_rows
from simulator.run.scenario import scenario_points
from simulator.support.yaml_lines import load_yaml_text
from simulator.units import LIMITS, checked_quantity

ROOT = Path(__file__).parents[1]
SCENARIOS = {p.name: p.read_text() for p in sorted((ROOT / "scenarios").glob("*.yaml"))}
TOPOLOGIES = {p.name: p.read_text() for p in sorted((ROOT / "topologies").glob("*.yaml"))
              if p.name not in ("devices.yaml", "prices.yaml")}
BUDGET_S = 60.0  # per case: generous on a loaded CI machine; a hang is minutes


def _examples(share: float) -> settings:
    """``share`` of the profile's examples (so ``--hypothesis-profile=long`` scales every test)."""
    return settings(max_examples=max(5, int(settings.default.max_examples * share)),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


class OverBudget(BaseException):
    pass


@contextlib.contextmanager
def budget(seconds: float = BUDGET_S) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise OverBudget(f"over the {seconds:g} s budget")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``treering ARGV`` in this process: (exit status, stderr)."""
    err, out = io.StringIO(), io.StringIO()
    with budget(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, err.getvalue()


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of ``folder`` and its content."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def assert_clean(rc: int, err: str) -> None:
    assert rc in (0, 2), (rc, err)
    assert "Traceback" not in err, err
    if rc == 2:
        assert err.count("\n") == 1 and "error: " in err, err


# -- values a hostile or careless user writes ----------------------------------------------------------------------

JUNK_SCALARS = st.one_of(
    st.sampled_from([0, -1, 1, 2, 3, 10**30, 2**53 + 1, 1.5, -0.0, True, False, None, "", ".", "..", "../x",
                     "a\x00b", "1e9999999 Gb/s", "4.9e-324 B/s", "1e308 s", "inf", "nan", "-1 us", "x" * 300,
                     "ring", "tree-p2p", "llama-3.1-8b", "dgx-a100", "fp8", "mesh", "1 GB", "0 s"]),
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-3, max_value=4), st.text(max_size=20))
JUNK = st.recursive(JUNK_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                          st.dictionaries(st.one_of(st.text(max_size=8), JUNK_SCALARS),
                                                                          inner, max_size=3)), max_leaves=6)


def _paths(tree: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_tree(draw: st.DrawFn, text: str) -> Any:
    """A shipped YAML tree with a few values replaced, keys removed or unknown keys added."""
    tree = copy.deepcopy(yaml.safe_load(text))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(tree)
        path = draw(st.sampled_from(paths))
        parent = tree
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(JUNK)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.one_of(st.text(max_size=10), JUNK_SCALARS))] = draw(JUNK)
    return tree


def _small(text: str) -> str:
    """A shipped scenario shrunk to one cheap point (the mutations then explore the inputs, not the sizes)."""
    tree = yaml.safe_load(text)
    tree.pop("sweep", None)
    tree["workload"]["context"] = 4096
    return yaml.safe_dump(tree)


# -- the boundaries ---------------------------------------------------------------------------------------------

EDITS = st.lists(st.tuples(st.integers(0, 2000), st.sampled_from(["insert", "delete"]),
                           st.sampled_from([*"[]{}:,-?&*!|>'\"#%@`\n \t0123456789.e", "!!int ", "!!binary ", "*a ",
                                            "&a ", "? ", "\xff", "\x00", "\ufeff"])), max_size=6)


@_examples(1.0)
@given(name=st.sampled_from(sorted({**SCENARIOS, **TOPOLOGIES})), edits=EDITS)
def test_yaml_text_loads_or_fails_with_one_located_error(name, edits):
    text = {**SCENARIOS, **TOPOLOGIES}[name]
    for pos, action, piece in edits:
        pos = pos % (len(text) + 1)
        text = text[:pos] + piece + text[pos:] if action == "insert" else text[:pos] + text[pos + len(piece):]
    with budget(10):
        try:
            load_yaml_text(text, "f.yaml")
        except InputError as err:
            assert str(err).startswith("f.yaml") and "\n" not in str(err)


@_examples(1.0)
@given(value=st.one_of(JUNK, st.integers(), st.text(alphabet="0123456789.eE+- kKMGTPiBbsunmf/", max_size=30)),
       kind=st.sampled_from(sorted(LIMITS)), positive=st.booleans())
def test_quantities_parse_within_limits_or_fail_with_input_error(value, kind, positive):
    try:
        x = checked_quantity(value, kind, positive=positive)
    except InputError as err:
        assert len(err.message) < 200
        return
    low, high = LIMITS[kind]
    assert math.isfinite(x) and ((x == 0 and not positive) or low <= x <= high)


@_examples(1.0)
@given(data=st.data(), name=st.sampled_from(sorted(SCENARIOS)))
def test_mutated_scenarios_validate_or_fail_with_one_located_error(data, name, tmp_path_factory):
    tree = data.draw(mutated_tree(SCENARIOS[name]))
    assume(isinstance(tree, dict))
    with budget(20):
        try:
            scenario_points(tree, "s.yaml", ROOT / "scenarios")
        except InputError as err:
            assert "\n" not in str(err) and len(str(err)) < 600


@_examples(0.5)
@given(data=st.data(), name=st.sampled_from(sorted(TOPOLOGIES)))
def test_mutated_topologies_build_or_fail_with_one_located_error(data, name, tmp_path_factory):
    tree = data.draw(mutated_tree(TOPOLOGIES[name]))
    path = tmp_path_factory.getbasetemp() / "topo.yaml"
    path.write_text(yaml.safe_dump(tree, allow_unicode=True))
    with budget(30):
        try:
            cluster = load_topology(str(path))
        except InputError as err:
            assert "\n" not in str(err) and len(str(err)) < 600
            return
    assert cluster.ranks and all(cluster.specs[r].mem_bytes > 0 for r in cluster.ranks)


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@_examples(0.2)
@given(data=st.data(), name=st.sampled_from(sorted(SCENARIOS)))
def test_mutated_scenarios_run_or_exit_2_leaving_previous_results(data, name, previous):
    tree = data.draw(mutated_tree(_small(SCENARIOS[name])))
    scen = previous / "s.yaml"
    scen.write_text(yaml.safe_dump(tree, allow_unicode=True) if isinstance(tree, dict) else "- not a mapping\n")
    out = previous / "out"
    out.mkdir(exist_ok=True)
    (out / "results.csv").write_text("previous\n")
    before = snapshot(out)
    rc, err = run_cli(["run", str(scen), "-o", str(out), "--jobs", "1", "--no-report"])
    assert_clean(rc, err)
    if rc == 2:
        assert snapshot(out) == before


@pytest.fixture(scope="module")
def good_results(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("good")
    (tmp / "s.yaml").write_text(_small(SCENARIOS["quickstart.yaml"]) + "sweep: {workload.batch: [1, 2]}\n")
    assert main(["run", str(tmp / "s.yaml"), "-o", str(tmp / "out"), "--jobs", "1", "--no-report"]) == 0
    return (tmp / "out" / "results.csv").read_text()


@_examples(1.0)
@given(cut=st.integers(0, 2000), edits=st.lists(st.tuples(st.integers(0, 2000), st.sampled_from(
    ["", ",", "\n", '"', "nan", "inf", "-1", "0.5", "x", "\xff", "1e999", "\r"])), max_size=4), total=st.integers(0, 3))
def test_damaged_results_read_or_fail_with_one_located_error(good_results, tmp_path_factory, cut, edits, total):
    text = good_results[: len(good_results) - cut % (len(good_results) + 1)]
    for pos, piece in edits:
        pos = pos % (len(text) + 1)
        text = text[:pos] + piece + text[pos + 1:]
    path = tmp_path_factory.getbasetemp() / "damaged.csv"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    for read in (lambda: read_csv_checked(path), lambda: resumable_rows(path, total)):
        with budget(10):
            try:
                read()
            except InputError as err:
                assert "\n" not in str(err)


ARGS = st.sampled_from(["--context", "--tbt", "--max-nodes", "--tp", "--batch", "--algorithms", "--model", "--set",
                        "--jobs", "--timeline-point", "--point", "--force", "--resume", "-o", "--executor",
                        "--topology", "--dtype"])
VALUES = st.sampled_from(["0", "-1", "1", "2", "1" + "0" * 30, "inf", "nan", "", ",", "1K", "1ns", "50ms", "x",
                          "llama-3.1-8b", "ring", "dgx-h100", "nodes=0", "nodes=1000000", "workload.batch=true",
                          "name=../x", "/dev/zero", "-", "fp8", "1e400"])


@_examples(0.2)
@given(verb=st.sampled_from([["plan"], ["topo", "show"], ["run"], ["trace"], ["report"], ["schema"], []]),
       args=st.lists(st.one_of(ARGS, VALUES), max_size=8))
def test_command_lines_exit_0_or_2_without_traceback(verb, args, previous):
    args = [previous.as_posix() + "/arg" if a == "-" else a for a in args]
    if verb == ["run"]:  # never the default (quickstart) sweep: a small one, into a folder of this test
        args = [str(ROOT / "scenarios" / "quickstart.yaml"), "--set", "sweep={}", "--set", "workload.context=4096",
                *args, "-o", str(previous / "cli-out"), "--jobs", "1", "--no-report"]
    if verb == ["plan"]:
        args = [*args, "--max-nodes", "2"]
    if verb == ["trace"]:
        args = [*args, "-o", str(previous / "trace.json")]
    rc, err = run_cli([*verb, *args])
    assert_clean(rc, err)
