"""``treering topo``: list the presets, show a preset or topology file, import a topology from real servers
(nvidia-smi topo -m output or NCCL topology XML)."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.cluster.hostgraph import ImportOptions
from simulator.cluster.importers import import_topology
from simulator.cluster.summary import summarize
from simulator.cluster.topology import list_presets, load_topology, preset_description
from simulator.errors import InputError
from simulator.support.console import say
from simulator.support.files import write_text_atomic
from simulator.support.yaml_lines import parse_set
from simulator.units import parse_bandwidth

__all__ = ["cmd_topo"]


def cmd_topo(args: argparse.Namespace) -> int:
    if args.topo_verb == "list":
        for name in list_presets():
            print(f"{name:<14} {preset_description(name)}")
        return 0
    if args.topo_verb == "import":
        return _cmd_topo_import(args)
    params = dict(parse_set(s) for s in args.sets)
    cluster = load_topology(args.topology, params, Path.cwd(), args.force)
    say(summarize(cluster))
    return 0


def _cmd_topo_import(args: argparse.Namespace) -> int:
    def bandwidth(value: str | None, flag: str) -> float | None:
        if value is None:
            return None
        try:
            bw = parse_bandwidth(value)
        except InputError as err:
            raise err.located(field=flag) from None
        if bw <= 0:
            raise InputError(f"must be positive, got {value!r}", field=flag)
        return bw

    opts = ImportOptions(device=args.device, nvlink_gen=args.nvlink_gen,
                         pcie_Bps=bandwidth(args.pcie_bandwidth, "--pcie-bandwidth"),
                         nic_Bps=bandwidth(args.nic_bandwidth, "--nic-bandwidth"),
                         smp_Bps=bandwidth(args.smp_bandwidth, "--smp-bandwidth") or 0.0,
                         nics=tuple(n.strip() for n in args.nics.split(",") if n.strip()) if args.nics else None)
    out = Path(args.out)
    text = import_topology(args.files, nodes=args.nodes, fabric_kind=args.fabric, name=args.name or out.stem,
                           opts=opts)
    write_text_atomic(out, text)
    print(f"wrote {out}")
    print(summarize(load_topology(str(out))))
    return 0
