"""Fixtures: a local OpenAI-compatible server per test, stopped when the test ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.providers.fake_openai import FakeOpenAI, Reply, Script

Serve = Callable[[Script | Sequence[Reply]], FakeOpenAI]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start a server on 127.0.0.1 (a free port) with a script; every one started is stopped."""
    started: list[FakeOpenAI] = []

    def start(script: Script | Sequence[Reply]) -> FakeOpenAI:
        server = FakeOpenAI(script).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
    for server in started:
        assert not server.errors, server.errors
