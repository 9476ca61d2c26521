"""Array copies inside compiled code written as loops: ``put1(dst, src, n)`` is ``dst[:n] = src[:n]``, ``put2(dst,
src)`` is ``dst[:rows, :cols] = src`` for a 2-D ``src`` of that shape.

numba compiles an assignment of an array into a slice with a shape check whose error message (the shapes as text)
is compiled code of its own: string formatting, some 3 s of every process's first compile (issue 41). The growth of
the engine's and the router's arrays copies the old contents this way instead; the values are the same.
"""

from __future__ import annotations

import numpy as np

from simulator.support.jitcache import njit

__all__ = ["put1", "put2"]


@njit(inline="always")
def put1(dst: np.ndarray, src: np.ndarray, n: int) -> None:  # pragma: no cover
    """``dst[:n] = src[:n]``."""
    for i in range(n):
        dst[i] = src[i]


@njit(inline="always")
def put2(dst: np.ndarray, src: np.ndarray) -> None:  # pragma: no cover
    """``dst[:src.shape[0], :src.shape[1]] = src``."""
    for r in range(src.shape[0]):
        for c in range(src.shape[1]):
            dst[r, c] = src[r, c]
