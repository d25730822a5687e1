"""The console behind a TLS-terminating proxy: its forms must come from the public URL's
origin, its cookie is Secure whenever that URL is https, and forwarded headers are believed
only from the configured proxies (REINS_TRUSTED_PROXIES), never from anyone else."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from api.console.session import COOKIE
from api.front import Front
from kernel.settings import Settings
from tests.api.conftest import Keys

pytestmark = pytest.mark.redis
PUBLIC = "https://reins.example.com"
PROXY = ("10.1.2.3", 40000)  # in REINS_TRUSTED_PROXIES below
STRANGER = ("203.0.113.9", 40000)  # not


@contextmanager
def console(
    api_env: dict[str, str],
    redis_client: redis.Redis,
    peer: tuple[str, int],
    **settings: str,
) -> Iterator[TestClient]:
    """The API in process with more ``settings``, reached from the address ``peer``."""
    env = {**api_env, **{f"REINS_{k.upper()}": v for k, v in settings.items()}}
    config = Settings.from_env(env)
    app = create_app(config, Front.wire(config, client=redis_client))
    with TestClient(app, client=peer, raise_server_exceptions=False) as http:
        yield http


def signin(http: TestClient, key: str, **headers: str) -> tuple[int, str]:
    """Post the sign-in form with ``headers``: its status and the session cookie set ("")."""
    reply = http.post(
        "/ui/signin",
        data={"key": key, "next": "/ui/"},
        headers={k.replace("_", "-"): v for k, v in headers.items()},
        follow_redirects=False,
    )
    cookies = [c for c in reply.headers.get_list("set-cookie") if c.startswith(f"{COOKIE}=")]
    return reply.status_code, (cookies[0].lower() if cookies else "")


def secure(cookie: str) -> bool:
    return "secure" in [a.strip() for a in cookie.split(";")[1:]]


def test_forms_must_come_from_the_public_url_and_its_cookie_is_secure(
    api_env: dict[str, str], redis_client: redis.Redis, applied: int, keys: Keys
) -> None:
    # the proxy speaks plain http to the API: the request names http://testserver
    with console(api_env, redis_client, PROXY, public_url=PUBLIC + ":443/") as http:
        status, cookie = signin(http, keys.acme, Origin=PUBLIC)
        assert status == 303 and secure(cookie), cookie
        status, cookie = signin(http, keys.acme, Referer=f"{PUBLIC}/ui/signin")
        assert status == 303 and secure(cookie)
        for foreign in ("http://testserver", "http://reins.example.com", "https://evil.example"):
            assert signin(http, keys.acme, Origin=foreign) == (403, ""), foreign
            assert signin(http, keys.acme, Referer=f"{foreign}/ui/") == (403, ""), foreign


def test_forwarded_headers_count_from_a_trusted_proxy_only(
    api_env: dict[str, str],
    redis_client: redis.Redis,
    applied: int,
    keys: Keys,
    caplog: pytest.LogCaptureFixture,
) -> None:
    https = {"X_Forwarded_Proto": "https", "X_Forwarded_For": "198.51.100.7"}
    trusted = {"trusted_proxies": "10.0.0.0/8, ::1"}
    with console(api_env, redis_client, PROXY, **trusted) as http:
        status, cookie = signin(http, keys.acme, Origin="https://testserver", **https)
        assert status == 303 and secure(cookie), "the proxy said https"
        with caplog.at_level(logging.INFO, logger="reins.api"):
            http.get("/v1/usage", headers={"X-Forwarded-For": "198.51.100.7"})
        assert "from 198.51.100.7 refused 401" in caplog.text, "the proxy's client"

    caplog.clear()
    with console(api_env, redis_client, STRANGER, **trusted) as http:
        # a stranger's X-Forwarded-Proto is ignored: the request is http, and so is its origin
        assert signin(http, keys.acme, Origin="https://testserver", **https) == (403, "")
        status, cookie = signin(http, keys.acme, Origin="http://testserver", **https)
        assert status == 303 and not secure(cookie)
        with caplog.at_level(logging.INFO, logger="reins.api"):
            http.get("/v1/usage", headers={"X-Forwarded-For": "198.51.100.7"})
        assert "198.51.100.7" not in caplog.text and "from 203.0.113.9 refused 401" in caplog.text

    with console(api_env, redis_client, PROXY) as http:  # no proxy trusted: not even loopback's
        assert signin(http, keys.acme, Origin="https://testserver", **https) == (403, "")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REINS_PUBLIC_URL", "https://reins.example.com/ui"),
        ("REINS_PUBLIC_URL", "reins.example.com"),
        ("REINS_TRUSTED_PROXIES", "*"),
        ("REINS_TRUSTED_PROXIES", "10.0.0.0/8, proxy.local"),
        ("REINS_CONSOLE_IDLE_S", "99999"),
    ],
)
def test_a_bad_front_door_setting_is_refused_naming_it(name: str, value: str) -> None:
    from kernel.errors import ConfigError

    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: value})
