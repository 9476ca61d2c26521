"""``treering topo``: list the presets, show a preset or topology file, import a topology from real servers
(nvidia-smi topo -m output or NCCL topology XML)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.errors import InputError

if TYPE_CHECKING:
    from simulator.cluster.topology import Cluster

__all__ = ["cmd_topo"]


def cmd_topo(args: argparse.Namespace) -> int:
    if args.topo_verb == "list":  # (a light module: the list answers at once)
        from simulator.cluster.presets import list_presets, preset_description

        for name in list_presets():
            print(f"{name:<14} {preset_description(name)}")
        return 0
    if args.topo_verb == "import":
        return _cmd_topo_import(args)
    from simulator.cluster.summary import summarize
    from simulator.cluster.topology import load_topology
    from simulator.support.console import say
    from simulator.support.yaml_lines import parse_set

    params = dict(parse_set(s) for s in args.sets)
    cluster = load_topology(args.topology, params, Path.cwd(), args.force)
    say(summarize(cluster))
    return 0


def _cmd_topo_import(args: argparse.Namespace) -> int:
    """Import, check the topology as ``topo show`` and ``run`` would load it, then write it (atomically): a refused
    import leaves ``--out`` as it was."""
    from simulator.cluster.hostgraph import ImportOptions
    from simulator.cluster.importers import import_topology
    from simulator.cluster.summary import summarize
    from simulator.support.files import write_text_atomic
    from simulator.support.outdir import check_output_file
    from simulator.units import checked_quantity

    force = bool(getattr(args, "force", False))

    def bandwidth(value: str | None, flag: str) -> float | None:
        if value is None:
            return None
        try:
            return checked_quantity(value, "bandwidth", positive=True, unit=False, plausible=not force)
        except InputError as err:
            raise err.located(field=flag) from None

    nics = None if args.nics is None else tuple(n.strip() for n in args.nics.split(",") if n.strip())
    opts = ImportOptions(device=args.device, nvlink_gen=args.nvlink_gen,
                         pcie_Bps=bandwidth(args.pcie_bandwidth, "--pcie-bandwidth"),
                         nic_Bps=bandwidth(args.nic_bandwidth, "--nic-bandwidth"),
                         smp_Bps=bandwidth(args.smp_bandwidth, "--smp-bandwidth") or 0.0, nics=nics)
    out = Path(args.out)
    check_output_file(out)
    text = import_topology(args.files, nodes=args.nodes, fabric_kind=args.fabric, name=args.name or out.stem,
                           opts=opts)
    cluster = _loaded(text, out, force)
    write_text_atomic(out, text)
    print(f"wrote {out}")
    print(summarize(cluster))
    return 0


def _loaded(text: str, out: Path, force: bool) -> Cluster:
    """The cluster ``text`` is, loaded as ``treering`` will load the file; a topology that would not load is refused
    with the entry at fault (its comment says where it came from), and nothing is written."""
    from simulator.cluster.topology import build_cluster
    from simulator.support.yaml_lines import load_yaml_text
    from simulator.units import user_check

    try:
        return build_cluster(load_yaml_text(text, str(out)), str(out), check=user_check(force))
    except InputError as err:
        lines = text.splitlines()
        entry = lines[err.line - 1].strip() if err.line and 0 < err.line <= len(lines) else ""
        where = f" (the entry `{entry if len(entry) <= 240 else entry[:237] + '...'}`)" if entry else ""
        raise InputError(f"{err.message}{where}: the imported topology would not load; {out} not written",
                         field=err.field or "FILE") from None
