"""Workload models of the scenario YAML (``workload:``), one module per kind (``decode``, ``prefill``, ``generate``,
``collective``, ``flows``), their shapes and cost formulas (``shape``, ``prefill_shape``) and the sequence layouts
(``layouts``). The scenario validates against their union (:data:`simulator.run.scenario.Workload`, discriminated
by ``kind``); each kind's checks, simulation and rows are in :mod:`simulator.run.kinds`. Nothing is imported here,
so that the shapes and layouts load without the workload models (the kernel table needs the shapes)."""
