"""``treering schema``: the JSON Schema of scenario files (for editors), or with ``--columns`` the result columns of
every workload kind. The schema needs only the scenario's models: this verb loads nothing else (it answers at once);
the columns load the table of workload kinds."""

from __future__ import annotations

import argparse
import json

from simulator.errors import InputError, excerpt
from simulator.run.scenario import Scenario
from simulator.support.console import say

__all__ = ["cmd_schema"]


def cmd_schema(args: argparse.Namespace) -> int:
    if args.columns is None:
        say(json.dumps(Scenario.model_json_schema(), indent=2))
        return 0
    from simulator.run.kinds import KINDS
    from simulator.run.rows import columns_markdown

    if args.columns != "all" and args.columns not in KINDS:
        raise InputError(f"unknown workload kind {excerpt(args.columns)}; valid: {', '.join(KINDS)}", field="--columns")
    say(columns_markdown({k: kind.columns for k, kind in KINDS.items() if args.columns in ("all", k)}))
    return 0
