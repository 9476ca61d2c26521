"""The preset topologies shipped in ``topologies/``: their names and descriptions (``treering topo list``), read
without loading a topology (this module imports nothing heavy)."""

from __future__ import annotations

from simulator.support.paths import TOPOLOGY_DIR

__all__ = ["DEVICE_LIBRARY", "NOT_PRESETS", "PRICE_TABLE", "list_presets", "preset_description"]

DEVICE_LIBRARY = "devices.yaml"  # the named device specs, beside the presets (not a topology)
PRICE_TABLE = "prices.yaml"  # what a GPU-hour costs, by offer (simulator.cluster.prices; not a topology)
NOT_PRESETS = (DEVICE_LIBRARY, PRICE_TABLE)


def list_presets() -> list[str]:
    """Names of the preset topologies shipped in ``topologies/``."""
    return sorted(p.stem for p in TOPOLOGY_DIR.glob("*.yaml") if p.name not in NOT_PRESETS)


def preset_description(name: str) -> str:
    """The first sentence of a preset's leading comment (its description)."""
    lines = []
    for line in (TOPOLOGY_DIR / f"{name}.yaml").read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    text = " ".join(lines)
    return text.split(". ")[0].rstrip(".") if text else ""
