"""Fixtures of the quota tests: a clock the tests move by hand, gates on memory and on Redis."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from router.admission.gates import GateConfig, MemoryGates, ProviderGates
from router.admission.redis.gates import RedisGates
from tests.support import ManualClock

GATE_BACKENDS = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000.0)


MakeGates = Callable[[GateConfig], ProviderGates]


@pytest.fixture(params=GATE_BACKENDS)
def make_gates(request: pytest.FixtureRequest, clock: ManualClock) -> Iterator[MakeGates]:
    if request.param == "memory":
        yield lambda cfg: MemoryGates(cfg, clock)
        return
    client: redis.Redis = request.getfixturevalue("redis_client")
    prefix: str = request.getfixturevalue("key_prefix")

    def make(cfg: GateConfig) -> ProviderGates:
        gates = RedisGates(client, cfg, prefix=prefix, clock=clock)
        gates.configure()
        return gates

    yield make
