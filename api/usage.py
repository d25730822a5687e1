"""A tenant's usage of the fleet: its weight and share of the admitted charge, its backlog and
its admission waits, read from the admissions every router records (:meth:`Feed.admissions`,
the last :data:`WINDOW` of them) and the store's state index."""

from __future__ import annotations

import json
from typing import Any, cast

import redis

from api.views import Usage
from kernel.states import LifecycleState
from router.admission.tenants import AdmissionConfig
from router.wire.feed import Feed
from store.base import TrajectoryStore

WINDOW = 5000  # the most recent admissions read


def recent_admissions(client: redis.Redis, feed: Feed) -> list[dict[str, Any]]:
    """The last :data:`WINDOW` admission entries."""
    raw = cast(list[bytes], client.lrange(feed.admissions_key, -WINDOW, -1))
    return [json.loads(r) for r in raw]


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def usage_of(
    tenants: list[str],
    config: AdmissionConfig,
    store: TrajectoryStore,
    admissions: list[dict[str, Any]],
) -> list[Usage]:
    """Usage of each of ``tenants`` (each configured), against every tenant's weight."""
    total_weight = sum(t.weight for t in config.tenants)
    charge: dict[str, int] = {}
    waits: dict[str, list[float]] = {}
    for entry in admissions:
        charge[entry["t"]] = charge.get(entry["t"], 0) + int(entry.get("c", 0))
        if "w" in entry:
            waits.setdefault(entry["t"], []).append(float(entry["w"]))
    total_charge = sum(charge.values()) or 1
    out = []
    for name in tenants:
        cfg = config.tenant(name)
        if cfg is None:
            continue
        mine = waits.get(name, [])
        out.append(
            Usage(
                tenant=name,
                weight=cfg.weight,
                weight_share=cfg.weight / total_weight,
                admitted_share=charge.get(name, 0) / total_charge,
                admissions=sum(1 for e in admissions if e["t"] == name),
                backlog=store.count(name, LifecycleState.READY),
                wait_p50_s=_quantile(mine, 0.5),
                wait_p99_s=_quantile(mine, 0.99),
            )
        )
    return out
