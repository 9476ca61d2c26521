"""``usp`` (issue 42): Ulysses inside a group of GPUs, a ring across the groups. Numeric mode exact against dense
attention, forward and backward, over several servers, degrees and GQA replication; its limits (one group: the bytes
of ``ulysses``; groups of one GPU: the blocks of ``ring``); the degrees in the rows, and bad degrees refused."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import pytest

from simulator.algorithms import Layout
from simulator.algorithms.prefill import build_prefill
from simulator.cli import main
from simulator.numeric.prefill import make_prefill_inputs, run_prefill_numeric
from simulator.workloads.layouts import LAYOUTS
from simulator.workloads.prefill_shape import PrefillShape


def _sends(sched) -> float:
    return sum(op.nbytes for op in sched.ops if op.kind == "send")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("hosts", [(0, 0, 1, 1), (0, 0, 0, 0, 1, 1, 1, 1), (0, 0, 1, 1, 2, 2)])
@pytest.mark.parametrize("backward", [False, True])
def test_usp_equals_dense_fp64(layout, hosts, backward):
    server = len(hosts) // len(set(hosts))
    n = 3 * len(hosts) + 5
    for ulysses in sorted({0, 1, 2, server}):
        if ulysses and server % ulysses:
            continue
        for kv, causal in ((4, True), (2, True), (1, True), (2, False)):
            shape = PrefillShape(2, 4, 8, kv, n, "fp64", causal, layout, backward)
            sched = build_prefill("usp", {"ulysses": ulysses, "overlap": True}, shape, Layout(hosts))
            res = run_prefill_numeric(sched, make_prefill_inputs(np.random.default_rng(kv), 2, 4, kv, 8, n, causal))
            assert res.max_abs_err < 1e-12 and res.max_grad_err < 1e-12, (ulysses, kv, causal)


def test_usp_without_overlap_is_exact_too():
    shape = PrefillShape(2, 4, 8, 2, 29, "fp64", True, "zigzag", True)
    sched = build_prefill("usp", {"ulysses": 2, "overlap": False}, shape, Layout((0, 0, 1, 1, 2, 2)))
    res = run_prefill_numeric(sched, make_prefill_inputs(np.random.default_rng(3), 2, 4, 2, 8, 29, True))
    assert res.max_abs_err < 1e-12 and res.max_grad_err < 1e-12


@pytest.mark.parametrize("name", ["usp", "ring"])
@pytest.mark.parametrize("hosts", [(0, 0, 1, 1), (0, 0, 1, 1, 2, 2), (0, 0, 1, 1, 2, 2, 3, 3)])
def test_a_dk_dv_receive_waits_for_its_buffers_last_send_not_this_steps(name, hosts):
    """Backward: a rank receives the next dK, dV into the buffer its send of the step before read, so it waits for
    that send (and its block), never for its own send of the same step (another buffer): on every rank of the ring,
    the wrap-around one too (usp's builder once made that rank's receive wait for its same-step send)."""
    shape = PrefillShape(1, 8, 16, 4, 40 * len(hosts), "bf16", True, "zigzag", True)
    sched = build_prefill(name, {"ulysses": 2} if name == "usp" else {}, shape, Layout(hosts))
    ops = list(sched.ops)
    last_block: dict[int, int] = {}  # rank -> its latest attention block so far
    checked = 0
    for op in ops:
        if op.kind == "compute" and op.fn == "attn-bwd":
            last_block[op.rank] = op.id
        elif op.kind == "recv" and op.name.startswith("dkv[") and op.rank in last_block:
            sends = [d for d in op.deps if ops[d].kind == "send"]
            assert all(d < last_block[op.rank] for d in sends), (op, sends, last_block[op.rank])
            checked += 1
    assert checked >= len(hosts)


def test_its_limits_are_ulysses_and_ring():
    shape = PrefillShape(1, 32, 128, 8, 4099, "bf16", True, "zigzag", True)
    one_group = build_prefill("usp", {"ulysses": 8, "overlap": True}, shape, Layout((0,) * 8))
    assert one_group.meta["degrees"] == (8, 1)
    assert _sends(one_group) == _sends(build_prefill("ulysses", {"alltoall": "pairwise"}, shape, Layout((0,) * 8)))
    rings = build_prefill("usp", {"ulysses": 1, "overlap": True}, shape, Layout((0, 0, 1, 1)))
    ring = build_prefill("ring", {"overlap": True}, shape, Layout((0, 0, 1, 1)))
    assert rings.meta["degrees"] == (1, 4)
    for fn in ("attn-fwd", "attn-bwd"):
        assert sum(op.flops for op in rings.ops if op.fn == fn) == sum(op.flops for op in ring.ops if op.fn == fn)
    assert _sends(rings) == _sends(ring)
    hybrid = build_prefill("usp", {"ulysses": 0, "overlap": True}, shape, Layout((0,) * 8 + (1,) * 8))
    assert hybrid.meta["degrees"] == (8, 2)  # default: the GPUs of a server
    flops = sum(op.flops for op in hybrid.ops if op.fn == "attn-fwd")
    assert flops == 4 * 32 * 128 * 4099 * 4100 // 2  # every unmasked pair once, over the 16 GPUs


def test_rows_say_the_degrees_and_bad_ones_are_refused(tmp_path, capsys):
    path = tmp_path / "u.yaml"
    path.write_text(textwrap.dedent("""
        name: u
        topology: dgx-h100
        topology_params: {nodes: 2}
        workload: {kind: prefill, model: llama-3.1-8b, sequence: 16K}
        algorithms: [ring, usp, {name: usp, ulysses: 2}]
        """))
    out = tmp_path / "o"
    assert main(["run", str(path), "-o", str(out), "--no-report", "--jobs", "1"]) == 0
    rows = pd.read_csv(out / "results.csv").set_index("algorithm")
    assert rows.loc["usp", "degrees"] == "ulysses 8 x ring 2"
    assert rows.loc["usp[ulysses=2]", "degrees"] == "ulysses 2 x ring 8"
    capsys.readouterr()
    assert main(["run", str(path), "-o", str(tmp_path / "o2"), "--no-report",
                 "--set", "algorithms=[{name: usp, ulysses: 3}]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "algorithms.0: usp: ulysses (3) must divide the 8 GPUs of a server" in err[0]
