"""Settings: one typed object, read from an environment mapping the caller passes in.

The kernel does no I/O, so it never reads ``os.environ`` itself: the boot step of a process
calls ``Settings.from_env(os.environ)``. Every ``REINS_*`` variable must be known; an unknown
one or an unparsable value fails loudly, naming the variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kernel.errors import ConfigError

PREFIX = "REINS_"
TEST_PREFIX = "REINS_TEST_"  # the test suite's own variables (its Redis, its screenshots)


#: Settings renamed, by their old name: the old variable still sets the new one.
RENAMED = {"admitter_lease_s": "admitter_leadership_s"}


class Settings(BaseModel):
    """Process-wide settings; each field maps to ``REINS_<FIELD>`` in the environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="the store's Redis")
    broker_url: str = Field("redis://127.0.0.1:6379/1", description="Celery's broker")
    key_prefix: str = Field("reins", min_length=1, description="prefix of every Redis key")
    sqlite_path: str = Field(".reins/reins.db", description="embedded store file")
    heartbeat_interval_s: float = Field(1.0, gt=0)
    heartbeat_timeout_s: float = Field(5.0, gt=0)
    member_retention_s: float = Field(
        3600.0,
        gt=0,
        description="a ring member with no heartbeat for this long is deleted from the membership "
        "(lapsed members stay listed, out of the ring, until then)",
    )
    visibility_timeout_s: float = Field(300.0, gt=0)
    max_turn_s: float = Field(
        60.0, gt=0, description="the longest a turn's model call or tool call may take"
    )
    stall_timeout_s: float = Field(
        90.0,
        gt=0,
        description="a member whose queue has work and whose consumer took nothing for this long "
        "is treated as dead",
    )
    owed_after_s: float | None = Field(
        None,
        gt=0,
        description="an ended run's open calls are reconciled this long after a router first "
        "sees it owing, and again as often while it still owes (unset: REINS_MAX_TURN_S)",
    )
    retention_days: float = Field(
        30.0,
        gt=0,
        description="a finished trajectory that owes nothing is deleted (record, chain, index) "
        "this long after its last chain row; a tenant's retention_days in the fleet's "
        "configuration overrides it",
    )
    redis_cluster: bool = Field(
        False,
        description="the store's Redis is a Redis Cluster (implied by a redis+cluster:// URL)",
    )
    redis_retry_attempts: int = Field(5, ge=1, le=50)
    redis_connect_timeout_s: float = Field(2.0, gt=0, description="connecting to any Redis")
    redis_timeout_s: float = Field(
        5.0, gt=0, description="a reply from any Redis (a blocking read waits less than this)"
    )
    # --- the fleet (worker/ and router/dispatch) ---
    worker_concurrency: int = Field(64, ge=1, le=4096, description="turns a worker runs at once")
    drain_grace_s: float = Field(30.0, ge=0, description="SIGTERM: time to finish and drain")
    scripted_latency_s: float | None = Field(
        None, ge=0, description="scripted models: seconds slept per call; unset: the policy's"
    )
    admitter_leadership_s: float = Field(
        3.0, gt=0, description="lease of the router that admits while the admitter is local"
    )
    tenants_file: str = Field("", description="tenant configuration (.toml or .json)")
    router_gather_s: float = Field(
        0.005,
        ge=0,
        le=1,
        description="a router woken by an ended turn waits this long for more (0: admits at once)",
    )
    follow_on_turns: int = Field(
        16,
        ge=0,
        le=1000,
        description=(
            "turns a worker may admit back to back for a trajectory it just ended READY, each "
            "only when that overtakes nobody in the shared admitter (0: every turn via a router)"
        ),
    )
    # --- model providers (worker/providers/http.py): one pool of connections per route ---
    provider_max_connections: int = Field(
        32, ge=1, le=4096, description="connections one provider route may hold open at once"
    )
    provider_keepalive_s: float = Field(
        60.0,
        ge=0,
        description="an idle pooled connection to a provider is closed after this long "
        "(0: one connection per call, none kept)",
    )
    provider_ca_bundle: str = Field(
        "",
        description="PEM file of the certificate authorities a provider's TLS certificate is "
        "verified against (unset: the system's); verification is never off",
    )
    # --- Prometheus (ops/observability/metrics.py): every router and worker process serves
    # /metrics ---
    metrics_port: int = Field(0, ge=0, le=65535, description="port of /metrics; 0: not served")
    metrics_host: str = Field(
        "127.0.0.1", min_length=1, description="address /metrics listens on (0.0.0.0 in a pod)"
    )
    metrics_worker_label: str = Field(
        "",
        pattern=r"^[A-Za-z0-9_.-]*$",
        description="the worker label of a worker's series, one that outlives a rollout (the "
        "Deployment's name or an ordinal); unset: the ring member's name",
    )
    # --- probes: /livez and /readyz of every router and worker process ---
    health_port: int = Field(0, ge=0, le=65535, description="port of /livez, /readyz; 0: none")
    health_host: str = Field("127.0.0.1", min_length=1, description="address probes listen on")

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        """Settings that contradict each other are refused, naming both."""
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ValueError(
                f"REINS_HEARTBEAT_TIMEOUT_S ({self.heartbeat_timeout_s}) must be above twice "
                f"REINS_HEARTBEAT_INTERVAL_S ({self.heartbeat_interval_s}): one late heartbeat "
                "would declare a live member dead"
            )
        if self.member_retention_s <= self.heartbeat_timeout_s:
            raise ValueError(
                f"REINS_MEMBER_RETENTION_S ({self.member_retention_s}) must be above "
                f"REINS_HEARTBEAT_TIMEOUT_S ({self.heartbeat_timeout_s}): a member would be "
                "deleted before it counts as lapsed"
            )
        if self.visibility_timeout_s <= self.max_turn_s:
            raise ValueError(
                f"REINS_VISIBILITY_TIMEOUT_S ({self.visibility_timeout_s}) must be above "
                f"REINS_MAX_TURN_S ({self.max_turn_s}): the broker would hand a running turn's "
                "message to another worker"
            )
        if self.stall_timeout_s <= self.max_turn_s:
            raise ValueError(
                f"REINS_STALL_TIMEOUT_S ({self.stall_timeout_s}) must be above REINS_MAX_TURN_S "
                f"({self.max_turn_s}): a worker busy with its longest turns would look wedged"
            )
        if self.redis_timeout_s <= 0.1:  # the loops' blocking reads wait up to 50 ms
            raise ValueError(f"REINS_REDIS_TIMEOUT_S ({self.redis_timeout_s}) must be above 0.1")
        return self

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Build settings from ``REINS_*`` variables; refuse unknown names and bad values."""
        values: dict[str, Any] = {}
        known = set(cls.model_fields)
        for name, raw in env.items():
            if not name.startswith(PREFIX) or name.startswith(TEST_PREFIX):
                continue
            field = name[len(PREFIX) :].lower()
            field = RENAMED.get(field, field)
            if field not in known:
                raise ConfigError(
                    f"{name} is not a reins setting; known: "
                    + ", ".join(sorted(PREFIX + k.upper() for k in known))
                )
            values[field] = raw
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            if not first["loc"]:  # a check across settings: its message names them
                raise ConfigError(str(first["msg"]).removeprefix("Value error, ")) from None
            var = PREFIX + str(first["loc"][0]).upper()
            raise ConfigError(f"{var}: {first['msg']}") from None
