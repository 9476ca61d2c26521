"""Files from machines the user may not control, and the options beside them: `nvidia-smi topo -m` matrices, NCCL
topology XML, nccl-tests logs, `topo import`'s options, and the workloads and plan options a user writes.

Whatever the input: exit status 0 or 2, one line on stderr naming the file (and line) or the option, never a
traceback, bounded time, and a refused command leaves what it would have replaced as it was. Every class of failure
found so far has its example here; the fuzz tests at the end look for the next one. Last, the numba cache of a
read-only install (:mod:`simulator.support.jitcache`): its list of compiled folders is whole, and the CLI runs with
the package folders and the home folder read-only.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.cluster.import_nccl_xml import MAX_XML_DEPTH, MAX_XML_ELEMENTS, parse_xml
from simulator.cluster.importers import import_topology
from simulator.cluster.summary import summarize
from simulator.cluster.topology import load_topology
from simulator.errors import InputError
from simulator.nccl.logs import parse_nccl_tests
from simulator.support.jitcache import COMPILED_FOLDERS, cache_subpath
from simulator.support.yaml_lines import MAX_YAML_BYTES
from tests.test_fuzz import assert_clean, budget, run_cli

ROOT = Path(__file__).resolve().parents[1]
TOPO = ROOT / "tests" / "fixtures" / "topo"
NVSMI = TOPO / "a100-8gpu-8nic_deepep-13.txt"
XML = TOPO / "a100-8gpu-4nic_simai.xml"
LOGS = ROOT / "tests" / "fixtures" / "nccltests"
ALLREDUCE = LOGS / "all_reduce_h100_2x8_a3mega.log"
PREVIOUS = "# a topology written earlier\n"


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``treering ARGV`` exits 2 with one line on stderr and no traceback: that line."""
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("treering: error: ") and "Traceback" not in err, err
    return err


# -- topo import: checked before writing, written atomically ------------------------------------------------------

def _xml_cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    xml = XML.read_text()
    dup = _write(tmp_path, "dup.xml", xml.replace('numaid="1"', 'numaid="0"'))
    slow = _write(tmp_path, "slow.xml", xml.replace('speed="200000"', 'speed="1"'))
    huge = "1" + "0" * 40
    return [
        ([str(XML), "--device", "bogus"], "--device: unknown device spec 'bogus'; known: a100-sxm"),
        ([dup], f"{dup}:79: cpu.numaid: two <cpu> elements with numaid='0' (the first at line 2)"),
        ([str(XML), "--pcie-bandwidth", "1e308 B/s"], "--pcie-bandwidth: a bandwidth of 1e+308 B/s is outside 1 .. "),
        ([str(XML), "--nic-bandwidth", "400 B/s"], "--nic-bandwidth: a bandwidth of 400 B/s is implausible"),
        ([str(XML), "--nodes", "2000"], "--nodes: 2,000 nodes of 8 GPUs would write about "),
        ([str(XML), "--nodes", huge], "--nodes: about 1e40 nodes of 8 GPUs would write over 4 MiB of YAML"),
        ([str(XML), "--nics", ","], "--nics: names no NIC"),
        ([str(XML), "--nics", "mlx5_bond_0,mlx5_bond_0"], "--nics: names 'mlx5_bond_0' more than once"),
        ([str(NVSMI), "--nics", " , "], "--nics: names no NIC"),
        ([str(XML), "--nvlink-gen", "0"], "--nvlink-gen: unknown NVLink generation 0; known: 1, 2, 3, 4, 5"),
        ([str(XML), "--nvlink-gen", "7"], "--nvlink-gen: unknown NVLink generation 7"),
        ([str(NVSMI), "--nvlink-gen", "-1"], "--nvlink-gen: unknown NVLink generation -1"),
        ([slow, "--nodes", "2"], "links.84.bandwidth: a bandwidth of 125 kB/s is implausible"),  # keep last
    ]


def test_topo_import_refusals_leave_the_earlier_output(tmp_path, capsys):
    """Each was written (or half-checked) before: now refused before writing, the earlier file intact."""
    out = tmp_path / "t.yaml"
    for args, message in _xml_cases(tmp_path):
        out.write_text(PREVIOUS)
        start = time.perf_counter()
        err = _refused(["topo", "import", *args, "-o", str(out)], capsys)
        assert message in err, (message, err)
        assert time.perf_counter() - start < 10, args  # --nodes 1e40 took minutes
        assert out.read_text() == PREVIOUS and [p.name for p in tmp_path.glob(".t.yaml*")] == []
    # the topology that would not load says which entry and that nothing was written
    assert "the imported topology would not load" in err and f"{out} not written" in err


def test_one_server_over_a_topology_file_is_refused_before_it_is_written(tmp_path, capsys):
    n = 300  # GPUs bonded pairwise by NV1 or NV2: ~45,000 direct links, over 4 MiB of YAML for one node
    head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\n"
    rows = "".join(f"GPU{i}\t" + "\t".join("X" if i == j else f"NV{1 + (i + j) % 2}" for j in range(n)) + "\t0-1\t0\n"
                   for i in range(n))
    matrix = _write(tmp_path, "mesh.txt", head + rows)
    out = tmp_path / "t.yaml"
    out.write_text(PREVIOUS)
    err = _refused(["topo", "import", matrix, "--device", "h100-sxm", "-o", str(out)], capsys)
    assert f"{matrix}: one node of 300 GPUs and " in err and "MiB of YAML; a topology file holds at most 4 MiB" in err
    assert out.read_text() == PREVIOUS


def test_the_node_estimate_refuses_what_would_not_fit_and_no_more(tmp_path, capsys):
    """The nodes the refusal says fit are written within 4 MiB, and fill most of it."""
    err = _refused(["topo", "import", str(XML), "--nodes", "100000", "-o", str(tmp_path / "t.yaml")], capsys)
    fit = int(re.search(r"about ([\d,]+) such nodes", err).group(1).replace(",", ""))  # type: ignore[union-attr]
    size = len(import_topology([str(XML)], nodes=fit).encode())
    assert 0.9 * MAX_YAML_BYTES < size <= MAX_YAML_BYTES


def test_text_from_the_files_stays_in_comments(tmp_path):
    """An attribute with line breaks (``&#10;``, YAML's ``\\x85``) and a name that YAML would read as a date or a
    mapping come back as written, and add no key."""
    xml = XML.read_text().replace('vendor="GenuineIntel"', 'vendor="&#10;nodes: []&#10;&#133;links: []"', 1)
    path = _write(tmp_path, "nl.xml", xml)
    for name in ("2024-01-01", "x: y", "yes", "a\nb: c", "# not a comment"):
        out = tmp_path / "t.yaml"
        assert main(["topo", "import", path, "--name", name, "-o", str(out)]) == 0
        cluster = load_topology(str(out))
        assert cluster.name == name and len(cluster.ranks) == 8
        assert yaml.safe_load(out.read_text()).keys() == {"name", "comm_overhead", "nodes", "links"}
    # file names are written in comments (and in the fabric's note, for a server whose NIC speed is not stated)
    folder = tmp_path / "a\nnodes: []\u2028b"
    folder.mkdir()
    shutil.copy(TOPO / "h20-8gpu-8nic_sglang-31046.txt", folder / "s.txt")
    out = tmp_path / "two.yaml"
    assert main(["topo", "import", str(folder / "s.txt"), str(TOPO / "h100-8gpu-8nic-vm_ibm-cloud.xml"), "--device",
                 "h100-sxm", "-o", str(out)]) == 0
    assert len(load_topology(str(out)).ranks) == 16 and "assumed the same for " in out.read_text()


# -- NCCL topology XML: hardened parser, bounded, numbers finite and in range ------------------------------------

@pytest.mark.parametrize(("text", "message"), [
    ('<?xml version="1.0"?>\n<!DOCTYPE s [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]>\n'
     "<system>&b;</system>\n", "x.xml:2: xml: a DTD (<!DOCTYPE>) is refused"),
    ('<?xml version="1.0"?>\n<!DOCTYPE s [<!ENTITY e SYSTEM "file:///etc/passwd">]>\n<system>&e;</system>\n',
     "x.xml:2: xml: a DTD (<!DOCTYPE>) is refused"),
    ("<system>\n&undefined;</system>\n", "x.xml:2: xml: malformed XML: undefined entity"),
    ("<system>" + "<pci>" * 2000 + "</pci>" * 2000 + "</system>",
     f"x.xml:1: xml: elements nested over {MAX_XML_DEPTH}"),
    ("<system>\n" + "<cpu/>" * (MAX_XML_ELEMENTS + 1) + "\n</system>", "x.xml:2: xml: over 100,000 elements"),
    ("<nccl/>", "x.xml:1: system: not an NCCL topology: the root element is <nccl>"),
])
def test_hostile_xml_is_refused_at_its_line(text, message):
    with budget(10), pytest.raises(InputError) as err:
        parse_xml(text, "x.xml")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("old", "new", "message"), [
    ('numaid="1"', 'numaid="inf"', ":79: cpu.numaid: numaid='inf' is not a finite number"),
    ('numaid="1"', 'numaid="5000"', ":79: cpu.numaid: numaid='5000': expected an integer from 0 to 4095"),
    ('dev="3"', 'dev="nan"', ":61: gpu.dev: dev='nan' is not a finite number"),
    ('dev="3"', 'dev="2.5"', ":61: gpu.dev: dev='2.5': expected an integer"),
    ('count="2"', 'count="inf"', ":13: nvlink.count: count='inf' is not a finite number"),
    ('count="2"', 'count="0"', ":13: nvlink.count: count='0': expected an integer from 1 to 64"),
    ('link_width="16"', 'link_width="nan"', ":3: pci.link_width: link_width='nan' is not a finite number"),
    ('sm="80"', 'sm="1e999"', ":12: gpu.sm: sm='1e999' is not a finite number"),
    ('sm="80"', 'sm="-80"', ":12: gpu.sm: sm='-80': expected an integer from 1 to 10000"),
    ('link_speed="16 GT/s"', 'link_speed="' + "9" * 400 + ' GT/s"', ":3: pci.link_speed: link_speed="),
    ('link_speed="16 GT/s"', 'link_speed="0 GT/s"', ":3: pci.link_speed: link_speed='0 GT/s': expected a rate"),
    ('speed="200000"', 'speed="-nan"', ":5: net.speed: speed='-nan' is not a finite number"),
    ('speed="200000"', 'speed="-5"', ":5: net.speed: speed='-5': expected Mb/s from 0 to 1e+09"),
])
def test_numbers_in_the_xml_are_finite_and_in_range(tmp_path, capsys, old, new, message):
    path = _write(tmp_path, "x.xml", XML.read_text().replace(old, new, 1))
    out = tmp_path / "t.yaml"
    out.write_text(PREVIOUS)
    err = _refused(["topo", "import", path, "--nodes", "2", "-o", str(out)], capsys)
    assert f"{path}{message}" in err, err
    assert out.read_text() == PREVIOUS


# -- nvidia-smi topo -m ---------------------------------------------------------------------------------------------

def test_matrix_sizes_and_bonds_are_bounded(tmp_path, capsys):
    n = 600
    head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\n"
    wide = _write(tmp_path, "wide.txt", head + "".join(f"GPU{i}\n" for i in range(n)))
    text = NVSMI.read_text()
    cases = [(wide, f"{wide}:1: columns: 600 columns: at most 512 devices"),
             (_write(tmp_path, "nv.txt", text.replace("NV12", "NV100000", 2)), "nv.txt:2: GPU0/GPU1: NV100000: at "
                                                                             "most 64 NVLinks bond two GPUs"),
             (_write(tmp_path, "digits.txt", text.replace("NV12", "NV" + "9" * 5000, 2)),
              "digits.txt:2: GPU0/GPU1: unknown cell code 'NV99")]
    for path, message in cases:
        with budget(10):
            err = _refused(["topo", "import", path, "-o", str(tmp_path / "t.yaml")], capsys)
        assert message in err, (message, err)


# -- nccl-tests logs ------------------------------------------------------------------------------------------------

def _edit_row(text: str, size: str, column: int, value: str) -> str:
    """The log with cell ``column`` of the row of ``size`` bytes set to ``value``."""
    lines = []
    for line in text.splitlines():
        cells = line.split()
        if cells[:1] == [size] and len(cells) == 13:
            cells[column] = value
            line = "  ".join(cells)
        lines.append(line)
    return "\n".join(lines) + "\n"


def _all_rows(text: str, columns: dict[int, str]) -> str:
    lines = []
    for line in text.splitlines():
        cells = line.split()
        if len(cells) == 13 and cells[0].isdigit():
            line = "  ".join(columns.get(k, c) for k, c in enumerate(cells))
        lines.append(line)
    return "\n".join(lines) + "\n"


def _nccl_commands(log: str, tmp_path: Path) -> list[list[str]]:
    return [["validate", "--nccl-tests", log, "--topology", "dgx-h100", "--set", "topology_params.nodes=2", "-o",
             str(tmp_path / "v")],
            ["calibrate", "--from-nccl-tests", log, "-o", str(tmp_path / "fitted.yaml")]]


@pytest.mark.parametrize(("column", "value", "message"), [
    (0, "nan", ":39: size: expected an integer (at most 2^53), got 'nan'"),
    (0, "inf", ":39: size: expected an integer (at most 2^53), got 'inf'"),
    (0, "1e300", ":39: size: expected an integer (at most 2^53), got '1e300'"),
    (1, "inf", ":39: count: expected an integer (at most 2^53), got 'inf'"),
    (1, "nan", ":39: count: expected an integer"),
    (4, "nan", ":39: root: expected an integer (at most 2^53), got 'nan'"),
    (4, "-inf", ":39: root: expected an integer"),
])
def test_non_finite_sizes_counts_and_roots_are_refused_at_their_line(tmp_path, capsys, column, value, message):
    log = _write(tmp_path, "x.log", _edit_row(ALLREDUCE.read_text(), "1024", column, value))
    for argv in _nccl_commands(log, tmp_path):
        assert f"{log}{message}" in _refused(argv, capsys)
    assert not (tmp_path / "v" / "nccl_validation.csv").exists() and not (tmp_path / "fitted.yaml").exists()


def test_a_log_with_nothing_usable_is_refused_in_one_line(tmp_path, capsys):
    text = ALLREDUCE.read_text()
    zero_busbw = _write(tmp_path, "zero.log", _all_rows(text, {7: "0.00", 11: "0.00"}))
    err = _refused(_nccl_commands(zero_busbw, tmp_path)[0], capsys)
    assert f"{zero_busbw}:30: busbw: no size of the log has a measured bus bandwidth" in err
    nan_time = _write(tmp_path, "nan.log", _all_rows(text, {5: "nan", 9: "nan", 7: "inf"}))
    for argv, message in zip(_nccl_commands(nan_time, tmp_path), ("busbw: no size of the log has a measured bus",
                                                                   "--from-nccl-tests: no size of the log has a "
                                                                   "measured time"), strict=True):
        assert f"{nan_time}:30: {message}" in _refused(argv, capsys)
    # a usable log beside one with nothing usable: the latter is named
    err = _refused(["validate", "--nccl-tests", str(ALLREDUCE), "--nccl-tests", zero_busbw, "--topology", "dgx-h100",
                    "--set", "topology_params.nodes=2", "-o", str(tmp_path / "v")], capsys)
    assert f"{zero_busbw}:30: busbw: no size" in err
    assert not (tmp_path / "v" / "nccl_validation.csv").exists() and not (tmp_path / "fitted.yaml").exists()


def test_log_files_and_counts_are_bounded(tmp_path, capsys):
    text = ALLREDUCE.read_text()
    head = text.split("\n           8 ", 1)[0]
    last = next(line.split() for line in text.splitlines() if line.split()[:1] == ["8589934592"])
    many = head + "\n" + "\n".join("  ".join([str(2**20 + 8 * k), *last[1:]]) for k in range(2100)) + "\n"
    logs = {"folder": (str(tmp_path), f"{tmp_path}: not a regular file"),
            "rank": (_write(tmp_path, "rank.log", text.replace("#  Rank  3 ", "#  Rank  " + "9" * 5000 + " ")),
                     "rank.log:15: rank: rank '999999"),
            "sizes": (_write(tmp_path, "many.log", many), "many.log: --nccl-tests: 2,100 sizes to simulate, one "
                                                          "collective each (at most 2,000)")}
    for log, message in logs.values():
        with budget(20):
            err = _refused(_nccl_commands(log, tmp_path)[0], capsys)
        assert message in err, (message, err)
    with budget(20):
        err = _refused(_nccl_commands(logs["sizes"][0], tmp_path)[1], capsys)
    assert "many.log:288: --from-nccl-tests: 2,100 sizes to fit (at most 256" in err


# -- the numba cache of a read-only install -------------------------------------------------------------------------

def _caches(tree: ast.AST) -> bool:
    """Whether ``tree`` calls a jit decorator with ``cache=True``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("njit", "jit") and any(k.arg == "cache" and isinstance(k.value, ast.Constant)
                                               and k.value.value is True for k in node.keywords):
                return True
    return False


def test_compiled_folders_is_whole():
    """Every module with ``cache=True`` compiled functions is in a folder of ``jitcache.COMPILED_FOLDERS`` (whose
    caches a read-only install seeds the user's cache with), and every such folder has one."""
    package = ROOT / "simulator"
    compiled = {p.parent.resolve() for p in package.rglob("*.py")
                if "__pycache__" not in p.parts and _caches(ast.parse(p.read_text(encoding="utf-8")))}
    assert compiled, "no compiled module found: the check would hold nothing"
    listed = {Path(f).resolve() for f in COMPILED_FOLDERS}
    assert compiled <= listed, f"not in COMPILED_FOLDERS: {sorted(map(str, compiled - listed))}"
    assert listed <= compiled, f"COMPILED_FOLDERS without compiled code: {sorted(map(str, listed - compiled))}"


_RO_MOUNT = ('for d in "$RO_A" "$RO_B"; do mount --bind "$d" "$d" && mount -o remount,bind,ro "$d" || exit 97; '
             'done; exec "$@"')


@pytest.mark.slow
def test_a_read_only_install_caches_its_compiled_code_elsewhere(tmp_path):
    """The package copied, its folders and the home folder read-only (``chmod``; as root, which ignores permissions,
    read-only bind mounts in a private mount namespace): numba alone cannot cache a function there, and
    ``treering topo show`` (the router's compiled code) runs, its cache in the private temporary folder."""
    summarize(load_topology("dgx-h100"))  # this checkout's caches hold the code the command runs (copied below)
    install = tmp_path / "install"
    shutil.copytree(ROOT / "simulator", install / "simulator", copy_function=shutil.copy2)  # mtimes: caches valid
    probe = install / "simulator" / "cluster" / "_numba_probe.py"
    probe.write_text("import numba\n\n\n@numba.njit(cache=True)\ndef f(x):\n    return x + 1\n")
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "XDG_", "PYTHON"))}
    env.update(PYTHONPATH=str(install), HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), TMPDIR=str(tmp),
               TREERING_HOME=str(ROOT), RO_A=str(install), RO_B=str(home))
    root = os.geteuid() == 0
    prefix = ["unshare", "--mount", "sh", "-c", _RO_MOUNT, "sh"] if root else []
    if root:
        if shutil.which("unshare") is None:
            pytest.skip("root ignores permissions and unshare is missing: no read-only folder to test with")
        trial = subprocess.run([*prefix, "true"], env=env, capture_output=True, text=True)
        if trial.returncode != 0:
            pytest.skip(f"root ignores permissions and read-only bind mounts are not allowed: {trial.stderr[-200:]}")
    folders = [p for p in [install, *install.rglob("*")] if p.is_dir()] + [home]
    before = sorted(str(p.relative_to(install)) for p in install.rglob("*"))
    try:
        if not root:
            for folder in folders:
                folder.chmod(0o555)
        load = (f"import importlib.util as u; s = u.spec_from_file_location('probe', {str(probe)!r}); "
                "s.loader.exec_module(u.module_from_spec(s))")
        control = subprocess.run([*prefix, sys.executable, "-c", load], env=env, capture_output=True, text=True,
                                 cwd=tmp, timeout=120)
        assert control.returncode != 0 and "cannot cache function" in control.stderr, control.stderr[-2000:]
        run = subprocess.run([*prefix, sys.executable, "-m", "simulator.cli", "topo", "show", "dgx-h100"], env=env,
                             capture_output=True, text=True, cwd=tmp, timeout=300)
    finally:
        for folder in folders:
            folder.chmod(0o755)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "topology dgx-h100: 8 GPUs on 1 node(s)" in run.stdout
    cache = tmp / f"treering-numba-{0 if root else os.getuid()}"
    index = list((cache / cache_subpath(install / "simulator" / "cluster")).glob("routecore.*.nbi"))
    assert index, sorted(p.name for p in cache.rglob("*"))  # the copy's code, cached in the private folder
    assert (cache.stat().st_mode & 0o777) == 0o700
    assert sorted(str(p.relative_to(install)) for p in install.rglob("*")) == before  # nothing written in it


# -- fuzz: every surface ----------------------------------------------------------------------------------------------

def _examples(n: int) -> settings:
    """``n`` examples in CI, scaled with the profile (``--hypothesis-profile=long``)."""
    return settings(max_examples=max(3, n * settings.default.max_examples // 100), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("untrusted")


def _imports(previous: Path, files: list[str], options: list[str]) -> None:
    """``topo import FILES OPTIONS``: exit 0 and a topology that loads, or exit 2 and the earlier output intact."""
    out = previous / "t.yaml"
    out.write_text(PREVIOUS)
    rc, err = run_cli(["topo", "import", *files, *options, "-o", str(out)])
    assert_clean(rc, err)
    event(f"exit {rc}")  # --hypothesis-show-statistics: how many ran, how many were refused
    if rc == 2:
        assert out.read_text() == PREVIOUS
    else:
        with budget(30):
            cluster = load_topology(str(out))
        assert cluster.ranks


CELLS = st.sampled_from(["X", "NV1", "NV12", "NV18", "NV0", "NV65", "NV" + "9" * 30, "PIX", "PXB", "PHB", "NODE",
                         "SYS", "SOC", "N/A", "nan", "", "GPU0", "NIC0", "\x00", "é"])


@_examples(25)
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000), CELLS), max_size=5),
       cut=st.integers(0, 40), dup=st.booleans(), file=st.sampled_from(sorted(TOPO.glob("*.txt"))))
def test_fuzz_nvidia_smi_matrices(previous, edits, cut, dup, file):
    lines = [line.split("\t") for line in file.read_text().splitlines()]
    for row, col, cell in edits:
        cells = lines[row % len(lines)]
        cells[col % len(cells)] = cell
    text = "\n".join("\t".join(cells) for cells in lines[: len(lines) - cut % len(lines)])
    if dup:
        text += "\n" + text.splitlines()[len(text.splitlines()) // 2]
    path = previous / "m.txt"
    path.write_text(text + "\n")
    _imports(previous, [str(path)], ["--device", "h100-sxm", "--nvlink-gen", "4"])


ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')
XML_VALUES = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1", "2.5", "1e999", "0x", "0x10", "9" * 50, "",
                              "&amp;", "&#10;", "&#x85;", "x" * 200, "16 GT/s", "0 GT/s", "1e300 GT/s", "90", "gfx942",
                              "0000:13:00.0", "  7 "])
XML_PIECES = st.sampled_from(["<pci>", "</pci>", "<cpu numaid=\"0\">", "</cpu>", "<gpu dev=\"0\" sm=\"90\"/>",
                              "<!DOCTYPE x>", "<!ENTITY a \"b\">", "&a;", "<nic><net name=\"n\" speed=\"1\"/></nic>",
                              "<", ">", "\"", "\x00", "]]>"])


@_examples(25)
@given(values=st.lists(st.tuples(st.integers(0, 10_000), XML_VALUES), max_size=4),
       pieces=st.lists(st.tuples(st.integers(0, 100_000), XML_PIECES), max_size=2),
       file=st.sampled_from(sorted(TOPO.glob("*.xml"))), nodes=st.sampled_from([[], ["--nodes", "2"]]))
def test_fuzz_nccl_topology_xml(previous, values, pieces, file, nodes):
    text = file.read_text()
    spots = list(ATTRIBUTE.finditer(text))
    for k, value in sorted(values, key=lambda kv: -spots[kv[0] % len(spots)].start(2)):
        m = spots[k % len(spots)]
        text = text[: m.start(2)] + value + text[m.end(2):]
        spots = list(ATTRIBUTE.finditer(text))
    for pos, piece in pieces:
        pos %= len(text) + 1
        text = text[:pos] + piece + text[pos:]
    path = previous / "x.xml"
    path.write_text(text)
    _imports(previous, [str(path)], nodes)


LOG_CELLS = st.sampled_from(["nan", "inf", "-inf", "-nan", "-1", "0", "0.00", "1e300", "1e999", "8", "N/A", "x", "",
                             "9" * 400, "float", "sum", "bfloat16", "int8"])


@st.composite
def damaged_log(draw: st.DrawFn, text: str) -> str:
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["cell", "cell", "cell", "delete", "duplicate"]))
        if action == "cell":
            cells = lines[i].split() or [""]
            cells[draw(st.integers(0, len(cells) - 1))] = draw(LOG_CELLS)
            lines[i] = "  ".join(cells)
        elif action == "delete":
            del lines[i]
        else:
            lines.insert(i, lines[i])
        if not lines:
            lines = [""]
    return "\n".join(lines) + "\n"


@_examples(60)
@given(data=st.data(), file=st.sampled_from(sorted(LOGS.glob("*.log"))))
def test_fuzz_nccl_tests_logs_parse(data, file):
    text = data.draw(damaged_log(file.read_text()))
    with budget(10):
        try:
            runs = parse_nccl_tests(text, "l.log")
        except InputError as err:
            assert str(err).startswith("l.log") and "\n" not in str(err)
            return
    for run in runs:
        for row in run.rows:  # what the commands compute with is finite and whole
            assert isinstance(row.nbytes, int) and isinstance(row.count, int) and row.nbytes >= 0
            assert row.root is None or isinstance(row.root, int)


def _small_log() -> str:
    """The allreduce log with its four largest sizes: validate simulates four collectives; calibrate always
    refuses it (too few sizes), after reading it and sizing the topology."""
    lines = ALLREDUCE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["8"])
    return "\n".join(lines[:start] + lines[start + 27:]) + "\n"


@_examples(8)
@given(data=st.data(), verb=st.sampled_from(["validate", "calibrate"]))
def test_fuzz_nccl_tests_commands(previous, data, verb):
    log = previous / "small.log"
    log.write_text(data.draw(damaged_log(_small_log())))
    out = previous / ("v" if verb == "validate" else "fitted.yaml")
    argv = (["validate", "--nccl-tests", str(log), "--topology", "dgx-h100", "--set", "topology_params.nodes=2"]
            if verb == "validate" else ["calibrate", "--from-nccl-tests", str(log), "--topology", "dgx-h100"])
    if verb == "calibrate":
        out.write_text(PREVIOUS)
    rc, err = run_cli([*argv, "-o", str(out)])
    assert_clean(rc, err)
    event(f"exit {rc}")  # --hypothesis-show-statistics: how many ran, how many were refused
    if verb == "calibrate":
        assert rc == 2 and out.read_text() == PREVIOUS


IMPORT_OPTIONS = st.lists(st.one_of(
    st.tuples(st.just("--nodes"), st.sampled_from(["0", "-1", "1", "2", "3", "1e30", "1" + "0" * 40, "x"])),
    st.tuples(st.just("--fabric"), st.sampled_from(["rail", "fat-tree", "single-switch", "torus", ""])),
    st.tuples(st.just("--nics"), st.sampled_from([",", "", " , ", "mlx5_0", "mlx5_0,mlx5_0", "mlx5_bond_0",
                                                  "mlx5_0,mlx5_1", "NIC0", "x" * 300, "\n"])),
    st.tuples(st.just("--device"), st.sampled_from(["h100-sxm", "a100-sxm", "bogus", "", "../devices", "mi300x"])),
    st.tuples(st.just("--nvlink-gen"), st.sampled_from(["-1", "0", "1", "4", "5", "6", "7", "1e3", "x"])),
    st.tuples(st.sampled_from(["--pcie-bandwidth", "--nic-bandwidth", "--smp-bandwidth"]),
              st.sampled_from(["1e308 B/s", "400 B/s", "0", "-1 GB/s", "nan", "inf", "32 GB/s", "400Gb/s", "1 PB/s",
                               "10 PB/s", "x", "400"])),
    st.tuples(st.just("--name"), st.sampled_from(["t", "", "2024-01-01", "x: y", "a\nb", "é", "#", "null", "[x]"])),
), max_size=4)


@_examples(25)
@given(options=IMPORT_OPTIONS, file=st.sampled_from([NVSMI, XML, TOPO / "mi300x-8gpu-8nic-vm_rccl.xml"]))
def test_fuzz_topo_import_options(previous, options, file):
    _imports(previous, [str(file)], [part for option in options for part in option])


WORKLOADS = {
    "collective": {"name": "c", "topology": "dgx-h100", "topology_params": {"nodes": 1},
                   "workload": {"kind": "collective", "collective": "allreduce", "bytes": "1 MiB", "dtype": "bf16"},
                   "algorithms": ["auto", "ring"]},
    "prefill": {"name": "p", "topology": "dgx-h100", "topology_params": {"nodes": 1},
                "workload": {"kind": "prefill", "model": {"heads": 8, "kv_heads": 8, "head_dim": 64}, "batch": 1,
                             "sequence": "8K", "dtype": "bf16", "causal": True, "layout": "zigzag",
                             "backward": False},
                "algorithms": ["ring", "allgather"]},
    "generate": {"name": "g", "topology": "dgx-h100", "topology_params": {"nodes": 1},
                 "workload": {"kind": "generate", "model": "llama-3.1-8b", "batch": 1, "prompt": "4K",
                              "new_tokens": 2, "prefill": "ring", "layout": "zigzag", "dtype": "bf16"},
                 "algorithms": ["ring", "tree"]},
}


# per kind, values a user may write for some keys: most run, some must be refused. Sizes stay out of 1e7 .. 1e17
# tokens: a prefill of 1e11 tokens is accepted and then takes tens of GB (and 1e13 fails its memory timeline), to
# be bounded where the prefill shape is checked; the fuzz must not start one
VARIANTS: dict[str, dict[str, list[object]]] = {
    "collective": {"collective": ["allreduce", "allgather", "reduce-scatter", "alltoall", "broadcast", "reduce", "x"],
                   "bytes": ["1 KiB", "64 MiB", "0 B", "-1 B", "1e30 B", 4096, "nan"], "dtype": ["fp32", "fp8", "x"]},
    "prefill": {"sequence": ["4K", "16K", 0, "1e18", 7], "layout": ["contiguous", "striped", "zigzag", "x"],
                "causal": [True, False, "x"], "backward": [True, False],
                "model": ["llama-3.1-8b", {"heads": 3, "kv_heads": 2, "head_dim": 64}, "bogus"]},
    "generate": {"prompt": ["1K", "8K", 0, "1e18"], "new_tokens": [1, 3, 0, -1, 10**9],
                 "prefill": ["ring", "allgather", "ulysses", "x"], "layout": ["contiguous", "striped", "zigzag"],
                 "model": ["llama-3.1-8b", "bogus"]},
}
ALGORITHMS = [["ring"], ["tree"], ["auto"], ["allgather"], ["ulysses"], ["single"], ["bogus"], []]
JUNK_VALUES = [None, "", "x", -1, 0, 1.5, True, [], {}, "nan", "inf", 10**30, 2**53 + 1, "1e9999", "../x", "\x00"]


@st.composite
def workload_tree(draw: st.DrawFn, kind: str) -> object:
    """A small scenario of ``kind`` with some keys set to values a user may write, some to junk, some removed, and
    unknown keys added."""
    tree = yaml.safe_load(yaml.safe_dump(WORKLOADS[kind]))
    work = tree["workload"]
    for key in draw(st.lists(st.sampled_from(sorted(VARIANTS[kind])), max_size=3, unique=True)):
        work[key] = draw(st.sampled_from(VARIANTS[kind][key]))
    for _ in range(draw(st.integers(0, 2))):
        target = draw(st.sampled_from([tree, work]))
        action = draw(st.sampled_from(["junk", "delete", "add"]))
        key = draw(st.sampled_from(sorted(target)))
        if action == "junk":
            target[key] = draw(st.sampled_from(JUNK_VALUES))
        elif action == "delete":
            del target[key]
        else:
            target[draw(st.sampled_from(["sweep", "zip", "workload.x", "contxt", "7"]))] = draw(
                st.sampled_from(JUNK_VALUES))
    if draw(st.booleans()):
        tree["algorithms"] = draw(st.sampled_from(ALGORITHMS))
    tree["topology_params"] = {"nodes": draw(st.sampled_from([1, 1, 2, 0]))}
    return tree


@_examples(10)
@given(data=st.data(), kind=st.sampled_from(sorted(WORKLOADS)))
def test_fuzz_workloads_run_or_exit_2_leaving_previous_results(previous, data, kind):
    tree = data.draw(workload_tree(kind))
    scen = previous / "w.yaml"
    scen.write_text(yaml.safe_dump(tree, allow_unicode=True) if isinstance(tree, dict) else "- not a mapping\n")
    out = previous / "w-out"
    out.mkdir(exist_ok=True)
    (out / "results.csv").write_text("previous\n")
    rc, err = run_cli(["run", str(scen), "-o", str(out), "--jobs", "1", "--no-report"])
    assert_clean(rc, err)
    event(f"exit {rc}")  # --hypothesis-show-statistics: how many ran, how many were refused
    if rc == 2:
        assert (out / "results.csv").read_text() == "previous\n"


PLAN_OPTIONS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["--ttft", "--tbt"]), st.sampled_from(["1s", "50ms", "0", "-1 s", "nan", "inf", "1e400 s",
                                                                      "1", "x", "1 us"])),
    st.tuples(st.sampled_from(["--tp", "--max-nodes"]), st.sampled_from(["0", "1", "2", "3", "-1", "x", "1e3"])),
    st.tuples(st.just("--set"), st.sampled_from(["workload.prompt=1M", "workload.prompt=0", "workload.tp=3",
                                                 "topology_params.nic_bandwidth=1 B/s", "workload.new_tokens=-1",
                                                 "nodes=1000000", "x", "workload.prefill=bogus"])),
    st.tuples(st.just("--force")), st.tuples(st.just("--topology"), st.sampled_from(["dgx-h100", "nope", "/dev/zero"])),
), max_size=4)


@_examples(8)
@given(options=PLAN_OPTIONS)
def test_fuzz_plan_ttft_options(previous, options):
    scen = previous / "g.yaml"
    scen.write_text(yaml.safe_dump(WORKLOADS["generate"]))
    out = previous / "plan.csv"
    out.write_text("previous\n")
    argv = ["plan", str(scen), "--ttft", "1s", *[part for option in options for part in option]]
    if "--max-nodes" not in argv:
        argv += ["--max-nodes", "2"]
    rc, err = run_cli([*argv, "-o", str(out)])
    assert_clean(rc, err)
    event(f"exit {rc}")  # --hypothesis-show-statistics: how many ran, how many were refused
    if rc == 2:
        assert out.read_text() == "previous\n"


@pytest.mark.parametrize(("kind", "field", "extra"), [
    ("prefill", "sequence", ""),
    ("generate", "prompt", ", new_tokens: 1"),
])
def test_a_sequence_past_two_to_the_31_is_refused_at_its_line(tmp_path, capsys, kind, field, extra):
    """1e12 tokens overflowed the 64-bit pair counts (every block looked empty: a latency with no attention in it);
    1e11 took the tile model past the memory. Both are refused where they are written; 2^31 is accepted."""
    out = tmp_path / "out"
    for tokens in (10**12, 10**11, 2**31 + 1):
        text = (f"name: big\ntopology: dgx-h100\ntopology_params: {{nodes: 1}}\n"
                f"workload: {{kind: {kind}, model: {{heads: 32, kv_heads: 8, head_dim: 128}}, {field}: {tokens}"
                f"{extra}}}\nalgorithms: [ring]\n")
        scenario = _write(tmp_path, "big.yaml", text)
        err = _refused(["run", scenario, "-o", str(out), "--no-report"], capsys)
        assert f"{scenario}:4: workload.{field}: must be at most 2,147,483,648 tokens (2^31)" in err, err
        assert not out.exists()


def test_force_is_an_option_wherever_a_refusal_offers_it(tmp_path, capsys):
    """The refusal of an implausible value says `--force uses it anyway`: topo import, validate and calibrate take
    it (they refused it as an unknown option)."""
    out = tmp_path / "t.yaml"
    argv = ["topo", "import", str(NVSMI), "-o", str(out), "--nic-bandwidth", "400 B/s"]
    assert "--force uses it anyway" in _refused(argv, capsys) and not out.exists()
    assert main([*argv, "--force"]) == 0 and out.exists()
    capsys.readouterr()
    # a topology file with an implausible link: refused with the hint, then taken with --force
    bad = _write(tmp_path, "slow.yaml", out.read_text().replace("bandwidth: 300 GB/s", "bandwidth: 300 B/s", 1))
    for verb in (["validate", "--nccl-tests", str(ALLREDUCE), "--topology", bad, "-o", str(tmp_path / "v")],
                 ["calibrate", "--from-nccl-tests", str(ALLREDUCE), "--topology", bad, "-o",
                  str(tmp_path / "fitted.yaml")]):
        err = _refused(verb, capsys)
        assert "--force uses it anyway" in err, err
        assert "unrecognized arguments" not in _refused([*verb, "--force"], capsys)  # taken; refused for another cause


def test_validate_nccl_tests_leaves_no_folder_when_refused(tmp_path, capsys):
    out = tmp_path / "new" / "v"
    zero = _write(tmp_path, "zero.log", _all_rows(ALLREDUCE.read_text(), {7: "0.00", 11: "0.00"}))
    _refused(["validate", "--nccl-tests", zero, "--topology", "dgx-h100", "--set", "topology_params.nodes=2", "-o",
              str(out)], capsys)
    assert not out.exists()
