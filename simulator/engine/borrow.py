"""A borrowed view of an array inside compiled code: the same data, shape and strides, without a reference count.

numba counts references to an array's memory with atomic increments and decrements (``NRT_incref`` and
``NRT_decref``): an array read off a struct (the engine's state) into a variable that lives across a loop or a
branch costs a pair of them per read, which the engine's event loop did hundreds of thousands of times a second (a
quarter of its time in ``perf``). :func:`borrow` returns a view whose memory-info pointer is null, so that nothing
is counted for it. It must not outlive the array it views: use it only for arrays the struct keeps (the engine's
per-op columns), or for one that may be replaced (a growing calendar) only until the next call that may replace it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["borrow"]


@intrinsic
def _borrow(typingctx: Any, arr: types.Type) -> Any:
    """``arr``'s data viewed without a reference count (compiled code only)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        src = context.make_array(arr)(context, builder, value=args[0])
        view = context.make_array(arr)(context, builder)
        for name in ("nitems", "itemsize", "data", "shape", "strides"):
            setattr(view, name, getattr(src, name))
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()

    return arr(arr), codegen


borrow = cast("Callable[[np.ndarray], np.ndarray]", _borrow)  # its type in compiled code's callers, for mypy
