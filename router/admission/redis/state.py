"""The Redis admitter's state as its parts share it: one hash tag, its keys, its clock.

Every part of :class:`router.admission.redis.admitter.RedisAdmitter` (queue, claims, commits, lapsed
claims, figures) reads and writes the same state under ``{P:adm}`` (layout in
``lua/state.lua``); every write is a run of one of its Lua scripts.
Design: ``docs/adr/0003-redis-admitter-claims.md``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from kernel.errors import ConfigError
from router.admission.lanes import LaneIndex
from router.admission.local import Clock
from router.admission.redis.gates import SCRIPTS, admitter_tag
from router.admission.tenants import AdmissionConfig
from store.redis_client import text
from store.scripts import LuaScript

_T = TypeVar("_T")


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
        return LuaScript(self.client, SCRIPTS("state.lua", *files))

    def install(self, config: AdmissionConfig | None = None, version: int = 0) -> bool:
        """Install ``config`` (default: the one given at construction) as ``version``.

        Version 0 (a file): write it into an empty state, or check the state holds the same one
        (:class:`ConfigError` otherwise, writing nothing). Version >= 1 (the fleet's document):
        reconfigure the live state if it holds an older version (``lua/init.lua``: lanes kept by
        name, credit clipped to the new cap, new tenants with no credit, caps as given); if it
        holds this one or a newer one, only read its layout. Either way :attr:`lanes` follows
        the state's layout afterwards. Returns True when this call wrote the state.
        """
        config = self.config if config is None else config
        tenants = [
            [
                t.name,
                round(config.quantum_tokens * t.weight),
                [
                    [c, round(config.quantum_tokens * w)]
                    for c, w in zip(t.class_names, t.class_weights, strict=True)
                ],
                t.max_in_flight or 0,
            ]
            for t in config.tenants
        ]
        args = (version, _fingerprint(config), config.credit_cap_tokens, json.dumps(tenants))
        reply = self.script("init.lua")(self.keys, args, retry=True)
        if int(reply[0]) == -1:
            raise ConfigError(
                f"admitter state {self.tag} holds another configuration ({text(reply[1])}); "
                "apply the change with 'reins config apply', drain it, or use another "
                "REINS_KEY_PREFIX"
            )
        self.config = config
        self.lanes = LaneIndex(config, _layout(text(reply[1])))
        return int(reply[0]) == 1

    def reload(self) -> None:
        """Read the state's layout again (another process reconfigured it)."""
        raw = self.client.hget(f"{self.tag}:st", "layout")
        if raw is not None:
            self.lanes = LaneIndex(self.config, _layout(text(raw)))

    def parsed(self, parse: Callable[..., _T], *args: Any) -> _T:
        """``parse(self.lanes, *args)``; again after :meth:`reload` if it met a lane or class
        this process does not know yet (IndexError: another process reconfigured the state)."""
        try:
            return parse(self.lanes, *args)
        except IndexError:
            self.reload()
            return parse(self.lanes, *args)

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
    # Caps stay out of it: a state written before they existed still matches its file.
    shape = config.model_dump_json(
        include={"quantum_tokens", "credit_cap_tokens", "tenants"},
        exclude={"tenants": {"__all__": {"max_in_flight"}}},
    )
    return hashlib.sha1(shape.encode()).hexdigest()[:16]


def _layout(encoded: str) -> list[tuple[str, tuple[str, ...]]]:
    """The layout as ``init.lua`` stores it (Lua's cjson writes an empty list as ``{}``)."""
    return [(str(name), tuple(classes or ())) for name, classes in json.loads(encoded)]
