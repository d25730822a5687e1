"""Benchmarks: ``reins bench NAME`` runs ``ops.bench.NAME.run()``, which returns one JSON object.

Each benchmark measures reins side by side with a named peer in the same run and reports
ratios, because these machines are shared and noisy; its module's ``peer()`` says what the peer
is, at which version and by which path, and its JSON carries that as ``peer``. Timing is never
asserted in a test.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

from kernel.errors import InvalidInput
from ops.bench.peers import Peer

BENCHMARKS = {
    "kernel": "ops.bench.kernel",
    "ring": "ops.bench.ring",
    "admitter": "ops.bench.admitter",
    "store": "ops.bench.store",
    "fleet": "ops.bench.fleet",
    "api": "ops.bench.api",
    "memory": "ops.bench.memory",
    "retention": "ops.bench.retention",
    "scale": "ops.bench.scale",
    "soak": "ops.bench.soak",
    "provider": "ops.bench.provider",
}


def _module(name: str) -> ModuleType:
    module = BENCHMARKS.get(name)
    if module is None:
        raise InvalidInput(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            raise InvalidInput(f"benchmark {name!r} is not built yet") from None
        raise


def load(name: str) -> Callable[..., dict[str, Any]]:
    """Return the ``run`` function of benchmark NAME, or refuse an unknown name."""
    run: Callable[..., dict[str, Any]] = _module(name).run
    return run


def peer(name: str, **options: Any) -> dict[str, str]:
    """The peer benchmark NAME declares for ``options`` (of those its ``run`` takes), as the
    ``peer`` object of its JSON (:mod:`ops.bench.peers`)."""
    declared: Peer = _module(name).peer(**options)
    return declared.as_json()


def options(name: str, run: Callable[..., dict[str, Any]], **given: Any) -> dict[str, Any]:
    """The options set in ``given`` (flags of ``reins bench``; unset is None or False), refused
    by name when benchmark NAME's ``run`` does not take them."""
    chosen = {option: value for option, value in given.items() if value not in (None, False)}
    accepted = inspect.signature(run).parameters
    for option in chosen:
        if option not in accepted:
            raise InvalidInput(f"benchmark {name!r} has no --{option.replace('_', '-')} option")
    return chosen
