"""Console sessions live in Redis; the browser holds only a random id. The id is never a key
and never works as one on /v1; signing out or revoking the key ends the session at its very
next request; a session lapses when idle and at its lifetime; every sign-in gets a new id."""

from __future__ import annotations

import hashlib

import pytest
import redis
from fastapi.testclient import TestClient

from api.console.session import COOKIE, OLD_COOKIE
from api.keys import KeyRing, Scope
from tests.api.conftest import Keys

pytestmark = pytest.mark.redis


def sign_in(http: TestClient, key: str) -> str:
    """Sign in through the form; the session id the cookie holds."""
    reply = http.post("/ui/signin", data={"key": key, "next": "/ui/"}, follow_redirects=False)
    assert reply.status_code == 303, reply.text
    return str(http.cookies[COOKIE])


def signed_in(http: TestClient, session_id: str) -> bool:
    """Whether a request bearing only ``session_id`` is signed in (the client's cookies are
    cleared: it is as a new browser holding a copy of the cookie)."""
    http.cookies.clear()
    reply = http.get(
        "/ui/inbox", headers={"Cookie": f"{COOKIE}={session_id}"}, follow_redirects=False
    )
    assert reply.status_code in (200, 303), reply.text
    return reply.status_code == 200


def test_the_cookie_holds_a_random_session_id_never_the_key(
    http: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str
) -> None:
    reply = http.post("/ui/signin", data={"key": keys.acme, "next": "/ui/"}, follow_redirects=False)
    cookie = next(
        c for c in reply.headers.get_list("set-cookie") if c.startswith(f"{COOKIE}=")
    ).lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    assert "max-age=28800" in cookie, "the browser drops it at the session's lifetime"
    assert "secure" not in cookie.split(";")[1:], "plain http here: no public https URL"
    session_id = str(http.cookies[COOKIE])
    assert len(session_id) >= 43 and not session_id.startswith("rk_")
    secret = keys.acme.split("_", 2)[2]
    assert secret not in session_id and session_id not in keys.acme
    stored = [k for k in redis_client.scan_iter(f"{key_prefix}:console:session:*")]
    (only,) = stored
    assert only.decode().endswith(hashlib.sha256(session_id.encode()).hexdigest())
    held = b"".join(redis_client.hvals(only))
    assert session_id.encode() not in held and secret.encode() not in held
    assert redis_client.ttl(only) == 1800, "the server forgets it after the idle timeout"


def test_a_session_cookie_is_not_an_api_key_on_v1(http: TestClient, keys: Keys) -> None:
    session_id = sign_in(http, keys.acme)
    http.cookies.clear()
    for headers in (
        {"Authorization": f"Bearer {session_id}"},
        {"Cookie": f"{COOKIE}={session_id}"},
        {"Cookie": f"{OLD_COOKIE}={keys.acme}"},
    ):
        for path in ("/v1/trajectories", "/v1/approvals", "/v1/usage"):
            reply = http.get(path, headers=headers)
            assert reply.status_code == 401, (headers, path, reply.text)
    assert signed_in(http, session_id), "the session itself still works on the console"


def test_the_raw_key_cookie_of_old_consoles_signs_nobody_in(http: TestClient, keys: Keys) -> None:
    http.cookies.set(OLD_COOKIE, keys.acme, path="/ui")
    away = http.get("/ui/inbox", follow_redirects=False)
    assert away.status_code == 303 and away.headers["location"].startswith("/ui/signin")
    sign_in(http, keys.acme)
    cleared = http.post("/ui/signout", follow_redirects=False).headers.get_list("set-cookie")
    assert any(c.startswith(f'{OLD_COOKIE}=""') for c in cleared), cleared


def test_signing_out_ends_the_session_even_for_a_copy_of_its_cookie(
    http: TestClient, keys: Keys
) -> None:
    session_id = sign_in(http, keys.acme)
    assert signed_in(http, session_id)
    out = http.post(
        "/ui/signout", headers={"Cookie": f"{COOKIE}={session_id}"}, follow_redirects=False
    )
    assert out.status_code == 303
    assert not signed_in(http, session_id), "a copy of the cookie outlived the sign-out"


def test_a_revoked_keys_session_is_refused_on_its_next_request(
    http: TestClient, redis_client: redis.Redis, key_prefix: str
) -> None:
    """The API remembers a key's answer for REINS_API_KEY_CACHE_S (5 s); a session does not:
    its next request after the revocation is refused."""
    key, grant = KeyRing(redis_client, key_prefix).create("acme", "reviewer", {Scope.READ})
    session_id = sign_in(http, key)  # the API's key ring now remembers this key as good
    assert signed_in(http, session_id)
    assert KeyRing(redis_client, key_prefix).revoke(grant.key_id)  # as `reins keys revoke`
    assert not signed_in(http, session_id), "the session outlived its key"
    assert http.app.state.front.keys.verify(key) is not None, "the key cache still says yes"  # type: ignore[attr-defined]
    assert not [k for k in redis_client.scan_iter(f"{key_prefix}:console:session:*")]


def test_a_session_lapses_when_idle_and_at_its_lifetime(http: TestClient, keys: Keys) -> None:
    sessions = http.app.state.front.sessions  # type: ignore[attr-defined]
    now = [1_000_000.0]
    sessions.clock = lambda: now[0]
    idle, lifetime = sessions.idle_s, sessions.lifetime_s

    session_id = sign_in(http, keys.acme)
    now[0] += idle - 1
    assert signed_in(http, session_id), "used within the idle timeout"
    now[0] += idle
    assert not signed_in(http, session_id), "unused for the idle timeout"

    session_id = sign_in(http, keys.acme)
    opened = now[0]
    while now[0] + idle / 2 < opened + lifetime:  # used often enough never to idle out
        now[0] += idle / 2
        assert signed_in(http, session_id)
    now[0] = opened + lifetime
    assert not signed_in(http, session_id), "past its lifetime"


def test_every_sign_in_gets_a_new_session_and_ends_the_one_before(
    http: TestClient, keys: Keys
) -> None:
    first = sign_in(http, keys.acme)
    second = sign_in(http, keys.globex)  # the same browser: its cookie named the first
    assert first != second
    assert not signed_in(http, first), "a session id from before the sign-in still works"
    assert signed_in(http, second)
