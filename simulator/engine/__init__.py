"""The engine room: the engine (:mod:`.core`, its loop compiled in :mod:`.eventcore`; :mod:`.reference`, the same
model on a simpy calendar, one Python callback per event, for the tests), the flow-level network with max-min fair
sharing (:mod:`.network`, compiled in :mod:`.netstate` and :mod:`.flowcore`) and the host resources that CPU ranks
share (:mod:`.host`)."""

from simulator.engine.core import SimResult, simulate

__all__ = ["SimResult", "simulate"]
