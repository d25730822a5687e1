"""Tenant and service-class names to an admitter's lane and class numbers.

A lane is a tenant's place in the admitter's state, a class number its queue inside the lane.
In process the numbers follow the configuration's order. The shared admitter keeps them stable
across versions of the configuration (``lua/init.lua``): its *layout* lists every tenant ever
configured, in the order it first appeared, each with every class it ever had. A tenant the
configuration in force leaves out is *retired*: what it has queued drains, its running
trajectories come back to its queue, and nothing new of it is accepted. Design:
``docs/adr/0120-live-configuration.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernel.errors import SubmissionRefused, UnknownTenant
from router.admission.tenants import AdmissionConfig, ServiceClassConfig, TenantConfig

#: Per lane, in lane order: the tenant's name and its class names in class-number order.
Layout = Sequence[tuple[str, Sequence[str]]]


def config_layout(config: AdmissionConfig) -> list[tuple[str, tuple[str, ...]]]:
    """The layout of ``config`` alone: its tenants and classes in their order."""
    return [(t.name, t.class_names) for t in config.tenants]


def _retired(name: str, classes: Sequence[str], config: AdmissionConfig) -> TenantConfig:
    """What a retired tenant's returning calls are checked against: no call larger than the
    credit cap (it could never be admitted), its classes at equal weight."""
    return TenantConfig(
        name=name,
        weight=1.0,
        max_ready=1,
        largest_call_tokens=config.credit_cap_tokens,
        classes=tuple(ServiceClassConfig(name=c, weight=1.0) for c in classes),
        agents=(),
    )


class LaneIndex:
    """Names to lane and class numbers over a layout (default: the configuration's order)."""

    def __init__(self, config: AdmissionConfig, layout: Layout | None = None) -> None:
        self.config = config
        layout = config_layout(config) if layout is None else layout
        by_name = {t.name: t for t in config.tenants}
        laid_out = {n for n, _ in layout}
        missing = [name for name in by_name if name not in laid_out]
        if missing:
            raise ValueError(f"layout has no lane for tenants {missing}")
        #: Per lane: the tenant's configuration (a placeholder for a retired tenant).
        self.tenants = [by_name.get(n) or _retired(n, cs, config) for n, cs in layout]
        #: Per lane: True while the configuration in force names its tenant.
        self.live = [n in by_name for n, _ in layout]
        self.lane_of = {name: i for i, (name, _) in enumerate(layout)}
        self.class_of = [{c: k for k, c in enumerate(cs)} for _, cs in layout]
        #: Per lane: its class names by class number.
        self.classes = [tuple(cs) for _, cs in layout]
        #: Per lane: the classes a submission may name (the configuration's, or every one).
        self._open = [
            set(t.class_names) if live else set(cs)
            for t, live, (_, cs) in zip(self.tenants, self.live, layout, strict=True)
        ]
        #: Per lane: the number of its first class (where a call naming none goes).
        self.first_class = [self.class_of[i][t.class_names[0]] for i, t in enumerate(self.tenants)]
        #: The lane of each tenant of the configuration, in its order.
        self.configured = [self.lane_of[t.name] for t in config.tenants]

    def resolve(
        self, tenant: str, service_class: str | None, *, returning: bool = False
    ) -> tuple[int, int, TenantConfig]:
        """(lane, class, tenant config), or a refusal naming the unknown tenant or class.

        ``returning``: a trajectory already running comes back; a retired tenant is accepted
        then, and a class the configuration no longer has goes to the tenant's first class.
        """
        lane = self.lane_of.get(tenant)
        if lane is None or not (self.live[lane] or returning):
            known = ", ".join(t.name for t in self.config.tenants)
            raise UnknownTenant(f"tenant {tenant!r} is not configured; known: {known}")
        cfg = self.tenants[lane]
        if service_class is None:
            return lane, self.first_class[lane], cfg
        klass = self.class_of[lane].get(service_class)
        if klass is None or service_class not in self._open[lane]:
            if returning:
                return lane, self.first_class[lane], cfg
            raise SubmissionRefused(
                f"tenant {tenant!r} has no service class {service_class!r}; "
                f"known: {', '.join(cfg.class_names)}",
                code="unknown_service_class",
                field="service_class",
            )
        return lane, klass, cfg

    def name(self, lane: int) -> str:
        """The tenant of ``lane``."""
        return self.tenants[lane].name

    def class_name(self, lane: int, klass: int) -> str:
        """The name of class ``klass`` of ``lane``."""
        return self.classes[lane][klass]

    def backlogged(self, depths: Sequence[int]) -> bool:
        """True when every configured tenant has a call queued, by per-lane ``depths``."""
        return bool(depths) and all(
            depths[lane] > 0 for lane in self.configured if lane < len(depths)
        )
