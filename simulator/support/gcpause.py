"""Python's cyclic garbage collector paused while a large schedule is built or simulated.

Building and simulating allocate millions of small objects (ops, records, callbacks) that all stay alive until the
end, and none of which is garbage: every collection the allocations trigger walks them again for nothing (a third
of a ring build's time at P = 256). Reference counting still frees everything as usual; the collector is enabled
again on exit from the block, and its next collection (once allocations pass its threshold) walks the objects made
inside it that are still alive, and the cycles left behind. A sweep pauses it for a whole point
(:mod:`simulator.run.sweep`): the point's ops are freed before that collection comes.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector inside the block (nested uses are fine); restore its state on exit."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
