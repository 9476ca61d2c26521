"""``treering plan --objective cost``: the cheapest configuration meeting the time between tokens, across
topologies.

On one topology every GPU costs the same, so its cheapest configuration meeting the target is the one on the
fewest GPUs: :func:`simulator.plan.decode.plan`'s answer per algorithm. Across topologies (``--topology
dgx-h100,hgx-h200,hgx-b200,mi300x``) the prices differ: each topology's answers are priced at the offer for its
GPUs (``--offers``, else the cheapest rented offer of ``topologies/prices.yaml`` for that device, said in the
output), and the cheapest meeting the target is the answer. A configuration's cost: ``usd_per_hour = gpus x
usd_per_gpu_hour``, ``usd_per_m_tokens = usd_per_hour x tbt / 3600 / batch x 1e6`` (a decode step yields one token
per sequence).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from simulator.cluster.prices import Offer, load_offers, usd_per_m_tokens
from simulator.cluster.topology import load_topology
from simulator.errors import InputError, excerpt
from simulator.plan.decode import PlanRequest, PlanRow, plan

__all__ = ["PricedPlan", "cost_frame", "offer_for", "plan_cost"]


@dataclass(frozen=True)
class PricedPlan:
    """One topology's plan and the offer its GPUs are priced at."""

    topology: str
    device: str
    offer: Offer
    rows: Sequence[PlanRow]


def offer_for(device: str, offers: dict[str, Offer], named: Sequence[str]) -> Offer:
    """The offer pricing ``device``: the one of ``named`` for it, else the cheapest rented offer of the table for it
    (an owned offer only where none is rented: rent and ownership are not compared unless named)."""
    for name in named:
        if name not in offers:
            raise InputError(f"unknown offer {excerpt(name)}; offers of topologies/prices.yaml: {', '.join(offers)}",
                             field="--offers")
    mine = [offers[n] for n in named if offers[n].device == device]
    if not mine and not named:
        mine = sorted((o for o in offers.values() if o.device == device), key=lambda o: (o.owned, o.usd_per_gpu_hour))
    if not mine:
        listed = ", ".join(f"{o.name} ({o.device})" for o in offers.values())
        raise InputError(f"no offer prices {device} GPUs (offers: {listed})", field="--offers")
    return mine[0]


def plan_cost(req: PlanRequest, topologies: Sequence[str], named: Sequence[str],
              progress: Callable[[str], None] | None = None) -> list[PricedPlan]:
    """Each topology's plan, priced."""
    offers = load_offers()
    out = []
    for topology in topologies:
        probe = load_topology(topology, {"nodes": 1})
        devices = sorted({probe.specs[r].name for r in probe.ranks})
        if len(devices) != 1:
            raise InputError(f"{topology} has GPUs of several kinds ({', '.join(devices)}): price it with one offer",
                             field="--topology")
        offer = offer_for(devices[0], offers, named)
        out.append(PricedPlan(topology, devices[0], offer, plan(dataclasses.replace(req, topology=topology),
                                                                  progress)))
    return out


def cost_frame(priced: Sequence[PricedPlan], req: PlanRequest) -> pd.DataFrame:
    """One row per topology and algorithm: the plan's answer and its cost; those meeting the target first, the
    cheapest first."""
    records = []
    for p in priced:
        for row in p.rows:
            e = row.best
            usd_h = e.gpus * p.offer.usd_per_gpu_hour if e else None
            records.append({
                "topology": p.topology, "device": p.device, "offer": p.offer.name,
                "usd_per_gpu_hour": p.offer.usd_per_gpu_hour, "algorithm": row.algorithm, "met": row.met,
                "nodes": e.nodes if e else None, "gpus": e.gpus if e else None, "tp": e.tp if e else None,
                "tbt_ms": e.latency_s * 1e3 if e else None, "usd_per_hour": usd_h,
                "usd_per_m_tokens": usd_per_m_tokens(usd_h, e.latency_s, req.batch) if e and usd_h else None,
                "binding": row.binding})
    frame = pd.DataFrame.from_records(records)
    if len(frame):
        frame = frame.sort_values(["met", "usd_per_hour", "tbt_ms"], ascending=[False, True, True],
                                  na_position="last", kind="stable").reset_index(drop=True)
    return frame
