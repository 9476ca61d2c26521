"""Ops built whole (transfer_ops, fused_reduce_op, Schedule.extend) equal add_transfer's and add_compute's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.schedule.core import Schedule, fused_reduce_op, transfer_ops

floats = st.floats(min_value=0.0, max_value=1e12, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(src=st.integers(0, 3), shift=st.integers(1, 3), size=floats, floor=floats, cap=floats, into=st.booleans(),
       lo=st.integers(0, 100), span=st.integers(0, 100), elems=st.integers(0, 10**6))
def test_built_ops_equal_the_calls(src: int, shift: int, size: float, floor: float, cap: float, into: bool, lo: int,
                                   span: int, elems: int) -> None:
    dst = (src + shift) % 4
    ref, new = Schedule(4), Schedule(4)
    for s in (ref, new):
        s.add_compute(src, "a")
        s.add_compute(dst, "b")
    snd, rcv = ref.add_transfer(src, dst, size, "t", send_deps=(0,), recv_deps=(1,), args=("x",),
                                dst_args=("tmp",), lo=lo, hi=lo + span, coll="t", into=into, floor_s=floor,
                                rate_cap=cap)
    ref.add_compute(dst, "t.reduce", flops=elems, nbytes=3.0 * elems * 2, dtype="bf16", deps=(rcv, 1),
                    fn="reduce-sum", out="x", args=("tmp",), lo=lo, hi=lo + span, fused=True, coll="t")
    ops = [*transfer_ops(2, src, dst, float(size), "t", (0,), (1,), ("x",), ("tmp",), lo, lo + span, "t", into,
                         floor, float(cap)),
           fused_reduce_op(4, dst, "t.reduce", float(elems), float(3.0 * elems * 2), "bf16", (3, 1), "reduce-sum",
                           "x", ("tmp",), lo, lo + span, "t")]
    new.extend(ops)
    assert (snd, rcv) == (2, 3)
    assert repr(new.ops) == repr(ref.ops)  # every field, floats to the bit


def test_extend_checks_ids_ranks_and_deps() -> None:
    s = Schedule(2)
    s.add_compute(0, "a")
    good = transfer_ops(1, 0, 1, 8.0, "t", (0,), (), ("x",), ("x",), 0, 1, "t", True, 0.0, 0.0)
    with pytest.raises(ValueError, match="ids 1"):
        s.extend(transfer_ops(2, 0, 1, 8.0, "t", (0,), (), ("x",), ("x",), 0, 1, "t", True, 0.0, 0.0))
    with pytest.raises(ValueError, match="rank out of range"):
        s.extend(transfer_ops(1, 0, 2, 8.0, "t", (0,), (), ("x",), ("x",), 0, 1, "t", True, 0.0, 0.0))
    with pytest.raises(ValueError, match="dependency"):
        s.extend(transfer_ops(1, 0, 1, 8.0, "t", (7,), (), ("x",), ("x",), 0, 1, "t", True, 0.0, 0.0))
    assert len(s.ops) == 1
    s.extend(good)
    assert [op.kind for op in s.ops] == ["compute", "send", "recv"]


def test_each_kind_has_one_constructor_equal_to_the_named_tuple_with_keywords():
    from simulator.schedule.op import Op, compute_op, launch_op, recv_op, send_op

    assert send_op(4, 0, "t", (1,), 8.0, 2, ("x",), 0, 2, ("y",), "c", 1e-6, 5e9) == Op(
        id=4, rank=0, kind="send", name="t", deps=(1,), nbytes=8.0, peer=2, match=5, args=("x",), lo=0, hi=2,
        free=("y",), coll="c", floor_s=1e-6, rate_cap=5e9)
    assert recv_op(5, 2, "t", (3,), 8.0, 0, ("x",), 0, 2, (("x", 8.0),), "c", True) == Op(
        id=5, rank=2, kind="recv", name="t", deps=(3,), nbytes=8.0, peer=0, match=4, args=("x",), lo=0, hi=2,
        alloc=(("x", 8.0),), coll="c", into=True)
    assert compute_op(6, 1, "k", (5,), 2.0, 3.0, "bf16", "attend", "acc", ("q", "kv"), dims=(1.0,)) == Op(
        id=6, rank=1, kind="compute", name="k", deps=(5,), flops=2.0, nbytes=3.0, dtype="bf16", fn="attend",
        out="acc", args=("q", "kv"), dims=(1.0,))
    assert launch_op(7, 1, "l", (), "allreduce", "o", "c", 0, "sum", 2e-6) == Op(
        id=7, rank=1, kind="launch", name="l", fn="allreduce", out="o", coll="c", root=0, redop="sum", floor_s=2e-6)


def test_op_id_layouts_are_named():
    import numpy as np

    from simulator.schedule.op import OpGrid, is_recv, recv_of, send_of, transfer_of, transfer_send

    s = Schedule(3)
    first = s.add_transfers([0, 1], [1, 2], [1.0, 2.0], ["a", "b"], [(), ()], [(), ()])
    ops = list(s.ops)
    for k in range(2):
        send = transfer_send(first, k)
        assert ops[send].kind == "send" and ops[recv_of(send)].match == send and send_of(recv_of(send)) == send
        assert transfer_of(send - first) == k and not is_recv(send - first) and is_recv(recv_of(send) - first)
    grid = OpGrid(10, 3)
    assert grid.id(2, 1) == 17 and list(grid.ids(3, 2)) == [12, 15, 18] and grid.after(3) == 19
    assert list(grid.id(np.array([0, 1]), 0)) == [10, 13]
