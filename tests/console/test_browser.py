"""The console in a real browser against a real fleet (API, router and worker processes): a
reviewer signs in, sees a held refund appear, approves it, watches the run finish live, and the
refund happens once; another tenant's key sees nothing of it. Screenshots go to docs/img/ with
REINS_TEST_SCREENSHOTS=1."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import httpx
import pytest
import redis
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys as Key

from api.client import ReinsClient
from examples.support_store.state import RedisState
from ops.local.fleet import LocalFleet
from store.redis_store import RedisStore
from tests.api.conftest import Keys
from tests.api.held import refund_body
from tests.api.processes import start_fleet
from tests.console.browser import audit, chromium, layout_shift
from tests.fleet.harness import seed_orders
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.browser]
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "img"


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """Where the screenshots go: docs/img/ when REINS_TEST_SCREENSHOTS=1 (how the README's
    pictures are made), else the test's own folder, so a test run leaves the tree as it was."""
    if os.environ.get("REINS_TEST_SCREENSHOTS") == "1":
        return IMAGES
    return tmp_path


def sign_in(driver: webdriver.Chrome, url: str, key: str) -> None:
    """Sign in through the form, with the keyboard."""
    driver.get(f"{url}/ui/signin")
    field = driver.find_element(By.ID, "key")
    field.send_keys(key)
    field.send_keys(Key.ENTER)
    wait_for(lambda: "/ui/signin" not in driver.current_url, 20, "the sign-in")


def sign_out(driver: webdriver.Chrome) -> None:
    driver.find_element(By.CSS_SELECTOR, "form.who button").click()
    wait_for(lambda: "/ui/signin" in driver.current_url, 20, "the sign-out")


def picture(driver: webdriver.Chrome, folder: Path, name: str, height: int = 1150) -> None:
    """Save a screenshot of the page to ``folder``, tall enough to show it whole, then give the
    window back its laptop size."""
    driver.set_window_size(1366, height)
    assert driver.save_screenshot(str(folder / name)), name
    driver.set_window_size(1366, 900)


def held_keys(driver: webdriver.Chrome) -> list[str]:
    cards = driver.find_elements(By.CSS_SELECTOR, "#inbox li[data-key]")
    return [c.get_attribute("data-key") or "" for c in cards]


def console_as(url: str, key: str) -> httpx.Client:
    """An HTTP client signed in to the console (its cookie), to read statuses and bodies."""
    client = httpx.Client(base_url=url, timeout=10.0, follow_redirects=True)
    reply = client.post("/ui/signin", data={"key": key, "next": "/ui/"})
    if reply.status_code != 200 or "/ui/inbox" not in str(reply.url):
        client.close()
        pytest.fail(f"the sign-in failed: {reply.status_code} {reply.text[:300]}")
    return client


def assert_sees_nothing_of(url: str, key: str, tid: str, approval: str, digest: str) -> None:
    """The other tenant: no trace in the lists; its direct URLs are the 404 of a made-up id."""
    nowhere = f"traj-{uuid.uuid4().hex[:16]}"
    other = console_as(url, key)
    try:
        for path in ("/ui/inbox", "/ui/inbox/items", "/ui/trajectories"):
            reply = other.get(path)
            assert reply.status_code == 200 and tid not in reply.text, path
        for suffix in ("", "/live", "/events"):
            theirs = other.get(f"/ui/trajectories/{tid}{suffix}")
            absent = other.get(f"/ui/trajectories/{nowhere}{suffix}")
            assert theirs.status_code == absent.status_code == 404, (suffix, theirs.text[:200])
            assert theirs.text == absent.text, suffix
        decision = {"decision": "approve", "version": "1", "digest": digest, "comment": "x"}
        for control in ("pause", "cancel", "kill"):
            assert other.post(f"/ui/trajectories/{tid}/control/{control}").status_code == 404
        refused = other.post(f"/ui/trajectories/{tid}/approvals/{approval}", data=decision)
        assert refused.status_code == 404, refused.text[:200]
    finally:
        other.close()


def test_a_reviewer_approves_a_held_refund_in_the_browser_and_watches_it_finish(
    fleet: LocalFleet, keys: Keys, redis_client: redis.Redis, key_prefix: str, images: Path
) -> None:
    url = start_fleet(fleet)
    store = RedisStore(redis_client, prefix=key_prefix)
    backend = RedisState(redis_client, key_prefix, seed=False)
    oid = seed_orders(redis_client, key_prefix, 8300, 1, total=12_000)[0]
    IMAGES.mkdir(parents=True, exist_ok=True)
    with chromium() as driver:
        sign_in(driver, url, keys.acme)
        assert driver.current_url.endswith("/ui/inbox")
        assert held_keys(driver) == []
        assert driver.find_element(By.CSS_SELECTOR, "#inbox .empty").is_displayed()
        driver.execute_script("window.reinsSamePage = true")

        with ReinsClient(url, keys.acme) as client:
            tid = client.submit(refund_body(oid))["trajectory_id"]
        wait_for(lambda: len(held_keys(driver)) == 1, 60, "the held refund in the inbox")
        assert driver.execute_script("return window.reinsSamePage === true"), "page reloaded"
        assert layout_shift(driver) == 0.0, "the new hold moved what was on the page"
        rec = store.load("acme", tid)
        assert rec.held is not None
        card = driver.find_element(By.CSS_SELECTOR, "#inbox li[data-key]")
        assert card.get_attribute("data-key") == f"{tid}/{rec.held.approval_id}"
        text = card.text
        assert "issue_refund" in text and "9000" in text and rec.held.digest in text
        assert f"{oid}.refunded_cents" in text  # what the refund changes on the order
        assert "left" in card.find_element(By.CSS_SELECTOR, ".countdown").text
        assert backend.effects() == [], "a held refund was applied"

        assert_sees_nothing_of(url, keys.globex, tid, rec.held.approval_id, rec.held.digest)
        assert store.load("acme", tid).record_version == rec.record_version

        driver.refresh()  # the page as a reviewer opens it, for its picture and its audit
        wait_for(lambda: len(held_keys(driver)) == 1, 20, "the inbox")
        assert audit(driver) == []
        picture(driver, images, "console-inbox.png")

        comment = driver.find_element(By.ID, "comment-1")
        comment.send_keys("checked the photo of the damage")
        comment.send_keys(Key.TAB)  # the keyboard reaches Approve next
        approve = driver.switch_to.active_element
        assert approve.text == "Approve"
        approve.send_keys(Key.ENTER)

        wait_for(lambda: f"/ui/trajectories/{tid}" in driver.current_url, 30, "the detail page")
        driver.execute_script("window.reinsSamePage = true")

        def finished() -> bool:  # read in one script: the live refresh replaces these nodes
            state, stops = driver.execute_script(
                "return [document.getElementById('state').textContent,"
                " document.querySelectorAll('#steps li.step-stop').length]"
            )
            return bool(state == "COMPLETED" and stops == 1)

        wait_for(finished, 60, "the run to finish on the page")
        same_page, received, stop, shown_closing, timeline = driver.execute_script(
            "const text = (id) => document.getElementById(id).innerText;"
            "return [window.reinsSamePage === true, document.getElementById('live').dataset"
            ".received, text('stop-reason'), text('closing'), text('steps')]"
        )
        assert same_page, "the page was reloaded: it did not follow the run live"
        assert int(received) > 0, "no event came by the stream"
        assert stop == "done"
        closing = store.load("acme", tid).closing_message
        assert closing and shown_closing == closing
        assert "checked the photo of the damage" in timeline and "approved" in timeline
        assert layout_shift(driver) == 0.0, "live updates moved the page"
        assert audit(driver) == []
        picture(driver, images, "console-trajectory.png")

        refunds = [e for e in backend.effects() if e[0] == "refund"]
        assert len(refunds) == 1, refunds

        with ReinsClient(url, keys.globex) as client:  # the other tenant's traffic, for fairness
            small = seed_orders(redis_client, key_prefix, 8400, 1, total=12_000)[0]
            theirs = client.submit(refund_body(small, cents=1000))["trajectory_id"]
            wait_for(lambda: client.show(theirs)["state"] == "COMPLETED", 60, "globex's run")

        sign_out(driver)
        sign_in(driver, url, keys.operator)
        assert driver.current_url.endswith("/ui/fairness")
        rows = driver.find_elements(By.CSS_SELECTOR, "table.fairness tbody th")
        assert [r.text for r in rows] == ["acme", "globex"]
        assert "w1" in driver.page_source and "w2" in driver.page_source
        assert audit(driver) == []
        picture(driver, images, "console-fairness.png", height=800)

        sign_out(driver)
        sign_in(driver, url, keys.globex)
        assert held_keys(driver) == []
        driver.get(f"{url}/ui/trajectories")
        assert theirs in driver.page_source and tid not in driver.page_source
        driver.get(f"{url}/ui/trajectories/{tid}")
        assert driver.find_element(By.TAG_NAME, "h1").text == "Not found"
        assert oid not in driver.page_source
