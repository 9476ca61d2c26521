"""A borrowed view of an array in compiled code (simulator.engine.borrow): the same data, shape and strides as
the array, read and written through, without reference counts; anything but an array is refused."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from simulator.engine.borrow import borrow


@njit(cache=False)
def _sum_then_bump(a: np.ndarray) -> tuple[float, float, int]:
    v = borrow(a)
    total = 0.0
    for i in range(len(v)):
        total += v[i]
    v[0] += 1.0
    return total, v[1:3].sum(), v.shape[0]


@njit(cache=False)
def _row_sums(a: np.ndarray) -> np.ndarray:
    v = borrow(a)
    out = np.zeros(v.shape[0])
    for i in range(v.shape[0]):
        out[i] = borrow(v[i]).sum()
    return out


@njit(cache=False)
def _not_an_array(x: float) -> float:
    return borrow(x)


def test_a_borrowed_view_reads_and_writes_the_array() -> None:
    a = np.arange(5.0)
    assert _sum_then_bump(a) == (10.0, 3.0, 5)
    assert a.tolist() == [1.0, 1.0, 2.0, 3.0, 4.0]


def test_a_borrowed_view_keeps_shape_and_strides() -> None:
    a = np.arange(12.0).reshape(3, 4)
    assert _row_sums(a).tolist() == a.sum(axis=1).tolist()
    assert _row_sums(a.T).tolist() == a.T.sum(axis=1).tolist()  # not contiguous: its strides kept


def test_only_an_array_can_be_borrowed() -> None:
    with pytest.raises(TypingError):
        _not_an_array(1.0)
