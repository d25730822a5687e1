"""Which API the CLI's client commands talk to: ``REINS_API_URL`` and ``REINS_API_KEY``.

They are taken out of the environment when the CLI starts (:func:`take`), because every other
``REINS_*`` variable is a setting of the fleet's processes and :meth:`Settings.from_env` refuses
names it does not know.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from api.client import ReinsClient
from kernel.errors import ConfigError, ReinsError

URL, KEY = "REINS_API_URL", "REINS_API_KEY"


@dataclass(frozen=True, slots=True)
class ApiTarget:
    """The API's base URL and the caller's key."""

    url: str
    key: str


_TARGET: list[ApiTarget | None] = [None]
_MISSING = [""]


def take(env: MutableMapping[str, str] | None = None) -> ApiTarget | None:
    """Remove both variables from ``env`` (the process's) and remember them; the target, or
    None unless both are set."""
    env = os.environ if env is None else env
    url, key = env.pop(URL, ""), env.pop(KEY, "")
    _TARGET[0] = ApiTarget(url.rstrip("/"), key) if url and key else None
    _MISSING[0] = "" if _TARGET[0] is not None or not (url or key) else (KEY if url else URL)
    return _TARGET[0]


def current() -> ApiTarget | None:
    """The target taken at start, if both variables were set."""
    return _TARGET[0]


def absent() -> bool:
    """True when neither variable was set: the commands that can act on the embedded store
    (``REINS_SQLITE_PATH``) do so; one variable alone is a mistake :func:`require` names."""
    return _TARGET[0] is None and not _MISSING[0]


def require() -> ApiTarget:
    """The target; a :class:`ConfigError` saying what to set when there is none."""
    target = _TARGET[0]
    if target is None:
        missing = _MISSING[0] or f"{URL} and {KEY}"
        raise ConfigError(f"set {missing} (reins up prints both; keys come from reins keys create)")
    return target


@contextmanager
def connected() -> Iterator[ReinsClient]:
    """A client of the API the environment names; transport failures say what to check."""
    target = require()
    with ReinsClient(target.url, target.key) as client:
        try:
            yield client
        except httpx.TransportError as exc:
            raise ReinsError(
                f"cannot reach the API at {target.url} ({exc}); is reins api (or reins up) "
                "running, and is REINS_API_URL right?"
            ) from None
