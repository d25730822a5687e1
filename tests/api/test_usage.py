"""Usage says which tenants are backlogged and what each is owed (a tenant with nothing
queued is owed no share), and how the admitted shares went over time; a tenant's key sees
only its own figures, and nothing of the other tenants' queues."""

from __future__ import annotations

import re

import pytest
import redis
from fastapi.testclient import TestClient

from router.wire.feed import Feed, admission_entry
from tests.api.conftest import AGENT, Keys

pytestmark = pytest.mark.redis


def admitted(tenant: str, charge: int, at: float, everyone_queued: bool) -> dict[str, object]:
    return admission_entry(tenant, "default", charge, by="r1", at=at, backlogged=everyone_queued)


@pytest.fixture
def acme_queued(http: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str) -> None:
    """acme (weight 3) has one run queued, globex (weight 1) none; past admissions: both
    while both were queued, then nothing, then acme alone."""
    job = {"agent": AGENT, "goal": "refund ord_1", "user": "cu_ana"}
    assert http.post("/v1/trajectories", json=job, headers=keys.auth(keys.acme)).status_code == 201
    Feed(redis_client, key_prefix).record_admissions(
        [
            admitted("acme", 3000, 1000.0, True),
            admitted("globex", 1000, 1001.0, True),
            admitted("acme", 2000, 1029.0, False),
            admitted("acme", 2000, 1030.0, False),
        ]
    )


def test_only_a_backlogged_tenant_is_owed_a_share(
    http: TestClient, keys: Keys, acme_queued: None
) -> None:
    every = {u["tenant"]: u for u in http.get("/v1/usage", headers=keys.auth(keys.operator)).json()}
    acme, globex = every["acme"], every["globex"]
    assert (acme["backlog"], acme["backlogged"], acme["weight_share"]) == (1, True, 0.75)
    assert acme["owed_share"] == 1.0, "the only backlogged tenant is owed the whole fleet"
    assert (globex["backlogged"], globex["owed_share"]) == (False, None)
    assert acme["admitted_share"] == pytest.approx(7000 / 8000)

    (own,) = http.get("/v1/usage", headers=keys.auth(keys.acme)).json()
    assert own["tenant"] == "acme" and own["backlogged"] is True
    assert own["owed_share"] is None, "owed shares tell of the other tenants' queues"


def test_the_shares_over_time_come_in_equal_spans_with_their_contention(
    http: TestClient, keys: Keys, acme_queued: None
) -> None:
    reply = http.get("/v1/usage/history", params={"buckets": 3}, headers=keys.auth(keys.operator))
    assert reply.status_code == 200, reply.text
    history = reply.json()
    assert history["tenants"] == ["acme", "globex"]
    spans = history["buckets"]
    assert [(b["start"], b["end"]) for b in spans] == [(1000, 1010), (1010, 1020), (1020, 1030)]
    assert [b["admissions"] for b in spans] == [2, 0, 2]
    assert [b["contended"] for b in spans] == [1.0, None, 0.0]
    assert spans[0]["shares"] == {"acme": 0.75, "globex": 0.25}
    assert spans[1]["shares"] == {} and spans[2]["shares"] == {"acme": 1.0, "globex": 0.0}

    mine = http.get("/v1/usage/history", params={"buckets": 3}, headers=keys.auth(keys.acme))
    assert mine.json()["tenants"] == ["acme"]
    assert mine.json()["buckets"][0]["shares"] == {"acme": 0.75}, "its part of every charge"
    for bad in ("0", "61", "x"):
        refused = http.get(
            "/v1/usage/history", params={"buckets": bad}, headers=keys.auth(keys.acme)
        )
        assert refused.status_code == 422 and refused.json()["field"] == "buckets", bad


def test_the_fairness_page_says_who_is_backlogged_and_shows_shares_over_time(
    http: TestClient, keys: Keys, acme_queued: None
) -> None:
    signed = http.post("/ui/signin", data={"key": keys.operator, "next": "/ui/"})
    assert signed.status_code == 200 and str(signed.url).endswith("/ui/fairness")
    page = signed.text
    rows = dict(re.findall(r'<tr data-tenant="(\w+)" data-backlogged="(\w+)">', page))
    assert rows == {"acme": "true", "globex": "false"}
    globex_row = page.split('data-tenant="globex"', 1)[1].split("</tr>", 1)[0]
    assert "nothing queued" in globex_row and "owed none" in globex_row
    assert '<td class="num gap">—</td>' in globex_row, "no gap for a tenant owed nothing"
    acme_row = page.split('data-tenant="acme"', 1)[1].split("</tr>", 1)[0]
    assert "backlogged" in acme_row and "100.0% owed" in acme_row

    chart = page.split('id="over-time"', 1)[1]
    assert chart.count('class="tenant-line"') == 2
    # 12 spans over 30 s: admissions in the first and the last; each line breaks between
    assert chart.count("<polyline") == 4, "a line drawn across spans that admitted nothing"
    spans = re.findall(r"<tr><th scope=\"row\">(\d\d:\d\d:\d\d)–(\d\d:\d\d:\d\d)</th>", chart)
    assert len(spans) == 12
