"""The local launcher's limits (simulator/distributed/launch.py): the whole run within its timeout, or, with a marker
file, a local phase first (calibrate's kernel profiles on rank 0) that the timeout does not count."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.distributed import launch
from simulator.distributed.launch import RankFailure, spawn


@pytest.fixture
def fake_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Ranks that are a shell script instead of ``python -m simulator.distributed``: rank 0 works ``$PHASE``
    seconds, creates ``$MARK``, then ``$AFTER`` seconds more; the others wait for the marker, as calibrate's do."""
    script = tmp_path / "rank.sh"
    script.write_text('#!/bin/sh\nif [ "$RANK" = 0 ]; then sleep "$PHASE"; touch "$MARK"; sleep "$AFTER"; else\n'
                      'while [ ! -e "$MARK" ]; do sleep 0.05; done; fi\n')
    script.chmod(0o755)
    monkeypatch.setattr(launch.sys, "executable", str(script))
    mark = tmp_path / "profiled"
    monkeypatch.setenv("MARK", str(mark))
    return mark


def phases(monkeypatch: pytest.MonkeyPatch, before: float, after: float) -> None:
    monkeypatch.setenv("PHASE", str(before))
    monkeypatch.setenv("AFTER", str(after))


def test_the_timeout_counts_from_the_marker(fake_ranks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    phases(monkeypatch, 1.5, 0.2)  # a local phase three times the timeout, then a short run
    spawn(2, [], 0.5, marker=fake_ranks)
    assert fake_ranks.exists()


def test_without_a_marker_the_whole_run_counts(fake_ranks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    phases(monkeypatch, 1.5, 0.2)
    with pytest.raises(RankFailure, match=r"timed out after 0.5 s; ranks still running: \[0, 1\]"):
        spawn(2, [], 0.5)


def test_the_phase_before_the_marker_has_its_own_limit(fake_ranks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    phases(monkeypatch, 30, 0)  # a phase that does not end: stopped at its limit, every rank killed
    with pytest.raises(RankFailure, match=r"timed out after 0\.6 s before the ranks' local phase was done"):
        spawn(2, [], 0.3, marker=fake_ranks, before_marker_s=0.6)
    assert not fake_ranks.exists()


def test_after_the_marker_the_timeout_still_holds(fake_ranks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    phases(monkeypatch, 0.2, 30)
    with pytest.raises(RankFailure, match=r"timed out after 0.5 s; ranks still running: \[0\]"):
        spawn(2, [], 0.5, marker=fake_ranks)
