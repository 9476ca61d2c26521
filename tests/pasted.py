"""The outputs pasted in README.md and docs/*.md, run again: a block of a Markdown file whose first line is
``$ command`` holds that command's output (several ``$`` lines: each command's output follows it; a ``...`` line
leaves lines out). Each command runs from a scratch folder that sees the repository's ``benchmarks``, ``scenarios``,
``reports`` and ``topologies`` (its ``-o out/...`` lands there), its standard output and error together, and the
pasted lines must appear in it in order, each run of lines between two ``...`` contiguous. A benchmark's command
(``python benchmarks/...``: it prints wall times) is not checked.

    python tests/pasted.py [FILE ...] [--match TEXT] [--timeout S]    # every pasted command of the files, checked

prints each block as ``same`` or its difference, and exits 1 if any differs. ``tests/test_pasted_outputs.py`` runs
the cheap ones (tables read from committed results, ``treering run ... --no-report``) in the suite.
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = ("benchmarks", "scenarios", "tests", "reports", "topologies")  # what the commands read, in the repository
NOTICES = ("treering: compiling", "treering:   ")  # a first run's compile notices (stderr), not a command's output
TIMED = "python benchmarks/"  # a benchmark prints its wall times: not checked


@dataclass(frozen=True)
class Pasted:
    """One pasted command: where (file, 1-based line), the command, and the lines pasted after it."""

    path: Path
    line: int
    command: str
    expected: tuple[str, ...]

    def __str__(self) -> str:
        where = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{where}:{self.line}"


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def pasted(path: Path) -> list[Pasted]:
    """Every command pasted with its output in ``path`` (a block opened by a ``$`` line; a block's later ``$`` lines
    start commands of their own)."""
    found: list[Pasted] = []
    inside, current = False, None
    for number, text in enumerate(path.read_text().split("\n"), start=1):
        if text.startswith("```"):
            if current is not None:
                found.append(Pasted(path, current[0], current[1], tuple(_trimmed(current[2]))))
            inside, current = not inside, None
        elif inside and text.startswith("$ "):
            if current is not None:
                found.append(Pasted(path, current[0], current[1], tuple(_trimmed(current[2]))))
            current = None if TIMED in text else (number, text[2:], [])
        elif current is not None:
            current[2].append(text)
    return found


def _trimmed(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def scratch(folder: Path) -> Path:
    """``folder`` with links to what the commands read (created once)."""
    for name in SHARED:
        link = folder / name
        if not link.exists():
            link.symlink_to(REPO / name)
    return folder


def run(block: Pasted, folder: Path, timeout: float = 600.0) -> list[str]:
    """The command's output (stdout and stderr interleaved, compile notices left out), run by bash in ``folder``
    with this Python's scripts (``treering``, ``python``) first on the PATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "200"}
    done = subprocess.run(["bash", "-c", block.command], cwd=folder, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)
    return _trimmed([line for line in done.stdout.split("\n") if not line.startswith(NOTICES)])


def difference(expected: tuple[str, ...], actual: list[str]) -> str | None:
    """``None`` where every run of pasted lines (between ``...`` lines) appears in ``actual``, in order; else a diff
    of the first run that does not against the output."""
    runs: list[list[str]] = [[]]
    for line in expected:
        if line.strip() == "...":
            runs.append([])
        else:
            runs[-1].append(line)
    at = 0
    for lines in runs:
        if not lines:
            continue
        hit = next((k for k in range(at, len(actual) - len(lines) + 1) if actual[k:k + len(lines)] == lines), None)
        if hit is None:
            return "\n".join(difflib.unified_diff(lines, actual[at:], "pasted", "printed now", lineterm="", n=1))
        at = hit + len(lines)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md and docs/*.md)")
    ap.add_argument("--match", default="", help="only the commands that contain this text")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds a command may run (default 1800)")
    args = ap.parse_args(argv)
    files = [p.resolve() for p in args.files] or markdown_files()
    missing = [p for p in files if not p.is_file()]
    if missing:
        print(f"pasted: {missing[0]}: no such file", file=sys.stderr)
        return 2
    differ = 0
    with tempfile.TemporaryDirectory(prefix="pasted-") as tmp:
        folder = scratch(Path(tmp))
        for path in files:
            for block in pasted(path):
                if args.match not in block.command:
                    continue
                began = time.perf_counter()
                try:
                    diff = difference(block.expected, run(block, folder, args.timeout))
                except subprocess.TimeoutExpired:
                    diff = f"(no output within {args.timeout:g} s)"
                seconds = time.perf_counter() - began
                print(f"{block} ({seconds:.1f} s): {'same' if diff is None else 'differs'}  $ {block.command[:90]}")
                if diff is not None:
                    differ += 1
                    print(diff)
    print(f"{differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
