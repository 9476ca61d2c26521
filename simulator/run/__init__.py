"""From a scenario to result rows: scenario YAML, points prepared once, one table of workload kinds, row schemas, the
sweep."""
