"""kind: train end to end: rows and columns, located errors before any simulation, the prefill pointer."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.cluster.topology import load_topology
from simulator.run.kinds import KINDS
from simulator.run.rows import names
from simulator.training.placement import CANONICAL, placed, placed_order

TRAIN = """
name: t
topology: dgx-h100
topology_params: {nodes: 2}
workload:
  kind: train
  model: {heads: 8, kv_heads: 4, head_dim: 64, layers: 4, hidden: 512, intermediate: 1024, vocab: 1000}
  sequence: 8K
  global_batch: 64K
  micro_batch: 1
  dtype: bf16
  parallel: {tp: 4, cp: 2, pp: 2, dp: 1, cp_algorithm: ring, layout: zigzag, sequence_parallel: true}
  zero: 1
  recompute: selective
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_train_rows(tmp_path: Path) -> None:
    text = TRAIN + "sweep:\n  workload.parallel.cp_algorithm: [ring, allgather, ulysses]\n"  # 16 GPUs: 4 x 2 x 2
    assert main(["run", str(write(tmp_path, text)), "-o", str(tmp_path / "o"), "--jobs", "1"]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    cols = names(KINDS["train"].columns)
    assert list(df.columns[: len(cols)]) == list(cols)
    assert list(df["algorithm"]) == ["ring", "allgather", "ulysses"]
    assert (df["latency_s"] == df["step_s"]).all()
    assert ((df["tokens_per_s"] * df["step_s"] - 65536).abs() < 1e-6).all()
    assert (df["micro_batches"] == 8).all()
    assert ((df["mfu"] - df["tflops_per_gpu"] * 1e12 / 989.4e12).abs() < 1e-3).all()
    assert ((df["bubble_frac"] > 0) & (df["bubble_frac"] < 1)).all()
    assert (df["dp_exposed_s"] > 0).all()  # dp 1, but cp 2: the gradients are reduced over DP x CP
    assert df["binding"].isin(["tp", "cp", "pp", "dp", "bubble", "compute"]).all()
    report = (tmp_path / "o" / "report.md").read_text()
    assert "Besides compute, the step is bound by" in report


@pytest.mark.parametrize(("change", "expected"), [
    (("dp: 1", "dp: 2"), "t.yaml:12: workload.parallel: tp x cp x pp x dp = 4 x 2 x 2 x 2 = 32, but the "
                         "topology has 16 GPUs"),
    (("pp: 2, dp: 1", "pp: 8, dp: 1"), "t.yaml:12: workload.parallel"),  # 64 GPUs: the product first
    (("global_batch: 64K", "global_batch: 60K"), "t.yaml:9: workload.global_batch: global_batch (61440 tokens) is "
                                                 "not a whole number"),
    (("micro_batch: 1", "micro_batch: 3"), "t.yaml:9: workload.global_batch: 8 sequences per step do not split"),
    (("sequence: 8K", "sequence: 8190"), "t.yaml:9: workload.global_batch"),
    (("cp_algorithm: ring", "cp_algorithm: ulysses"), None),  # 8 heads / tp 4 = 2 over cp 2: fine
    (("zero: 1", "zero: 4"), "t.yaml:13: workload.zero"),
    (("sequence_parallel: true", "sequence_parallel: true, virtual_stages: 3"),
     "t.yaml:12: workload.parallel.virtual_stages: pp x virtual_stages = 2 x 3 chunks is more than the model's 4"),
    (("global_batch: 64K", "global_batch: 24K"), None),  # 3 micro-batches over pp 2: fine without interleaving
])
def test_train_errors_are_located(change: tuple[str, str], expected: str | None, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, TRAIN.replace(*change))
    code = main(["run", str(path), "-o", str(tmp_path / "o"), "--no-report", "--jobs", "1"])
    if expected is None:
        assert code == 0
        return
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"treering: error: {tmp_path}/{expected}"), err
    assert not (tmp_path / "o").exists()


def test_pp_beyond_the_layers_and_a_layout_the_sequence_cannot_take(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    text = TRAIN.replace("pp: 2", "pp: 8").replace("cp: 2", "cp: 1").replace("tp: 4", "tp: 2")  # 16 GPUs, 4 layers
    assert main(["run", str(write(tmp_path, text)), "-o", str(tmp_path / "o")]) == 2
    assert "workload.parallel.pp: pp (8) is more than the model's 4 layers" in capsys.readouterr().err
    text = TRAIN.replace("sequence: 8K", "sequence: 8196").replace("global_batch: 64K", "sequences: 8")  # 4 x 2049
    assert main(["run", str(write(tmp_path, text)), "-o", str(tmp_path / "o2"), "--no-report"]) == 0
    text = TRAIN.replace("sequence: 8K", "sequence: 8194").replace("global_batch: 64K", "sequences: 8")
    assert main(["run", str(write(tmp_path, text)), "-o", str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err
    assert "t.yaml:" in err and "workload.parallel.layout: layout zigzag over cp = 2 cuts the sequence into 4" in err


def test_interleaving_needs_whole_groups_of_micro_batches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = TRAIN.replace("global_batch: 64K", "global_batch: 24K").replace("sequence_parallel: true",
                                                                           "sequence_parallel: true, virtual_stages: 2")
    assert main(["run", str(write(tmp_path, text)), "-o", str(tmp_path / "o")]) == 2
    assert "t.yaml:12: workload.parallel.virtual_stages: interleaved 1F1B needs the micro-batches per replica (3) a " \
           "multiple of pp (2)" in capsys.readouterr().err
    text = TRAIN.replace("sequence_parallel: true", "sequence_parallel: true, virtual_stages: 2")
    assert main(["run", str(write(tmp_path, text)), "-o", str(tmp_path / "o2"), "--no-report"]) == 0


def test_algorithms_do_not_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(write(tmp_path, TRAIN + "algorithms: [ring]\n")), "-o", str(tmp_path / "o")]) == 2
    assert "algorithms: a train workload's attention schedule is workload.parallel.cp_algorithm" in \
        capsys.readouterr().err


def test_prefill_of_a_whole_model_with_backward_points_to_train(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    text = """
    name: p
    topology: dgx-h100
    workload: {kind: prefill, model: llama-3.1-8b, scope: model, sequence: 8K, backward: true}
    algorithms: [ring]
    """
    assert main(["run", str(write(tmp_path, text)), "-o", str(tmp_path / "o")]) == 2
    assert "kind: train" in capsys.readouterr().err


JUNK: list[object] = [None, "", "x", -1, 0, 1.5, True, [], {}, "nan", 10**30, "1e9999"]
VARIANTS: dict[str, list[object]] = {
    "sequence": ["1K", "8K", 7, 0, "1e18"], "global_batch": ["8K", "64K", "1M", "1e15", 0],
    "micro_batch": [1, 2, 3, 10**6], "dtype": ["fp32", "fp8", "fp64", "x"], "zero": [0, 1, 2, 3, 4],
    "recompute": ["none", "selective", "full", "x"], "optimizer": ["adam", "sgd", "x"],
    "bucket": ["1 MB", "1 B", "25 MB", 5], "model": ["llama-3.2-1b", "bogus", {"heads": 8, "head_dim": 64}],
    "parallel": [{"tp": 8}, {"tp": 2, "cp": 2, "pp": 2}, {"tp": 2, "cp": 4, "cp_algorithm": "ulysses"},
                 {"cp": 8, "layout": "striped", "cp_algorithm": "allgather"}, {"tp": 3}, {"pp": 8},
                 {"tp": 4, "dp": 2, "sequence_parallel": True}, {"dp": 8}, {"tp": 0}, {"tp": 8, "x": 1},
                 {"tp": 2, "pp": 4, "virtual_stages": 2}, {"tp": 4, "pp": 2, "virtual_stages": 9}],
}


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_fuzz_train_inputs_run_or_exit_2(data: st.DataObject, tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    tree = yaml.safe_load(textwrap.dedent(TRAIN))
    tree["topology_params"] = {"nodes": 1}
    tree["workload"]["parallel"] = {"tp": 2, "cp": 2, "pp": 2}
    work = tree["workload"]
    for key in data.draw(st.lists(st.sampled_from(sorted(VARIANTS)), max_size=3, unique=True)):
        work[key] = data.draw(st.sampled_from(VARIANTS[key]))
    if data.draw(st.booleans()):
        work[data.draw(st.sampled_from(sorted(work)))] = data.draw(st.sampled_from(JUNK))
    path = tmp / "t.yaml"
    path.write_text(yaml.safe_dump(tree))
    assert main(["run", str(path), "-o", str(tmp / "o"), "--no-report", "--jobs", "1"]) in (0, 2)


# workload.placement: which GPU holds which (TP, CP, PP, DP) coordinates (docs/training.md, Placement)
@settings(max_examples=60, deadline=None)
@given(sizes=st.tuples(*[st.integers(1, 4)] * 4), order=st.permutations(CANONICAL))
def test_placed_order_puts_each_coordinate_where_the_order_says(sizes: tuple[int, ...], order: list[str]) -> None:
    dims = dict(zip(CANONICAL, sizes, strict=True))
    gpus = placed_order(dims, order)
    assert sorted(gpus) == list(range(len(gpus)))  # every GPU once
    for coords in itertools.product(*(range(dims[d]) for d in reversed(CANONICAL))):
        at = dict(zip(reversed(CANONICAL), coords, strict=True))
        canonical = at["tp"] + dims["tp"] * (at["cp"] + dims["cp"] * (at["pp"] + dims["pp"] * at["dp"]))
        gpu, stride = 0, 1
        for d in order:  # the GPU's coordinates vary in ``order``, fastest first
            gpu += at[d] * stride
            stride *= dims[d]
        assert gpus[canonical] == gpu
    if tuple(order) == CANONICAL:
        assert gpus == list(range(len(gpus)))


def test_placed_cluster_shares_the_graph_and_is_memoised() -> None:
    cluster = load_topology("dgx-h100", {"nodes": 2})
    sizes = {"tp": 4, "cp": 2, "pp": 2, "dp": 1}
    assert placed(cluster, sizes, CANONICAL) is cluster
    view = placed(cluster, sizes, ("cp", "tp", "pp", "dp"))
    assert view is placed(cluster, sizes, ("cp", "tp", "pp", "dp"))
    assert view.graph is cluster.graph and sorted(view.ranks) == sorted(cluster.ranks)
    assert view.ranks[:4] == tuple(cluster.ranks[i] for i in (0, 2, 4, 6))  # a TP group: every other GPU


def _run(tmp_path: Path, text: str, name: str) -> pd.DataFrame:
    assert main(["run", str(write(tmp_path, text)), "-o", str(tmp_path / name), "--no-report", "--jobs", "1"]) == 0
    return pd.read_csv(tmp_path / name / "results.csv")


def test_the_default_placement_is_tp_cp_pp_dp_and_a_placement_moves_the_traffic(tmp_path: Path) -> None:
    base = _run(tmp_path, TRAIN, "a")
    same = _run(tmp_path, TRAIN.replace("zero: 1", "zero: 1\n  placement: [tp, cp, pp, dp]"), "b")
    assert base.loc[0, "placement"] == same.loc[0, "placement"] == "tp-cp-pp-dp"
    assert base.loc[0, "step_s"] == same.loc[0, "step_s"]  # the same floats
    # 16 GPUs on 2 servers, tp 4 x cp 2 x pp 2: by default the stages are on different servers; with pp inside TP
    # and CP both stages share each server and the stage-to-stage sends go over NVLink, TP over both servers
    swapped = _run(tmp_path, TRAIN.replace("zero: 1", "zero: 1\n  placement: pp-tp-cp-dp"), "c")
    assert swapped.loc[0, "placement"] == "pp-tp-cp-dp"
    assert swapped.loc[0, "pp_exposed_s"] < base.loc[0, "pp_exposed_s"]
    assert swapped.loc[0, "tp_exposed_s"] > base.loc[0, "tp_exposed_s"]


@pytest.mark.parametrize(("placement", "expected"), [
    ("tp-cp-pp", "workload.placement: must name each of tp, cp, pp and dp once"),
    ("[tp, cp, pp, pp]", "workload.placement: must name each of tp, cp, pp and dp once"),
    ("tp-cp-pp-dp-ep", "workload.placement.4: must be one of 'tp', 'cp', 'pp' or 'dp', got 'ep'"),
    ("tp-cp-pp-xx", "workload.placement.3: must be one of 'tp', 'cp', 'pp' or 'dp', got 'xx'"),
])
def test_a_placement_that_is_not_an_order_of_the_four_is_refused(placement: str, expected: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, TRAIN.replace("zero: 1", f"zero: 1\n  placement: {placement}"))
    assert main(["run", str(path), "-o", str(tmp_path / "o"), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"t.yaml:14: {expected}" in err, err
    assert not (tmp_path / "o").exists()
