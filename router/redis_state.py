"""The Redis admitter's state as its parts share it: one hash tag, its keys, its clock.

Every part of :class:`router.redis_admitter.RedisAdmitter` (queue, claims, commits, lapsed
claims, figures) reads and writes the same state under ``{P:adm}`` (layout in
``lua/state.lua``); every write is a run of one of its Lua scripts.
Design: ``docs/adr/0003-redis-admitter-claims.md``.
"""

from __future__ import annotations

import hashlib

import redis

from kernel.errors import ConfigError
from router.admitter import Clock
from router.redis_gates import LuaScript, admitter_tag
from router.tenants import AdmissionConfig, LaneIndex
from store.redis_client import text


class AdmitterState:
    """The admitter's state in Redis: client, keys, lanes, clock and the claim deadline."""

    def __init__(
        self,
        client: redis.Redis,
        config: AdmissionConfig,
        *,
        prefix: str,
        clock: Clock | None,
        claim_ttl_s: float,
    ) -> None:
        self.client = client
        self.config = config
        self.tag = admitter_tag(prefix)
        self.keys = (f"{self.tag}:st",)
        self.lanes = LaneIndex(config)
        self.clock = clock
        #: The claim deadline, as the claim scripts take it.
        self.claim_ttl = repr(float(claim_ttl_s))

    def script(self, *files: str) -> LuaScript:
        """An admitter script: ``state.lua`` (keys and helpers), then ``files`` in order."""
        return LuaScript(self.client, "state.lua", *files)

    def install(self) -> None:
        """Write the configuration into an empty state, or check the state holds the same one.

        Raises :class:`ConfigError`, writing nothing, when it holds another configuration.
        """
        config = self.config
        args: list[object] = [_fingerprint(config), config.credit_cap_tokens, len(config.tenants)]
        for t in config.tenants:
            args += [round(config.quantum_tokens * t.weight), len(t.class_names)]
            args += [round(config.quantum_tokens * w) for w in t.class_weights]
        reply = self.script("init.lua")(self.keys, args, retry=True)
        if isinstance(reply, list):
            raise ConfigError(
                f"admitter state {self.tag} holds another configuration ({text(reply[1])}); "
                "drain it or use another REINS_KEY_PREFIX"
            )

    def now(self) -> str:
        """The time argument of a script: the injected clock's, or "" for Redis TIME."""
        return "" if self.clock is None else repr(self.clock())

    def time(self) -> float:
        """The injected clock's time, or the Redis server's."""
        if self.clock is not None:
            return self.clock()
        seconds, micros = self.client.time()
        return float(seconds) + micros / 1_000_000

    def fields(self, names: list[str]) -> list[int]:
        """Integer fields of the state hash (0 for a missing one)."""
        return [int(text(v or b"0")) for v in self.client.hmget(f"{self.tag}:st", names)]

    def rotation_length(self) -> int:
        """How many lanes are in rotation (new and old lists)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.llen(f"{self.tag}:new")
        pipe.llen(f"{self.tag}:old")
        return int(sum(pipe.execute()))


def _fingerprint(config: AdmissionConfig) -> str:
    shape = config.model_dump_json(include={"quantum_tokens", "credit_cap_tokens", "tenants"})
    return hashlib.sha1(shape.encode()).hexdigest()[:16]
