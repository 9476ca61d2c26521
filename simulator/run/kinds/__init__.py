"""One module per workload kind: its checks, runs and rows (registered in simulator.run.kinds.KINDS)."""
