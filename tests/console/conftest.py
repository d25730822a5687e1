"""Fixtures of the console's tests: those of the API's tests (the fleet's document, keys, the
application in process, a held refund), and a client signed in to the console."""

from __future__ import annotations

from tests.api.conftest import (  # noqa: F401 - fixtures, found by name
    acme_held,
    api_env,
    applied,
    fleet_file,
    http,
    keys,
)
