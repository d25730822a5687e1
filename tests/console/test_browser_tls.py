"""The console as it is deployed: behind a TLS-terminating reverse proxy (a small one on
loopback, :mod:`tests.console.tls_proxy`, with a certificate made for the test). A reviewer
signs in, approves a held refund and watches it finish live, pauses another run, all through
the proxy; the session cookie is Secure and holds no key; revoking the key signs the browser
out at its next request.

The API learns that people reach it over https in one of two ways, each run alone: its public
URL (``REINS_PUBLIC_URL``), or the proxy's forwarded headers, believed because the proxy's
address is in ``REINS_TRUSTED_PROXIES``. Before both, every form here was refused: the API
compared the https ``Origin`` with the http address it was reached at."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest
import redis
from selenium.webdriver.common.by import By

from api.client import ReinsClient
from api.console.session import COOKIE, OLD_COOKIE
from api.keys import KeyRing
from examples.support_store.state import RedisState
from kernel.states import LifecycleState
from ops.local.fleet import LocalFleet
from store.redis_store import RedisStore
from tests.api.conftest import Keys
from tests.api.held import refund_body
from tests.api.processes import free_port, start_fleet
from tests.console.browser import audit, chromium
from tests.console.test_browser import held_keys, sign_in
from tests.console.tls_proxy import SOURCE, TlsProxy, self_signed
from tests.fleet.harness import seed_orders
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.browser]


@pytest.mark.parametrize("told_by", ["public-url", "trusted-proxy"])
def test_a_reviewer_approves_and_pauses_through_a_tls_terminating_proxy(
    fleet: LocalFleet,
    keys: Keys,
    redis_client: redis.Redis,
    key_prefix: str,
    tmp_path: Path,
    told_by: str,
) -> None:
    certificate = self_signed(tmp_path)
    public = f"https://127.0.0.1:{free_port()}"
    told = (
        {"REINS_PUBLIC_URL": public}
        if told_by == "public-url"
        else {"REINS_TRUSTED_PROXIES": f"{SOURCE}/32"}
    )
    api = start_fleet(fleet, api_env=told)
    upstream = ("127.0.0.1", int(urlparse(api).port or 0))
    proxy = TlsProxy(int(urlparse(public).port or 0), upstream, certificate).start()
    store = RedisStore(redis_client, prefix=key_prefix)
    backend = RedisState(redis_client, key_prefix, seed=False)
    first, second = seed_orders(redis_client, key_prefix, 8600, 2, total=12_000)
    trusted = f"--ignore-certificate-errors-spki-list={certificate.spki_sha256}"
    try:
        with chromium(extra=(trusted,)) as driver:
            sign_in(driver, public, keys.acme)
            assert driver.current_url == f"{public}/ui/inbox", "signed in through the proxy"
            cookies = {c["name"]: c for c in driver.get_cookies()}
            session = cookies[COOKIE]
            assert session["secure"] is True, "the public URL is https: the cookie is Secure"
            assert session["httpOnly"] is True and session["sameSite"] == "Strict"
            assert keys.acme.split("_", 2)[2] not in session["value"] and OLD_COOKIE not in cookies

            with ReinsClient(api, keys.acme) as client:
                tid = client.submit(refund_body(first))["trajectory_id"]
            wait_for(lambda: len(held_keys(driver)) == 1, 60, "the held refund in the inbox")
            assert backend.effects() == [], "a held refund was applied"
            assert audit(driver) == []
            driver.find_element(By.CSS_SELECTOR, "#inbox li[data-key] button.approve").click()
            wait_for(lambda: f"/ui/trajectories/{tid}" in driver.current_url, 30, "its page")
            assert driver.current_url.startswith(public), "the redirect left the public URL"

            def finished() -> bool:
                state, received = driver.execute_script(
                    "return [document.getElementById('state').textContent,"
                    " document.getElementById('live').dataset.received]"
                )
                return bool(state == "COMPLETED" and int(received or 0) > 0)

            wait_for(finished, 60, "the run to finish on the page, live through the proxy")
            refunds = [e for e in backend.effects() if e[0] == "refund"]
            assert len(refunds) == 1, refunds

            with ReinsClient(api, keys.acme) as client:
                other = client.submit(refund_body(second))["trajectory_id"]
            wait_for(
                lambda: store.load("acme", other).state is LifecycleState.AWAITING_APPROVAL,
                60,
                "the second refund to be held",
            )
            before = store.load("acme", other).record_version
            driver.get(f"{public}/ui/trajectories/{other}")
            driver.find_element(By.CSS_SELECTOR, "button.control-pause").click()

            def paused() -> bool:
                rec = store.load("acme", other)
                return rec.record_version > before and (
                    rec.state is LifecycleState.PAUSED or rec.pending_control is not None
                )

            wait_for(paused, 30, "the pause to be recorded")
            assert driver.current_url == f"{public}/ui/trajectories/{other}"
            assert "by reviewer" in driver.find_element(By.ID, "steps").text

            key_id = keys.acme.split("_", 2)[1]
            assert KeyRing(redis_client, key_prefix).revoke(key_id)
            driver.refresh()  # the next request of the session: refused, back to sign-in
            assert "/ui/signin" in driver.current_url, driver.current_url
        assert proxy.requests > 0
    finally:
        proxy.close()
