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
