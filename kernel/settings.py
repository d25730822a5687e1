"""Settings: one typed object, read from an environment mapping the caller passes in.

The kernel does no I/O, so it never reads ``os.environ`` itself: the boot step of a process
calls ``Settings.from_env(os.environ)``. Every ``REINS_*`` variable must be known; an unknown
one or an unparsable value fails loudly, naming the variable.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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
    look_up_before_write: bool = Field(
        True,
        description="a worker looks up the key of a write whose tool resolves unknown outcomes "
        "by lookup before sending it, so a registration the store lost (Redis's everysec) "
        "never sends the write twice",
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
    memory_retention_days: float = Field(
        365.0,
        gt=0,
        description="a memory item (fact or episode) is deleted this long after it was written, "
        "whatever its own expiry; a tenant's retention_days in the fleet's [memory] section "
        "overrides it",
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
    tenants_file: str = Field(
        "", description="a fleet document (.toml or .json) applied at boot, as reins config apply"
    )
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
    # --- memory ranking by embeddings (worker/providers/embeddings.py): optional ---
    embeddings_url: str = Field(
        "",
        description="base URL of an OpenAI-compatible /embeddings endpoint (e.g. "
        "https://api.openai.com/v1): facts store their embedding and recall_facts ranks by it "
        "beside the text index; unset: the text index alone",
    )
    embeddings_model: str = Field(
        "text-embedding-3-small", min_length=1, description="the model the endpoint is asked for"
    )
    embeddings_timeout_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="the longest one embeddings call may take; past it (or on any error) a "
        "recall falls back to the text index and a fact is stored without its embedding",
    )
    embeddings_api_key_env: str = Field(
        "", description="the environment variable holding the endpoint's key; unset: no key"
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
    # --- the API's front door (api/) ---
    api_key_cache_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="how long an API process trusts a key's last answer: a revoked key stops "
        "working on /v1, and its open event streams end, within this",
    )
    public_url: str = Field(
        "",
        description="the URL people open the API and console at, scheme://host[:port] (behind "
        "a TLS-terminating proxy: https://...); the console's forms must come from its origin, "
        "and its cookie is Secure when it is https; unset: the address each request names",
    )
    trusted_proxies: str = Field(
        "",
        description="comma-separated addresses or networks (CIDR) of the proxies whose "
        "X-Forwarded-For and X-Forwarded-Proto the API believes; unset: nobody's",
    )
    console_session_s: float = Field(
        28_800.0, gt=0, description="the longest a console session lasts from its sign-in"
    )
    console_idle_s: float = Field(
        1800.0, gt=0, description="a console session unused this long ends"
    )

    @field_validator("embeddings_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        """An embeddings endpoint is an http(s) URL with a host (its path kept)."""
        parts = urlsplit(value)
        if value and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise ValueError("must be an http(s) URL with a host, e.g. https://host/v1")
        return value

    @field_validator("public_url")
    @classmethod
    def _origin_only(cls, value: str) -> str:
        """A public URL names an origin: http(s), a host, maybe a port, no path or query.
        It is kept as a browser writes an ``Origin`` header: lower case, no default port."""
        if not value:
            return value
        parts = urlsplit(value)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
            or parts.username is not None
        ):
            raise ValueError("must be http(s)://host[:port], with no path, query or user")
        try:
            port = parts.port
        except ValueError:
            raise ValueError("its port is not a number from 0 to 65535") from None
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        default = {"http": 80, "https": 443}[parts.scheme]
        return f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default) else "")

    @field_validator("trusted_proxies")
    @classmethod
    def _addresses(cls, value: str) -> str:
        """Each item an IP address or network; ``*`` is refused (name 0.0.0.0/0 to mean it)."""
        for item in (i.strip() for i in value.split(",")):
            if not item:
                continue
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network (CIDR)") from None
        return value

    def proxies(self) -> list[str]:
        """The trusted proxies, one address or network each."""
        return [i.strip() for i in self.trusted_proxies.split(",") if i.strip()]

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
        if self.console_idle_s > self.console_session_s:
            raise ValueError(
                f"REINS_CONSOLE_IDLE_S ({self.console_idle_s}) must not be above "
                f"REINS_CONSOLE_SESSION_S ({self.console_session_s}): no session could idle "
                "that long"
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
