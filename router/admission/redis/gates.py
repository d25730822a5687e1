"""The provider gates in Redis, shared by every router replica.

Every key lives under the admitter's hash tag ``{P:adm}`` (layout in ``lua/state.lua`` and
``lua/gates.lua``), so the admitter's claim debits a gate in the same script that picks the
call. Each operation here is one ``EVALSHA`` of ``lua/gate.lua``, on the Redis server's clock
unless one is injected, and is retried after a lost reply: each is idempotent (a debit under
the same lease id counts once). Design: ``docs/adr/0004-provider-gates.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from kernel.errors import ConfigError
from router.admission.gates import Clock, Feedback, GateConfig, GateReading, ProviderGates
from store.redis_client import text
from store.scripts import LuaScript, scripts_beside

SCRIPTS = scripts_beside(__file__)


def admitter_tag(prefix: str) -> str:
    """``{P:adm}``: the one hash tag of every admitter and gate key under ``prefix``."""
    if not prefix or any(c in prefix for c in "{} "):
        raise ConfigError(f"REINS_KEY_PREFIX: {prefix!r} must be non-empty, without braces")
    return f"{{{prefix}:adm}}"


def reading_from(route: str, reply: Sequence[Any]) -> GateReading:
    """A :class:`GateReading` from gate.lua's reply."""
    return GateReading(
        route=route,
        ok=int(reply[0]) == 1,
        reason=text(reply[1]),
        requests=int(reply[2]),
        tokens=int(reply[3]),
        leases=int(reply[4]),
        rpm=int(reply[5]),
        tpm=int(reply[6]),
        concurrency=int(reply[7]),
        paused_until=float(text(reply[8])),
        remaining_requests=int(reply[9]),
        remaining_tokens=int(reply[10]),
        remaining_until=float(text(reply[11])),
    )


class RedisGates(ProviderGates):
    """The gates of :mod:`router.admission.gates` in Redis; see the module docstring for keys and
    time.

    :meth:`configure` writes every route's limits (the router's boot step); counters already in
    Redis are kept, so replicas may configure concurrently and a restart loses no debit.
    """

    def __init__(
        self,
        client: redis.Redis,
        config: GateConfig,
        *,
        prefix: str = "reins",
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.prefix = prefix
        self.tag = admitter_tag(prefix)
        self._keys = (f"{self.tag}:st",)
        self._clock = clock
        self._script = LuaScript(client, SCRIPTS("state.lua", "gates.lua", "gate.lua"))

    def configure(self) -> None:
        """Write every route's limits (effective: after the safety share)."""
        for route, limits in self.config.routes.items():
            rpm, tpm, conc = limits.effective()
            self._run("configure", route, rpm, tpm, conc, limits.window_s, limits.lease_ttl_s)

    def knows(self, route: str) -> bool:
        """True if ``route`` is configured."""
        return route in self.config.routes

    def now_arg(self) -> str:
        """The time argument of a script: the injected clock's, or "" for Redis TIME."""
        return "" if self._clock is None else repr(self._clock())

    def debit(self, route: str, lease_id: str, tokens: int) -> GateReading:
        return self._run("debit", route, lease_id, tokens)

    def renew(self, route: str, lease_id: str) -> bool:
        return self._run("renew", route, lease_id).ok

    def settle(self, route: str, lease_id: str, used_tokens: int | None) -> GateReading:
        return self._run("settle", route, lease_id, -1 if used_tokens is None else used_tokens)

    def release(self, route: str, lease_id: str) -> GateReading:
        return self._run("release", route, lease_id)

    def observe(self, route: str, feedback: Feedback) -> GateReading:
        retry = -1.0 if feedback.retry_after_s is None else max(feedback.retry_after_s, 0.0)
        reset = -1.0 if feedback.reset_s is None else max(feedback.reset_s, 0.0)
        return self._run(
            "observe",
            route,
            repr(retry),
            feedback.remaining_requests,
            feedback.remaining_tokens,
            repr(reset),
        )

    def reading(self, route: str) -> GateReading:
        return self._run("read", route)

    def _run(self, op: str, route: str, *args: object) -> GateReading:
        # a debit retried after a lost reply finds its own lease held and is not counted twice
        reply = self._script(self._keys, (op, route, self.now_arg(), *args), retry=True)
        return reading_from(route, reply)
