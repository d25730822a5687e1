"""The cancel signal a model call honours, and the registry of calls in flight.

A provider is a :class:`~worker.models.Model`: it answers one view with one reply and never
raises for anything the far side does: an HTTP error, a cut stream or a malformed chunk is a
reply status.
The cancel signal is a :class:`CancelToken`, a ``threading.Event`` that also runs callbacks at
the moment it is set, so a provider can close its connection at once from the canceller's
thread instead of noticing at its next read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kernel.errors import ConfigError


class ProviderConfigError(ConfigError):
    """An agent profile's provider settings that cannot be used (unknown provider, no URL)."""


class CancelToken(threading.Event):
    """A cancel signal: set it to stop a call; callbacks registered by the call run at once.

    Contract: every callback registered before :meth:`set` runs exactly once, in the thread
    that calls ``set``; a callback registered after ``set`` runs immediately in the caller's
    thread. Callbacks must be quick and must not raise.
    """

    def __init__(self) -> None:
        super().__init__()
        self._guard = threading.Lock()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next = 0

    def set(self) -> None:
        """Signal cancellation and run the registered callbacks (once)."""
        with self._guard:
            if self.is_set():
                return
            super().set()
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` when the token is set; returns a function that unregisters it."""
        with self._guard:
            if not self.is_set():
                key = self._next
                self._next += 1
                self._callbacks[key] = callback

                def unregister() -> None:
                    with self._guard:
                        self._callbacks.pop(key, None)

                return unregister
        callback()
        return lambda: None


class InFlightCalls:
    """The cancel tokens of the model calls a worker has in flight, by call id.

    A runner opens a token before it sends a call and closes it when the reply is in; the
    kernel's ``CancelCall`` command is carried out by :meth:`cancel`. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, CancelToken] = {}

    def open(self, call_id: str) -> CancelToken:
        """A fresh token for ``call_id`` (replacing none: a call id is sent once)."""
        token = CancelToken()
        with self._lock:
            if call_id in self._tokens:
                raise ValueError(f"model call {call_id} is already in flight")
            self._tokens[call_id] = token
        return token

    def cancel(self, call_id: str) -> bool:
        """Cancel ``call_id`` if it is in flight; False when it is not (already answered)."""
        with self._lock:
            token = self._tokens.get(call_id)
        if token is None:
            return False
        token.set()
        return True

    def close(self, call_id: str) -> None:
        """Forget ``call_id``: its reply is in."""
        with self._lock:
            self._tokens.pop(call_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._tokens)
