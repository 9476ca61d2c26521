"""kind: train: the closed forms a training step must meet (docs/training.md)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cluster.topology import load_topology
from simulator.collectives import collective
from simulator.engine.core import simulate
from simulator.models.presets import PRESETS, custom_model
from simulator.schedule.core import Schedule
from simulator.training.dp import DPCollectives, bucket_sizes, equal_buckets_end, overlapped_end, under
from simulator.training.layer import dense_pass, dense_servers
from simulator.training.memory import in_flight, layer_activation_bytes, model_state_bytes, optimizer_k
from simulator.training.pipeline import DPStreams, Pipeline, interleaved_order, one_f_one_b, peak_in_flight, stage_order
from simulator.training.step import model_flops, optimizer_time, stage_layers, stage_params, train_step
from simulator.workloads.train import TrainWorkload

SMALL = {"heads": 8, "kv_heads": 4, "head_dim": 64, "layers": 4, "hidden": 512, "intermediate": 1024, "vocab": 1000}


@pytest.fixture(scope="module")
def two_nodes():  # type: ignore[no-untyped-def]
    return load_topology("dgx-h100", {"nodes": 2})


def workload(**kw: object) -> TrainWorkload:
    base: dict[str, object] = {"kind": "train", "model": SMALL, "sequence": 4096, "sequences": 8, "micro_batch": 1}
    base.update(kw)
    return TrainWorkload.model_validate(base)


# -- the pipeline ---------------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 12), m=st.integers(1, 24), f=st.floats(0.01, 5), b=st.floats(0.01, 5))
def test_1f1b_of_equal_stages_takes_m_plus_p_minus_1_slots_and_its_bubble(p: int, m: int, f: float, b: float) -> None:
    pipe = one_f_one_b([f] * p, [b] * p, m)
    assert pipe.makespan == pytest.approx((m + p - 1) * (f + b), rel=1e-9)
    assert pipe.bubble_frac == pytest.approx((p - 1) / (m + p - 1), rel=1e-9, abs=1e-12)


@given(p=st.integers(1, 10), m=st.integers(1, 20))
def test_each_stage_runs_every_forward_and_backward_once_backward_after_forward(p: int, m: int) -> None:
    for s in range(p):
        order = stage_order(s, p, m)
        assert sorted(order) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        assert all(order.index(("F", i)) < order.index(("B", i)) for i in range(m))
        # 1F1B holds at most p - s forwards without their backward
        live = peak = 0
        for kind, _ in order:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert peak == in_flight(s, p, m)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 8), v=st.integers(2, 4), groups=st.integers(1, 4), f=st.floats(0.01, 5),
       b=st.floats(0.01, 5))
def test_interleaved_1f1b_shrinks_the_bubble_v_times(p: int, v: int, groups: int, f: float, b: float) -> None:
    """Narayanan et al. (arXiv:2104.04473, section 2.2.2): with v chunks per stage the bubble is (p - 1)(f + b) / v."""
    m = p * groups
    pipe = one_f_one_b([f / v] * (p * v), [b / v] * (p * v), m, 0.0, v)
    assert pipe.makespan == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v, rel=1e-9)
    for s in range(p):  # every chunk runs every micro-batch forward and backward once, forward first
        order = interleaved_order(s, p, v, m)
        assert sorted(order) == sorted((k, c * p + s, i) for k in "FB" for c in range(v) for i in range(m))
        assert all(order.index(("F", g, i)) < order.index(("B", g, i)) for _, g, i in order)


def test_interleaving_keeps_more_activations_on_the_first_stage() -> None:
    """Megatron-LM's interleaved schedule warms up (p - 1) 2 + (v - 1) p chunks on the first stage."""
    p, v, m = 4, 2, 8
    warm = (p - 1) * 2 + (v - 1) * p
    assert peak_in_flight(interleaved_order(0, p, v, m), [1.0] * (p * v)) == warm + 1
    assert peak_in_flight(interleaved_order(0, p, 1, m), [1.0] * p) == p


def test_transfers_between_stages_add_to_the_first_micro_batch_path() -> None:
    p, m, f, b, x = 4, 8, 1.0, 2.0, 0.25
    pipe = one_f_one_b([f] * p, [b] * p, m, x)
    # micro-batch 0 goes forward through p stages, back through p; 2(p-1) transfers on its way, then the steady state
    assert pipe.makespan >= (m + p - 1) * (f + b) + 2 * (p - 1) * x - 1e-12
    assert one_f_one_b([f] * p, [b] * p, m, 0.0).makespan < pipe.makespan


# -- a step with PP = DP = 1 is the sum of its layers ---------------------------------------------------------------

@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_a_step_without_pipeline_and_dp_is_every_layer_forward_and_backward(two_nodes, recompute: str) -> None:
    wl = workload(parallel={"tp": 8, "cp": 2}, recompute=recompute)
    step = train_step(wl, two_nodes)
    pc = step.pieces
    lf = pc.dense_f.time + pc.attn_f.time
    lb = pc.dense_b.time + pc.attn_b.time + {"none": 0.0, "selective": pc.attn_f.time, "full": lf}[recompute]
    model = wl.model_preset()
    m = wl.micro_batches
    assert m == 8
    opt = optimizer_time(model.params / 8, "adam", "bf16", two_nodes)
    expected = m * (model.layers * (lf + lb) + pc.head_f + pc.head_b) + opt
    # the gradients are still reduced over the CP group (DP x CP): without that, the step is its layers
    assert step.step_s - step.exposed["dp"] == pytest.approx(expected, rel=1e-12)
    assert step.exposed["dp"] > 0
    assert step.pipeline.bubble_frac == pytest.approx(0.0, abs=1e-12)
    assert step.exposed["pp"] == 0.0
    assert step.exposed["tp"] == pytest.approx(m * model.layers * (
        pc.dense_f.exposed * (2 if recompute == "full" else 1) + pc.dense_b.exposed), rel=1e-9)


def test_recompute_costs_time_and_saves_memory(two_nodes) -> None:
    steps = {r: train_step(workload(parallel={"tp": 8, "cp": 2}, recompute=r), two_nodes)
             for r in ("none", "selective", "full")}
    assert steps["none"].step_s < steps["selective"].step_s < steps["full"].step_s
    acts = [steps[r].memory[0].activations for r in ("none", "selective", "full")]
    assert acts[0] > acts[1] > acts[2]


def test_pipeline_step_is_the_1f1b_of_its_stages(two_nodes) -> None:
    wl = workload(parallel={"tp": 8, "cp": 1, "pp": 2}, sequences=8)
    step = train_step(wl, two_nodes)
    pc = step.pieces
    lf, lb = pc.dense_f.time + pc.attn_f.time, pc.dense_b.time + pc.attn_b.time
    fwd = [2 * lf, 2 * lf + pc.head_f]
    bwd = [2 * lb, 2 * lb + pc.head_b]
    pipe = one_f_one_b(fwd, bwd, 8, pc.p2p.time)
    assert step.pipeline.makespan == pytest.approx(pipe.makespan, rel=1e-12)
    assert pc.p2p.time > 0 and step.exposed["pp"] > 0
    assert 0 < step.pipeline.bubble_frac < 1


def test_an_interleaved_step_is_the_interleaved_1f1b_of_its_chunks(two_nodes) -> None:
    wl = workload(parallel={"tp": 8, "pp": 2, "virtual_stages": 2}, sequences=8)  # 4 layers: one per chunk
    step = train_step(wl, two_nodes)
    pc = step.pieces
    lf, lb = pc.dense_f.time + pc.attn_f.time, pc.dense_b.time + pc.attn_b.time
    fwd, bwd = [lf] * 3 + [lf + pc.head_f], [lb] * 3 + [lb + pc.head_b]
    pipe = one_f_one_b(fwd, bwd, 8, pc.p2p.time, 2)
    assert step.pipeline.makespan == pytest.approx(pipe.makespan, rel=1e-12)
    plain = train_step(workload(parallel={"tp": 8, "pp": 2}, sequences=8), two_nodes)
    assert step.pipeline.bubble_frac < plain.pipeline.bubble_frac
    assert step.memory[0].activations > plain.memory[0].activations  # warm-up holds more chunks


# -- data parallelism -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("operation", "factor"), [("allreduce", 2.0), ("reduce-scatter", 1.0),
                                                   ("allgather", 1.0)])
def test_dp_collective_traffic_is_its_closed_form(operation: str, factor: float) -> None:
    cluster = load_topology("dgx-h100", {"nodes": 4})
    dpc = DPCollectives(cluster, 8, 4, "bf16")  # 8 GPUs per replica, dp 4: one group per GPU of the first server
    n = 64 * 2**20
    assert dpc.time(operation, n) > 0
    dp = 4
    expected = dp * factor * (dp - 1) / dp * n * 2  # one group (a rail each): every rank sends (n-1)/n of it
    assert dpc.sent[(operation, n)] == pytest.approx(expected, rel=1e-9)


def test_gradients_are_reduced_over_dp_times_cp() -> None:
    """Megatron-LM reduces gradients, and ZeRO shards, over DP x CP: a GPU's gradient group is the GPUs of its TP
    rank and stage in every CP rank of every replica."""
    from simulator.training.dp import dp_groups

    tp, cp, pp, dp = 2, 2, 2, 2
    replica = tp * cp * pp
    groups = dp_groups(replica, dp, range(replica), tp, cp)
    for g in range(replica):
        t, s = g % tp, g // (tp * cp)
        assert groups[g] == sorted(t + tp * (cc + cp * s) + replica * d for cc in range(cp) for d in range(dp))
    assert dp_groups(replica, dp, [3], tp, 1) == [[3, 3 + replica]]  # cp 1: the DP group
    cluster = load_topology("dgx-h100", {"nodes": 4})
    dpc = DPCollectives(cluster, replica, dp, "bf16", tp, cp)
    assert dpc.dp == cp * dp
    n = 32 * 2**20
    dpc.time("allreduce", n)
    # every GPU of every simulated group sends 2 (n - 1) / n of the buffer, n = dp x cp, on the wire as its
    # protocol sends it (Simple: as it is; LL128: 120 data bytes in 128; LL: 4 in 8)
    data = len(dpc.groups) * 4 * 2 * 3 / 4 * n * 2
    assert any(dpc.sent[("allreduce", n)] == pytest.approx(data * f, rel=1e-9) for f in (1.0, 16 / 15, 2.0))
    # ZeRO 1 shards the optimizer states over dp x cp
    wl = workload(parallel={"tp": 8, "cp": 2}, zero=1)
    wl0 = workload(parallel={"tp": 8, "cp": 2}, zero=0)
    k = optimizer_k("adam", 2)
    params = wl.model_preset().params / 8
    assert train_step(wl0, cluster).memory[0].optimizer - train_step(wl, cluster).memory[0].optimizer == pytest.approx(
        k * params / 2 * (2 - 1), rel=1e-9)


def test_one_servers_dp_groups_time_every_group_by_symmetry() -> None:
    cluster = load_topology("dgx-h100", {"nodes": 4})
    replica, dp = 16, 2  # two servers per replica, two replicas
    dpc = DPCollectives(cluster, replica, dp, "bf16")
    n = 32 * 2**20
    sched = Schedule(32, placement=tuple(cluster.ranks[:32]))
    for g in range(replica):  # every DP group of the cluster at once
        collective(sched, "reduce-scatter", [g, g + replica], f"g{g}", n, dpc.fabric, elem_bytes=2, dtype="bf16",
                   tag=f"t{g}", deps={})
    assert dpc.time("reduce-scatter", n) == pytest.approx(simulate(sched, cluster).makespan, rel=1e-12)


def test_buckets_overlap_the_backward_and_the_last_one_is_exposed() -> None:
    sizes = bucket_sizes(10.5, 1.0)
    assert sizes == [1.0] * 11  # the last one padded
    assert bucket_sizes(0.5, 1.0) == [0.5]
    # each bucket's collective is shorter than the backward that fills it: only the last one's is exposed
    assert overlapped_end(2.0, 1.0, sizes, [0.01] * 11) == pytest.approx(3.0 + 0.01)
    # a slow stream: the collectives queue, each after the previous one
    assert overlapped_end(2.0, 1.0, sizes, [1.0] * 11) == pytest.approx(2.0 + 1.0 / 11 + 11.0)


def _draw_pipeline(data: st.DataObject, p: int, v: int, groups: int, most_m: int, shortest: float
                   ) -> tuple[int, int, list[float], list[float]]:
    """(chunks, micro-batches, forward and backward seconds per virtual stage) of a drawn (interleaved) 1F1B."""
    v = 1 if p == 1 else v
    m = p * groups if v > 1 else data.draw(st.integers(1, most_m))
    times = st.floats(shortest, 10.0, allow_nan=False)
    fwd = data.draw(st.lists(times, min_size=p * v, max_size=p * v))
    bwd = data.draw(st.lists(times, min_size=p * v, max_size=p * v))
    return v, m, fwd, bwd


def _one_backward(fwd: float, bwd: float, count: int, seconds: float, pace: float) -> Pipeline:
    """One stage, one micro-batch: its forward, then its backward handing ``count`` buckets to the stream."""
    return one_f_one_b([fwd], [bwd], 1, dp=DPStreams((0,), (count,), (seconds,), (pace,), (pace,)))


def test_a_collective_beside_the_backward_slows_it_by_what_it_holds() -> None:
    # buckets whose collectives end before the next is ready: each but the last runs its s seconds beside the
    # backward, which does s x pace of work instead of s: the backward ends (count - 1) s (1 - pace) later
    start, duration, count, s, pace = 1.0, 10.0, 5, 1.0, 0.5
    pipe = _one_backward(start, duration, count, s, pace)
    assert pipe.stage_end[0] == pytest.approx(start + duration + (count - 1) * s * (1 - pace), rel=1e-12)
    assert pipe.stream_end[0] == pytest.approx(pipe.stage_end[0] + s, rel=1e-12)  # the last after the backward
    assert pipe.busy[0] == pytest.approx(pipe.stage_end[0], rel=1e-12)  # slowed, not idle
    # a slow stream: busy from the first bucket on, the rest of the backward at the reduced pace
    pipe = _one_backward(start, duration, 2, 100.0, pace)
    assert pipe.stage_end[0] == pytest.approx(start + duration / 2 + duration / 2 / pace, rel=1e-12)
    assert pipe.stream_end[0] == pytest.approx(start + duration / 2 + 200.0, rel=1e-12)
    # one bucket, ready as the backward ends: nothing beside it
    pipe = _one_backward(start, duration, 1, s, pace)
    assert (pipe.stage_end[0], pipe.stream_end[0]) == (start + duration, start + duration + s)
    # at full pace the stream is the closed form's, the stage's floats those without a stream
    pipe = _one_backward(start, duration, count, 0.7, 1.0)
    assert pipe.stage_end == one_f_one_b([start], [duration], 1).stage_end
    assert pipe.stream_end[0] == pytest.approx(equal_buckets_end(start, duration, count, 0.7), rel=1e-12)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        _one_backward(start, duration, count, s, 0.0)


@pytest.mark.parametrize(("chunks", "count"), [(2, 6), (2, 10), (3, 9), (3, 6)])
def test_a_bucket_ending_with_a_chunk_is_handed_at_its_end(chunks: int, count: int) -> None:
    # equal chunk backwards, buckets a multiple of the chunks: after the first chunk's backward, its share of the
    # buckets is handed, whatever the rounding of the work's sums (not at the next chunk's start, ops later)
    from simulator.training.pipeline import _beside_stream

    beside = _beside_stream.py_func
    rng = np.random.default_rng(7)
    for x in rng.uniform(1e-3, 10.0, 300):
        sfree, done, ready = np.zeros(1), np.zeros((1, 1)), np.zeros((1, 1), dtype=np.int64)
        end = beside(0, 0, 1.0, float(x), True, False, 0.5, chunks * float(x), count, 0.25, sfree, done, ready)
        assert ready[0, 0] == count // chunks, x
        assert end >= 1.0 + x


@settings(max_examples=100, deadline=None)
@given(p=st.integers(1, 5), v=st.integers(1, 3), groups=st.integers(1, 3), every=st.booleans(), data=st.data())
def test_dp_streams_slow_the_pipeline_within_their_bounds(p: int, v: int, groups: int, every: bool,
                                                          data: st.DataObject) -> None:
    v, m, fwd, bwd = _draw_pipeline(data, p, v, groups, 8, 1e-3)
    count = tuple(data.draw(st.lists(st.integers(1, 30), min_size=p, max_size=p)))
    secs = tuple(data.draw(st.lists(st.floats(0.0, 5.0), min_size=p, max_size=p)))
    pace = data.draw(st.floats(0.05, 1.0))
    micro = tuple(range(m)) if every else (m - 1,)
    alone = one_f_one_b(fwd, bwd, m, 0.1, v, DPStreams(micro, count, secs, (1.0,) * p, (1.0,) * p))
    slowed = one_f_one_b(fwd, bwd, m, 0.1, v, DPStreams(micro, count, secs, (pace,) * p, (pace,) * p))
    plain = one_f_one_b(fwd, bwd, m, 0.1, v)
    assert (alone.stage_end, alone.busy) == (plain.stage_end, plain.busy)  # at full pace: the pipeline's floats
    for s in range(p):
        assert alone.stage_end[s] <= slowed.stage_end[s] * (1 + 1e-12)
        assert alone.stream_end[s] <= slowed.stream_end[s] * (1 + 1e-12)
        assert slowed.stream_end[s] >= len(micro) * count[s] * secs[s] * (1 - 1e-12)  # every bucket ran
    # each op at most 1 / pace times as long: the critical path at most every op's slowdown longer
    assert slowed.makespan <= (alone.makespan + sum(alone.busy) * (1 / pace - 1)) * (1 + 1e-9)


def test_a_layer_under_its_prefetched_collectives() -> None:
    # a layer of 10 s under an all-gather of 4 s at pace 0.5 and a reduce-scatter of 2 s at pace 0.25: 2 s and
    # 0.5 s of its work done beside them, the 7.5 s left alone after them
    assert under(10.0, ((4.0, 0.5), (2.0, 0.25))) == pytest.approx(6.0 + 7.5, rel=1e-12)
    assert under(1.0, ((4.0, 0.5), (2.0, 0.25))) == 6.0  # done beside the first: the collectives' 6 s
    assert under(3.0, ((4.0, 0.5), (2.0, 0.25))) == 6.5  # 2 s beside the first, 0.5 beside the second, 0.5 after
    assert under(3.0, ((2.0, 0.5),)) == pytest.approx(2.0 + 2.0, rel=1e-12)
    assert under(3.0, ((2.0, 1.0), (0.5, 1.0))) == max(3.0, 2.0 + 0.5)  # at full pace: the max, the same floats


def test_a_kernels_seconds_on_fewer_sms_are_the_engines(two_nodes) -> None:
    spec = two_nodes.specs[two_nodes.ranks[0]]
    for model, seconds in ((custom_model(**SMALL), "launch-bound"), (PRESETS["llama-3.1-8b"], "compute-bound")):
        piece = dense_pass(model, 1, 1, 4096, "bf16", two_nodes, backward=True, sequence_parallel=False)
        assert piece.kernels and piece.kernel_seconds(spec, 0) == pytest.approx(piece.compute, rel=1e-12)
        held = piece.kernel_seconds(spec, 16)  # launches and the memory side do not stretch; FLOPs on fewer SMs do
        assert piece.compute <= held <= piece.compute * spec.sm_count / (spec.sm_count - 16) * (1 + 1e-12)
        if seconds == "compute-bound":
            assert held > piece.compute * 1.1


def test_dp_collectives_slow_the_backward_they_overlap(two_nodes, monkeypatch: pytest.MonkeyPatch) -> None:
    from simulator.training import step as training_step

    for zero in (0, 1, 2, 3):
        wl = workload(model="llama-3.2-1b", parallel={"tp": 8, "dp": 2}, sequences=8, zero=zero, bucket="4 MB")
        contended = train_step(wl, two_nodes)
        with monkeypatch.context() as m:
            m.setattr(training_step.Pieces, "pace", lambda *_: 1.0)  # the collectives' SMs left out
            free_sms = train_step(wl, two_nodes)
        assert contended.step_s > free_sms.step_s, zero
        assert contended.exposed["dp"] - free_sms.exposed["dp"] == pytest.approx(
            contended.step_s - free_sms.step_s, rel=1e-9), zero  # DP's cost: the step without DP is the same


def test_one_group_stands_for_the_servers_groups_on_a_rail_optimised_fabric() -> None:
    cluster = load_topology("dgx-h100", {"nodes": 4})
    dpc = DPCollectives(cluster, 8, 4, "bf16")
    assert len(dpc.groups) == 1  # a NIC per GPU
    n = 16 * 2**20
    sched = Schedule(32, placement=tuple(cluster.ranks))
    for g in range(8):  # the groups of every GPU of the first server at once
        collective(sched, "allreduce", [g + 8 * d for d in range(4)], f"g{g}", n, dpc.fabric, elem_bytes=2,
                   dtype="bf16", tag=f"t{g}", deps={})
    assert dpc.time("allreduce", n) == pytest.approx(simulate(sched, cluster).makespan, rel=1e-12)


def test_dp_adds_the_exposed_tail_and_zero_changes_it(two_nodes) -> None:
    base = {"parallel": {"tp": 8, "dp": 2}, "sequences": 8}
    steps = {z: train_step(workload(**base, zero=z), two_nodes) for z in (0, 1, 2, 3)}
    for z, step in steps.items():
        assert step.exposed["dp"] > 0, z
    # ZeRO 1 and 2 all-gather the updated parameters at the end; 0 does not
    assert steps[1].exposed["dp"] > steps[0].exposed["dp"] * 0.5


# -- memory ---------------------------------------------------------------------------------------------------------

def test_zero_memory_is_the_papers_formulas() -> None:
    """ZeRO (arXiv:1910.02054) figure 1: Psi = 7.5B, N_d = 64, K = 12: 120, 31.4, 16.6 and 1.9 GB."""
    psi, nd = 7.5e9, 64
    k = optimizer_k("adam", 2)
    assert k == 12
    totals = [sum(model_state_bytes(psi, z, nd, 2, k)) / 1e9 for z in range(4)]
    assert totals[0] == pytest.approx(120.0)
    assert totals[1] == pytest.approx(31.40625)
    assert totals[2] == pytest.approx(16.640625)
    assert totals[3] == pytest.approx(1.875)


def test_activations_are_the_tensors_the_layer_keeps() -> None:
    """Per token: norms 4h (sharded over TP with sequence parallelism), q k v, gate + up + product; none adds the
    attention output and its fp32 log-sum-exp; full keeps the layer input only."""
    h, t, s = 4096, 8, 2048
    gpt = custom_model(layers=1, hidden=h, heads=32, kv_heads=32, head_dim=128, intermediate=4 * h, vocab=1)
    ours = layer_activation_bytes(gpt, s, t, True, "selective", 2)
    assert ours == pytest.approx(s * (4 * h + 3 * h + 3 * 4 * h) / t * 2)
    none = layer_activation_bytes(gpt, s, t, True, "none", 2)
    assert none == pytest.approx(ours + s * (h / t * 2 + 32 / t * 4))
    assert layer_activation_bytes(gpt, s, t, False, "selective", 2) == pytest.approx(
        s * (4 * h + (3 * h + 3 * 4 * h) / t) * 2)
    full = layer_activation_bytes(gpt, s, t, True, "full", 2)
    assert full == pytest.approx(s * h / t * 2)


def test_the_first_stage_holds_the_most_activations(two_nodes) -> None:
    cluster = load_topology("dgx-h100", {"nodes": 4})
    step = train_step(workload(parallel={"tp": 8, "pp": 4}, sequences=8), cluster)
    acts = [m.activations for m in step.memory]
    assert acts == sorted(acts, reverse=True) and acts[0] > acts[-1]
    per_layer = acts[-1]  # the last stage: one micro-batch in flight, one layer
    assert acts[0] == pytest.approx(4 * per_layer)


# -- FLOPs and stages -----------------------------------------------------------------------------------------------

def test_model_flops_are_6n_plus_attention() -> None:
    wl = workload(sequences=2)
    model = wl.model_preset()
    tokens = 2 * 4096
    attn = 4 * 8 * (4096 * 4097 // 2) * 64 * 3.5 * 2  # 2 sequences, causal pairs, forward + backward
    assert model_flops(wl) == pytest.approx(6 * tokens * (4 * model.layer_weights + model.head_weights)
                                            + 4 * attn)


def test_stages_split_the_layers_and_the_parameters() -> None:
    assert stage_layers(126, 16) == [8] * 14 + [7] * 2
    model = PRESETS["llama-3.1-405b"]
    assert sum(stage_params(model, 16)) == pytest.approx(model.params)


@settings(max_examples=80, deadline=None)
@given(count=st.integers(1, 40), start=st.floats(0, 10), duration=st.floats(0.001, 10), seconds=st.floats(0, 2),
       free=st.floats(0, 30))
def test_equal_buckets_closed_form_is_the_stream(count: int, start: float, duration: float, seconds: float,
                                                 free: float) -> None:
    got = equal_buckets_end(start, duration, count, seconds, free)
    assert got == pytest.approx(overlapped_end(start, duration, [1.0] * count, [seconds] * count, free), rel=1e-9)


@pytest.mark.parametrize(("sp", "ops"), [(False, ("allreduce", "allreduce")),
                                         (True, ("allgather", "reduce-scatter", "allgather", "reduce-scatter"))])
def test_tp_exposure_of_a_dense_layer_is_its_collectives(sp: bool, ops: tuple[str, ...]) -> None:
    """Megatron's TP runs its collectives between the matmuls: the forward's exposed time is their sum, each as
    NCCL runs it alone on the TP group."""
    cluster = load_topology("dgx-h100", {"nodes": 1})
    model = PRESETS["llama-3.1-8b"]
    rows = 4096
    piece = dense_pass(model, 8, 1, rows, "bf16", cluster, backward=False, sequence_parallel=sp)
    fabric = DPCollectives(cluster, 8, 1, "bf16").fabric
    alone = 0.0
    for op in ops:  # each alone on the server's 8 GPUs, as the layer runs it (no NVLink SHARP: no switch rank)
        sched = Schedule(8, placement=tuple(cluster.ranks))
        collective(sched, op, list(range(8)), "h", rows * model.hidden, fabric, elem_bytes=2, dtype="bf16",
                   tag=op, deps={})
        alone += simulate(sched, cluster).makespan
    assert piece.exposed == pytest.approx(alone, rel=1e-9)


@given(psi=st.floats(1e3, 1e12), dp=st.integers(1, 4096), eb=st.sampled_from([2, 4]),
       optimizer=st.sampled_from(["adam", "sgd"]))
def test_each_zero_stage_shards_more_and_none_shards_on_one_replica(psi: float, dp: int, eb: int,
                                                                    optimizer: str) -> None:
    k = optimizer_k(optimizer, eb)
    totals = [sum(model_state_bytes(psi, z, dp, eb, k)) for z in range(4)]
    assert totals == sorted(totals, reverse=True)
    assert totals[0] == pytest.approx((2 * eb + k) * psi)
    assert totals[3] == pytest.approx(totals[0] / dp)
    if dp == 1:
        assert totals == pytest.approx([totals[0]] * 4)


@given(pp=st.integers(1, 16), v=st.integers(1, 4))
def test_stages_hold_every_parameter_once(pp: int, v: int) -> None:
    model = PRESETS["llama-3.1-8b"]
    if pp * v > model.layers:
        return
    params = stage_params(model, pp, v)
    assert len(params) == pp and sum(params) == pytest.approx(model.params)


@pytest.mark.usefixtures("no_contention")  # (the pure timing has none: a transfer holds no SMs there)
@pytest.mark.parametrize(("p", "v", "m"), [(4, 1, 6), (4, 2, 8), (3, 3, 3), (1, 1, 4)])
def test_the_engine_runs_the_pipeline_as_its_pure_timing(p: int, v: int, m: int) -> None:
    """The pipeline as a schedule (one GPU per stage, kernels of the stages' durations, real transfers) takes on the
    engine what run_pipeline computes with the transfers' time."""
    from simulator.training.timeline import pipeline_schedule

    cluster = load_topology("dgx-h100", {"nodes": 4})
    rng = np.random.default_rng(p * 100 + v * 10 + m)
    fwd = list(rng.uniform(1e-3, 2e-3, p * v))
    bwd = list(rng.uniform(2e-3, 4e-3, p * v))
    nbytes = 1e6  # a transfer (~20 us) is over before the next on its link starts
    sched = pipeline_schedule(fwd, bwd, m, v, nbytes, 8, cluster, "bf16")
    result = simulate(sched, cluster)
    lone = Schedule(2, placement=(cluster.ranks[0], cluster.ranks[8]))
    lone.add_transfer(0, 1, nbytes, "x")
    x = simulate(lone, cluster).makespan
    assert result.makespan == pytest.approx(one_f_one_b(fwd, bwd, m, x, v).makespan, rel=1e-9)
    assert len(sched.ops) == 2 * m * p * v + 2 * 2 * m * (p * v - 1)  # kernels, and a send and receive per hop


def _walk(orders: list[list[tuple[str, int, int]]], fwd: list[float], bwd: list[float], m: int, p2p: float
          ) -> tuple[list[float], list[list[tuple[float, float]]]]:
    """The pipeline's run, op by op over Python dicts: each stage's end and its backward windows."""
    p, last = len(orders), len(fwd) - 1
    end: dict[tuple[str, int, int], float] = {}
    pos, free = [0] * p, [0.0] * p
    window = [[(float("inf"), 0.0)] * m for _ in range(p)]
    while any(pos[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, g, i = orders[s][pos[s]]
                dep = ("F", g - 1, i) if kind == "F" else ("F", g, i) if g == last else ("B", g + 1, i)
                if kind == "F" and g == 0:
                    ready = 0.0
                elif dep not in end:
                    break
                else:
                    ready = end[dep] + (p2p if dep[1] % p != s else 0.0)
                start = max(free[s], ready)
                free[s] = end[(kind, g, i)] = start + (fwd[g] if kind == "F" else bwd[g])
                if kind == "B":
                    window[s][i] = (min(window[s][i][0], start), max(window[s][i][1], free[s]))
                pos[s] += 1
    return free, window


@settings(max_examples=150, deadline=None)
@given(p=st.integers(1, 6), v=st.integers(1, 3), groups=st.integers(1, 3), data=st.data())
def test_the_compiled_pipeline_timing_is_the_walk_to_the_last_float(p: int, v: int, groups: int,
                                                                      data: st.DataObject) -> None:
    v, m, fwd, bwd = _draw_pipeline(data, p, v, groups, 12, 1e-4)
    p2p = data.draw(st.sampled_from([0.0, 1e-3, 0.37]))
    pipe = one_f_one_b(fwd, bwd, m, p2p, v)
    free, window = _walk([interleaved_order(s, p, v, m) for s in range(p)], fwd, bwd, m, p2p)
    assert list(pipe.stage_end) == free and pipe.makespan == max(free)
    assert [[pipe.backward_window(s, i) for i in range(m)] for s in range(p)] == window


def test_large_dp_groups_take_the_tuners_predicted_time() -> None:
    from simulator.collectives.tuner import choose, predict
    from simulator.training.dp import MAX_SIMULATED_DP

    cluster = load_topology("dgx-h100", {"nodes": 64})
    dpc = DPCollectives(cluster, 8, 64, "bf16")
    assert dpc.dp > MAX_SIMULATED_DP
    n = 12_500_000
    group = dpc.groups[0]
    choice = choose("reduce-scatter", group, n, dpc.fabric, elem_bytes=2, dtype="bf16")
    assert dpc.time("reduce-scatter", n) == predict("reduce-scatter", group, n, choice, dpc.fabric, elem_bytes=2,
                                                    dtype="bf16")
    assert dpc.events == 0  # nothing simulated


@pytest.mark.parametrize(("tp", "cp", "backward", "sp"), [
    (1, 16, False, False), (2, 16, True, True), (4, 8, False, True), (8, 4, True, False), (2, 32, False, True)])
def test_a_dense_pass_on_alike_servers_is_one_servers(tp: int, cp: int, backward: bool, sp: bool) -> None:
    """On alike servers holding whole TP groups, the dense pass built on the first server only has the whole
    stage's makespan and critical kernels to the last float, and its bytes times the servers."""
    cluster = load_topology("dgx-h100", {"nodes": 8})
    model = PRESETS["llama-3.1-70b"]
    one = dense_pass(model, tp, cp, 131072 // cp, "bf16", cluster, backward=backward, sequence_parallel=sp)
    whole = dense_pass(model, tp, cp, 131072 // cp, "bf16", cluster, backward=backward, sequence_parallel=sp,
                       alike=False)
    assert dense_servers(cluster, tp, cp) == tp * cp // 8
    assert (one.time, one.compute, one.kernels) == (whole.time, whole.compute, whole.kernels)
    assert one.bytes == pytest.approx(whole.bytes, rel=1e-12) and one.events < whole.events


def test_a_dense_pass_builds_every_server_where_they_are_not_alike() -> None:
    """TP groups that cross servers, a stage on one server or on part of one: every GPU is built."""
    cluster = load_topology("dgx-h100", {"nodes": 4})
    assert dense_servers(cluster, 16, 2) == 1 and dense_servers(cluster, 8, 1) == 1
    assert dense_servers(cluster, 4, 3) == 1 and dense_servers(cluster, 4, 8) == 4
