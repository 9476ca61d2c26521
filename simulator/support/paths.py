"""Where the preset topologies and embedded scenarios live (the repository root, for editable installs)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DEFAULT_SCENARIO", "SCENARIO_DIR", "TOPOLOGY_DIR"]

_ROOT = Path(os.environ.get("TREERING_HOME", Path(__file__).resolve().parents[2]))
TOPOLOGY_DIR = _ROOT / "topologies"
SCENARIO_DIR = _ROOT / "scenarios"
DEFAULT_SCENARIO = SCENARIO_DIR / "quickstart.yaml"
