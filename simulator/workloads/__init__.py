"""Workload models of the scenario YAML (``workload:``), one module per kind, and the union the scenario validates
against (discriminated by ``kind``). A new kind: a module here, and one member more in :data:`Workload`."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from simulator.workloads.base import ModelShape
from simulator.workloads.collective import CollectiveWorkload
from simulator.workloads.decode import DecodeWorkload
from simulator.workloads.flows import FlowSpec, FlowsWorkload
from simulator.workloads.generate import GenerateWorkload
from simulator.workloads.prefill import PrefillWorkload

__all__ = ["CollectiveWorkload", "DecodeWorkload", "FlowSpec", "FlowsWorkload", "GenerateWorkload", "ModelShape",
           "PrefillWorkload", "Workload"]

Workload = Annotated[DecodeWorkload | FlowsWorkload | CollectiveWorkload | PrefillWorkload | GenerateWorkload,
                     Field(discriminator="kind")]
