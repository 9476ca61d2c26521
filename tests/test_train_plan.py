"""treering plan --train: the search's bound is a bound, its answer the fastest of every layout that fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.cluster.topology import load_topology
from simulator.models.presets import PRESETS
from simulator.plan.train import TrainRequest, layouts, plan_train
from simulator.schedule.memory import usable_bytes
from simulator.training.step import StepCache, compose, stage_memory, step_pieces, train_step


def test_the_plan_is_the_fastest_of_every_layout_that_fits() -> None:
    cluster = load_topology("dgx-h100", {"nodes": 1})
    req = TrainRequest("llama-3.2-1b", 8192, 8 * 8192, 8)
    plan = plan_train(req, cluster)
    capacity = usable_bytes(cluster.specs[cluster.ranks[0]].mem_bytes, 0.9)
    cache = StepCache()
    steps = []
    for wl in layouts(req, PRESETS[req.model], 8):
        if max(m.total for m in stage_memory(wl)) > capacity:
            continue
        full = train_step(wl, cluster, 0.9, cache)
        bound = compose(wl, step_pieces(wl, cluster, None, cache), None, cluster)[0]
        assert bound <= full.step_s * (1 + 1e-12)
        steps.append(full.step_s)
    assert len(steps) > 10
    assert plan.rows[0]["step_s"] == pytest.approx(min(steps), rel=1e-12)
    assert plan.rows[1]["step_s"] == pytest.approx(sorted(steps)[1], rel=1e-12)
    assert plan.candidates - plan.over_memory == len(steps)


def test_plan_train_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", "--train", "--model", "llama-3.2-1b", "--sequence", "8K", "--global-batch", "64K",
                 "--gpus", "8", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fastest: TP" in text and "runner-up: TP" in text and "binding:" in text
    assert "kind: train" in text and "reproduce: treering plan --train" in text
    doc = json.loads(out.read_text())
    assert doc["rows"][0]["step_s"] <= doc["rows"][1]["step_s"]


def test_plan_train_finds_the_fewest_gpus_meeting_a_step_time(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--train", "--model", "llama-3.2-1b", "--sequence", "8K", "--global-batch", "256K"]
    assert main([*base, "--max-gpus", "32"]) == 0
    text = capsys.readouterr().out
    fastest = {int(line.split(" on ")[1].split()[0]): float(line.rsplit("fastest ", 1)[1].split()[0])
               for line in text.splitlines() if "bounded out; fastest" in line}
    assert sorted(fastest) == [8, 16, 32]
    assert fastest[32] < fastest[16] < fastest[8]
    target = (fastest[16] + fastest[8]) / 2  # met on 16 GPUs, not on 8
    assert main([*base, "--max-gpus", "32", "--step-time", f"{target}s"]) == 0
    text = capsys.readouterr().out
    assert "met on 16 GPUs" in text and " on 32 GPUs" not in text
    assert "--gpus 16" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--sequence", "8K", "--global-batch", "64K", "--gpus", "8"], "--model: required with --train"),
    (["--model", "llama-3.2-1b", "--sequence", "8K", "--global-batch", "64K", "--gpus", "12"],
     "--gpus: 12 GPUs are not whole servers"),
    (["--model", "llama-3.2-1b", "--sequence", "8K", "--global-batch", "64K", "--gpus", "8", "--context", "1K"],
     "--context: does not apply to plan --train"),
    (["--model", "llama-3.2-1b", "--sequence", "8Q", "--global-batch", "64K", "--gpus", "8"], "--sequence"),
    (["--model", "llama-3.2-1b", "--sequence", "8K", "--global-batch", "64K"], "--gpus: give one of --gpus N"),
    (["--model", "llama-3.2-1b", "--sequence", "8K", "--global-batch", "64K", "--max-gpus", "8", "--step-time",
      "2"], "--step-time: give a unit"),
    (["--model", "llama-3.2-1b", "--sequence", "8K", "--global-batch", "64K", "--max-gpus", "4"],
     "--max-gpus: less than one server"),
])
def test_plan_train_refuses_bad_flags(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--train", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_plan_searches_placements_and_a_shared_cache_keeps_them_apart() -> None:
    from simulator.plan.train import PLACEMENTS

    cluster = load_topology("dgx-h100", {"nodes": 2})
    req = TrainRequest("llama-3.2-1b", 8192, 16 * 8192, 16)
    both = [wl for wl in layouts(req, PRESETS[req.model], 8)
            if (wl.parallel.tp, wl.parallel.pp, wl.parallel.dp, wl.zero, wl.recompute, wl.parallel.virtual_stages)
            == (4, 2, 2, 0, "none", 1)]
    assert sorted("-".join(wl.placement) for wl in both) == sorted(PLACEMENTS)
    cache = StepCache()
    shared = [train_step(wl, cluster, 0.9, cache) for wl in both]
    alone = [train_step(wl, cluster, 0.9) for wl in both]
    assert [s.step_s for s in shared] == [s.step_s for s in alone]
    # tp 4 on 8-GPU servers: by default the stages share a server and the replicas do not; DP inside PP swaps them
    default, swapped = (shared[0], shared[1]) if both[0].placement == ("tp", "cp", "pp", "dp") else shared[::-1]
    assert default.exposed["pp"] < swapped.exposed["pp"]
    assert default.step_s != swapped.step_s
