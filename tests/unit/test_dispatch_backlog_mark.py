"""The dispatcher marks admissions backlogged only for configurations it can afford to check."""

from __future__ import annotations

from typing import Any

import pytest

from router.admission.local import Admitter
from router.admission.tenants import AdmissionConfig
from router.placement.ring import Ring
from router.process.dispatch import BACKLOG_MARK_UP_TO, Dispatcher


def dispatcher_over(tenants: int) -> Dispatcher:
    config = AdmissionConfig.from_mapping(
        {
            "quantum_tokens": 1_000,
            "credit_cap_tokens": 10_000,
            "tenants": [
                {"name": f"t{i}", "weight": 1, "max_ready": 5, "largest_call_tokens": 5_000}
                for i in range(tenants)
            ],
        }
    )
    none: Any = None
    return Dispatcher(
        name="router-a",
        store=none,
        admitter=Admitter(config, lambda: 0.0),
        feed=none,
        agents=none,
        ring=Ring,
        sender=lambda member, payload: None,
    )


@pytest.mark.parametrize(
    ("tenants", "marked"), [(3, True), (BACKLOG_MARK_UP_TO, True), (BACKLOG_MARK_UP_TO + 1, False)]
)
def test_every_tenants_depth_is_read_only_up_to_the_bound(tenants: int, marked: bool) -> None:
    assert dispatcher_over(tenants)._marks_backlog() is marked
