"""The engine room: the only simpy code (:mod:`.core`), the flow-level network with max-min fair sharing
(:mod:`.network`) and the host resources that CPU ranks share (:mod:`.host`)."""

from simulator.engine.core import SimResult, simulate

__all__ = ["SimResult", "simulate"]
