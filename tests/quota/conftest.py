"""Fixtures of the quota tests: a clock the tests move by hand, gates on memory and on Redis."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from router.gates import GateConfig, MemoryGates, ProviderGates
from router.redis_gates import RedisGates

GATE_BACKENDS = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


class Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


MakeGates = Callable[[GateConfig], ProviderGates]


@pytest.fixture(params=GATE_BACKENDS)
def make_gates(request: pytest.FixtureRequest, clock: Clock) -> Iterator[MakeGates]:
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
