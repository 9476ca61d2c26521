"""Cost (simulator.cluster.prices, a scenario's cost:): the price table, the arithmetic, the rows, refusals."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main
from simulator.cluster.presets import list_presets
from simulator.cluster.prices import HOURS_PER_YEAR, load_offers, owned, usd_per_m_tokens
from simulator.cluster.topology import device_library
from simulator.errors import InputError
from simulator.run.prepare import run_point
from simulator.run.scenario import load_scenario


def test_the_price_table_cites_every_offer_for_a_known_device() -> None:
    offers = load_offers()
    devices = device_library()
    assert len(offers) >= 5
    for offer in offers.values():
        assert offer.source and offer.date
        assert offer.device in devices
        assert 0 < offer.usd_per_gpu_hour < 100
    assert "prices" not in list_presets() and "devices" not in list_presets()


def test_an_owned_gpu_costs_its_write_off_plus_its_power() -> None:
    o = owned({"usd_per_gpu": 33750, "years": 5, "tdp_watts": 700, "pue": 1.2, "usd_per_kwh": 0.08})
    assert o.usd_per_gpu_hour == pytest.approx(33750 / (5 * HOURS_PER_YEAR) + 0.7 * 1.2 * 0.08, rel=1e-15)
    assert load_offers()["owned-h100"].usd_per_gpu_hour == o.usd_per_gpu_hour
    with pytest.raises(InputError, match=r"owned\.pue: must be a number in"):
        owned({"usd_per_gpu": 1, "years": 5, "tdp_watts": 700, "pue": 0.5, "usd_per_kwh": 0.08})
    with pytest.raises(InputError, match=r"owned\.years: must be a number in"):
        owned({"usd_per_gpu": 1, "years": 0, "tdp_watts": 700, "pue": 1.2, "usd_per_kwh": 0.08})


def test_dollars_per_million_tokens() -> None:
    # $36/h for 1 s yields 10 tokens: a cent for 10 tokens, $1,000 per million
    assert usd_per_m_tokens(36.0, 1.0, 10) == pytest.approx(1000.0, rel=1e-15)


GENERATE = """
name: g
topology: dgx-h100
workload: {kind: generate, model: llama-3.1-8b, scope: model, tp: 8, batch: 4, prompt: 4K, new_tokens: 2,
           prefill: ring, dtype: bf16}
algorithms: [ring]
cost: %s
"""


def _rows(tmp_path: Path, text: str, *sets: str) -> list[dict[str, object]]:
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(text))
    (point,) = load_scenario(path, sets)
    return run_point(point)


def test_a_generate_row_costs_its_gpus_for_its_time_per_output_token(tmp_path: Path) -> None:
    (row,) = _rows(tmp_path, GENERATE % "{offer: aws-capacity-block-h100}")
    price = load_offers()["aws-capacity-block-h100"].usd_per_gpu_hour
    assert row["usd_per_hour"] == 8 * price
    tpot, latency, batch = row["tpot_s"], row["latency_s"], row["batch"]
    assert row["usd_per_m_tokens"] == pytest.approx(8 * price * tpot / 3600 / batch * 1e6, rel=1e-12)  # type: ignore
    assert row["usd_per_request"] == pytest.approx(8 * price * latency / 3600 / batch, rel=1e-12)  # type: ignore
    (own,) = _rows(tmp_path, GENERATE % "{usd_per_gpu_hour: 2}")
    assert own["usd_per_hour"] == 16.0 and own["tpot_s"] == tpot


TRAIN = """
    name: tc
    topology: dgx-h100
    topology_params: {nodes: 2}
    workload:
      kind: train
      model: llama-3.1-8b
      sequence: 8K
      global_batch: 256K
      parallel: {tp: 8, cp: 1, pp: 1, dp: 2}
    cost: {usd_per_gpu_hour: 3}
    """


def test_a_training_step_costs_its_gpus_for_its_step(tmp_path: Path) -> None:
    (row,) = _rows(tmp_path, TRAIN)
    step, tokens = row["step_s"], row["tokens_per_s"] * row["step_s"]  # type: ignore[operator]
    assert row["usd_per_hour"] == 48.0 and tokens == pytest.approx(256 * 1024, rel=1e-12)
    assert row["usd_per_step"] == pytest.approx(48.0 * step / 3600, rel=1e-12)  # type: ignore[operator]
    assert row["usd_per_m_tokens"] == pytest.approx(48.0 * step / 3600 / tokens * 1e6, rel=1e-12)  # type: ignore


def test_attention_rows_get_a_price_per_hour_only_and_faults_change_what_is_paid(tmp_path: Path) -> None:
    text = """
        name: d
        topology: dgx-h100
        topology_params: {nodes: 2}
        workload: {kind: decode, model: {heads: 16, head_dim: 128}, context: 64000, dtype: bf16}
        algorithms: [tree]
        cost: {usd_per_gpu_hour: 3}
        """
    (row,) = _rows(tmp_path, text)
    assert row["usd_per_hour"] == 48.0 and "usd_per_m_tokens" not in row
    (row,) = _rows(tmp_path, text, "faults=[{node: n1, down: true}]")
    assert row["usd_per_hour"] == 24.0


@pytest.mark.parametrize(("cost", "message"), [
    ("{offer: tensorwave-mi300x}", "cost.offer: offer tensorwave-mi300x prices mi300x GPUs; this cluster's are "
                                   "h100-sxm"),
    ("{offer: nope}", "cost.offer: unknown offer 'nope'; offers of topologies/prices.yaml: aws-p5-on-demand"),
    ("{usd_per_gpu_hour: 0}", "cost.usd_per_gpu_hour: must be a number of dollars in (0, 1000], got 0"),
    ("{usd_per_gpu_hour: 2, offer: owned-h100}", "cost: give one of offer, usd_per_gpu_hour, owned"),
    ("{owned: {usd_per_gpu: 1}}", "cost.owned: years: must be a number in (0, 50], got None"),
])
def test_bad_costs_are_one_located_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], cost: str,
                                        message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(GENERATE % cost))
    assert main(["run", str(path), "-o", str(tmp_path / "o"), "--jobs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"treering: error: {path}:7: {message}")
    assert not (tmp_path / "o" / "results.csv").exists()


def test_plan_by_cost_prices_each_topology_and_puts_the_cheapest_first(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.csv"
    assert main(["plan", "--model", "llama-3.1-8b", "--context", "32K", "--tbt", "50ms", "--objective", "cost",
                 "--topology", "dgx-h100,mi300x", "--algorithms", "ring", "--max-nodes", "2", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "dgx-h100: h100-sxm at $3.78/GPU-hour (lambda-h100-sxm, the cheapest rented offer" in said
    frame = pd.read_csv(out)
    assert list(frame["topology"]) == ["mi300x", "dgx-h100"]  # both meet it; MI300X's GPU-hour is cheaper
    assert frame["met"].all()
    for row in frame.itertuples():
        assert row.usd_per_hour == pytest.approx(row.gpus * row.usd_per_gpu_hour, rel=1e-12)
        assert row.usd_per_m_tokens == pytest.approx(row.usd_per_hour * row.tbt_ms / 1e3 / 3600 * 1e6, rel=1e-9)
    assert main(["plan", "--model", "llama-3.1-8b", "--context", "32K", "--tbt", "50ms", "--objective", "cost",
                 "--topology", "dgx-h100", "--offers", "tensorwave-mi300x", "--max-nodes", "1"]) == 2
    assert "--offers: no offer prices h100-sxm GPUs" in capsys.readouterr().err
    assert main(["plan", "--model", "llama-3.1-8b", "--context", "32K", "--tbt", "50ms",
                 "--topology", "dgx-h100,mi300x"]) == 2
    assert "--topology: one topology (several need --objective cost)" in capsys.readouterr().err
