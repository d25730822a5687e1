"""A tenant's usage of the fleet: its weight and share of the admitted charge, its backlog and
what it is owed, its admission waits, and its shares over time; read from the admissions every
router records (:meth:`Feed.admissions`, the last :data:`WINDOW` of them) and the store's state
index."""

from __future__ import annotations

import json
from typing import Any, cast

import redis

from api.views import SharesAt, Usage, UsageHistory
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
    """Usage of each of ``tenants`` (each configured), against every tenant's weight. Owed
    shares are given only when ``tenants`` is every configured tenant (an operator's view):
    they depend on the others' queues, which a tenant must not learn."""
    total_weight = sum(t.weight for t in config.tenants)
    every = set(tenants) >= {t.name for t in config.tenants}
    charge: dict[str, int] = {}
    waits: dict[str, list[float]] = {}
    for entry in admissions:
        charge[entry["t"]] = charge.get(entry["t"], 0) + int(entry.get("c", 0))
        if "w" in entry:
            waits.setdefault(entry["t"], []).append(float(entry["w"]))
    total_charge = sum(charge.values()) or 1
    backlogs = {
        name: store.count(name, LifecycleState.READY)
        for name in tenants
        if config.tenant(name) is not None
    }
    owed_weight = sum(t.weight for t in config.tenants if backlogs.get(t.name, 0) > 0)
    out = []
    for name, backlog in backlogs.items():
        cfg = config.tenant(name)
        assert cfg is not None  # backlogs holds configured tenants only
        mine = waits.get(name, [])
        out.append(
            Usage(
                tenant=name,
                weight=cfg.weight,
                weight_share=cfg.weight / total_weight,
                admitted_share=charge.get(name, 0) / total_charge,
                admissions=sum(1 for e in admissions if e["t"] == name),
                backlog=backlog,
                backlogged=backlog > 0,
                owed_share=cfg.weight / owed_weight if every and backlog > 0 else None,
                wait_p50_s=_quantile(mine, 0.5),
                wait_p99_s=_quantile(mine, 0.99),
            )
        )
    return out


def history_of(tenants: list[str], admissions: list[dict[str, Any]], buckets: int) -> UsageHistory:
    """The admitted shares of ``tenants`` in ``buckets`` equal spans of time, from the first of
    ``admissions`` to the last; each share is of every tenant's charge in its span."""
    timed = [e for e in admissions if isinstance(e.get("at"), int | float)]
    if not timed:
        return UsageHistory(tenants=tenants, buckets=[])
    first = min(float(e["at"]) for e in timed)
    width = max(max(float(e["at"]) for e in timed) - first, 1e-6) / buckets
    charge: list[dict[str, int]] = [{} for _ in range(buckets)]
    count, contended = [0] * buckets, [0] * buckets
    for e in timed:
        i = min(buckets - 1, int((float(e["at"]) - first) / width))
        charge[i][e["t"]] = charge[i].get(e["t"], 0) + int(e.get("c", 0))
        count[i] += 1
        contended[i] += 1 if e.get("b") else 0
    out = []
    for i in range(buckets):
        total = sum(charge[i].values()) or 1
        out.append(
            SharesAt(
                start=first + i * width,
                end=first + (i + 1) * width,
                admissions=count[i],
                contended=contended[i] / count[i] if count[i] else None,
                shares={t: charge[i].get(t, 0) / total for t in tenants} if count[i] else {},
            )
        )
    return UsageHistory(tenants=tenants, buckets=out)
