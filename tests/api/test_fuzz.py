"""A schemathesis fuzz of the OpenAPI document, on the real Redis: no request, however malformed,
gets a 5xx. Bounded (a few examples per operation) to fit CI."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings

from api.app import create_app
from api.front import Front
from kernel.settings import Settings
from tests.api.conftest import Keys

pytestmark = pytest.mark.redis
EXAMPLES = 15


def test_no_operation_answers_a_fuzzed_request_with_a_5xx(
    api_env: dict[str, str], redis_client: redis.Redis, applied: int, keys: Keys
) -> None:
    config = Settings.from_env(api_env)
    app = create_app(config, Front.wire(config, client=redis_client))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    headers = keys.auth(keys.acme)
    server_errors: list[str] = []
    labels: list[str] = []
    statuses: set[int] = set()

    for result in schema.get_all_operations():
        operation = result.ok()
        labels.append(operation.label)

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: Any) -> None:
            response = case.call(headers={**(case.headers or {}), **headers})
            statuses.add(response.status_code)
            if response.status_code >= 500:
                server_errors.append(f"{case.method} {case.formatted_path}: {response.text[:300]}")

        fuzz()

    assert len(labels) >= 12, labels
    assert server_errors == []
    assert {200, 404, 422} <= statuses, statuses  # the fuzz reached the handlers
