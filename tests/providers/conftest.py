"""Fixtures: a loopback provider server (both protocols) per test, stopped when it ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.providers.fake_provider import FakeProvider
from tests.providers.fake_replies import Reply, Script

Serve = Callable[[Script | Sequence[Reply]], FakeProvider]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start a server on 127.0.0.1 (a free port) with a script; every one started is stopped."""
    started: list[FakeProvider] = []

    def start(script: Script | Sequence[Reply]) -> FakeProvider:
        server = FakeProvider(script).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
    for server in started:
        assert not server.errors, server.errors
