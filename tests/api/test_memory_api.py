"""Memory through the API: a tenant lists, recalls, reads and deletes only its own facts and
episodes; another tenant's ids are exactly as absent as ids that exist nowhere."""

from __future__ import annotations

import json
import time

import pytest
import redis
from fastapi.testclient import TestClient

from kernel.memory import MemoryItem, MemoryKind, Provenance, Scope, Source, Trust, ms
from store.memory_redis import RedisMemory
from tests.api.conftest import Keys, without_error_id

pytestmark = pytest.mark.redis


def _item(  # type: ignore[no-untyped-def]
    tenant: str,
    key: str,
    kind: MemoryKind = MemoryKind.FACT,
    user: str = "cu_1",
    scope: Scope = Scope.USER,
    trajectory: str | None = None,
    calls: tuple[str, ...] = (),
):
    return MemoryItem(
        kind=kind,
        tenant=tenant,
        scope=scope,
        subject=user if scope is Scope.USER else "",
        key=key,
        value={"text": f"{tenant} {key}"},
        tags=["delivery", "preference", key],
        written_ms=ms(time.time()),
        concerns=[user],
        trajectory_id=trajectory,
        provenance=Provenance(source=Source.TOOL_RESULT, trust=Trust.UNTRUSTED, call_ids=calls)
        if calls
        else None,
    )


@pytest.fixture
def memory(redis_client: redis.Redis, key_prefix: str) -> RedisMemory:
    return RedisMemory(redis_client, prefix=key_prefix)


def test_another_tenant_never_sees_ranks_or_deletes_a_tenants_memory(
    http: TestClient, keys: Keys, memory: RedisMemory
) -> None:
    fact = _item("acme", "contact")
    episode = _item("acme", "ep1", MemoryKind.EPISODE)
    memory.put(fact)
    memory.put(episode)
    memory.put(_item("globex", "own"))
    globex, acme = keys.auth(keys.globex), keys.auth(keys.acme)
    nowhere = "0123456789abcdef"
    for item in (fact, episode):
        for method in ("GET", "DELETE"):
            seen = http.request(method, f"/v1/memory/items/{item.item_id}", headers=globex)
            missing = http.request(method, f"/v1/memory/items/{nowhere}", headers=globex)
            assert seen.status_code == 404, (method, seen.text)
            assert without_error_id(seen.content) == without_error_id(missing.content)
    listed = http.get("/v1/memory", headers=globex).json()["items"]
    assert [i["key"] for i in listed] == ["own"]
    # the same user and agent names, and acme's tags: globex's recall still holds only globex's
    probe = {"user": "cu_1", "agent": "support", "tags": ["contact", "ep1", "delivery"]}
    for kind in ("fact", "episode"):
        found = http.get("/v1/memory/recall", params={**probe, "kind": kind}, headers=globex)
        assert found.status_code == 200, found.text
        assert all(i["key"] == "own" for i in found.json()["items"])
    erased = http.delete("/v1/memory/users/cu_1", headers=globex).json()
    assert (erased["deleted"], [i["key"] for i in erased["items"]]) == (1, ["own"])  # not acme's
    # an export of acme's user with globex's key: globex's own (now none), never acme's
    exported = http.get("/v1/memory/users/cu_1/export", headers=globex).json()
    assert exported == {"user": "cu_1", "facts": [], "episodes": [], "trajectories": []}
    # acme's memory is as it was, and acme sees, ranks and deletes it
    assert memory.get("acme", fact.item_id) == fact
    ranked = http.get("/v1/memory/recall", params=probe, headers=acme).json()["items"]
    assert [i["item_id"] for i in ranked] == [fact.item_id]
    shown = http.get(f"/v1/memory/items/{episode.item_id}", headers=acme)
    assert shown.status_code == 200 and shown.json()["kind"] == "episode"
    gone = http.delete(f"/v1/memory/items/{fact.item_id}", headers=acme)
    assert gone.status_code == 204 and memory.get("acme", fact.item_id) is None


def test_erasure_deletes_every_item_that_concerns_the_user_and_says_which(
    http: TestClient, keys: Keys, memory: RedisMemory
) -> None:
    memory.put(_item("acme", "a", user="cu_1", trajectory="t-1"))
    memory.put(_item("acme", "b", MemoryKind.EPISODE, user="cu_1", trajectory="t-2"))
    memory.put(_item("acme", "d", user="cu_1", scope=Scope.TENANT, trajectory="t-1"))
    memory.put(_item("acme", "c", user="cu_2"))
    acme = keys.auth(keys.acme)
    exported = http.get("/v1/memory/users/cu_1/export", headers=acme).json()
    assert sorted(i["key"] for i in exported["facts"]) == ["a", "d"]
    assert [i["key"] for i in exported["episodes"]] == ["b"]
    assert exported["trajectories"] == ["t-1", "t-2"]
    listed = http.get("/v1/memory", params={"user": "cu_1"}, headers=acme).json()["items"]
    assert sorted(i["key"] for i in listed) == ["a", "b", "d"]
    reply = http.delete("/v1/memory/users/cu_1", headers=acme).json()
    assert reply["deleted"] == 3
    assert sorted(i["key"] for i in reply["items"]) == ["a", "b", "d"]
    left = http.get("/v1/memory", headers=acme).json()["items"]
    assert [i["key"] for i in left] == ["c"]
    nobody = http.get("/v1/memory/users/cu_nobody/export", headers=acme).json()
    assert nobody == {"user": "cu_nobody", "facts": [], "episodes": [], "trajectories": []}
    assert http.delete("/v1/memory/users/cu_nobody", headers=acme).json()["deleted"] == 0


def test_removal_by_source_deletes_what_one_call_shaped_in_the_callers_tenant_only(
    http: TestClient, keys: Keys, memory: RedisMemory
) -> None:
    memory.put(_item("acme", "poison", scope=Scope.TENANT, calls=("t-1/c2",)))
    memory.put(_item("acme", "kept", calls=("t-1/c3",)))
    memory.put(_item("globex", "theirs", calls=("t-1/c2",)))
    reader = keys.auth(keys.acme_read_only)
    refused = http.delete("/v1/memory/sources/t-1/c2", headers=reader)
    assert refused.status_code == 403
    other = http.delete("/v1/memory/sources/t-9/c1", headers=keys.auth(keys.acme)).json()
    assert other == {"call_id": "t-9/c1", "deleted": 0, "items": []}
    gone = http.delete("/v1/memory/sources/t-1/c2", headers=keys.auth(keys.acme))
    assert gone.status_code == 200, gone.text
    assert [i["key"] for i in gone.json()["items"]] == ["poison"]
    left = http.get("/v1/memory", headers=keys.auth(keys.acme)).json()["items"]
    assert [i["key"] for i in left] == ["kept"]
    assert [i.key for i in memory.items("globex")] == ["theirs"]


def test_bad_or_unscoped_requests_are_refused_and_change_nothing(
    http: TestClient, keys: Keys, memory: RedisMemory
) -> None:
    fact = _item("acme", "contact")
    memory.put(fact)
    reader = keys.auth(keys.acme_read_only)
    refused = http.delete(f"/v1/memory/items/{fact.item_id}", headers=reader)
    assert refused.status_code == 403
    no_tags = http.get(
        "/v1/memory/recall", params={"user": "cu_1", "agent": "a"}, headers=keys.auth(keys.acme)
    )
    assert no_tags.status_code == 422 and no_tags.json()["field"] == "tags"
    bad_tag = http.get(
        "/v1/memory/recall",
        params={"user": "cu_1", "agent": "a", "tags": ["x" * 65]},
        headers=keys.auth(keys.acme),
    )
    assert bad_tag.status_code == 422 and "tags" in bad_tag.json()["detail"]
    assert memory.get("acme", fact.item_id) == fact


def test_the_cli_lists_and_deletes_memory_through_the_api_process(
    api_url: str, keys: Keys, memory: RedisMemory
) -> None:
    from tests.api.test_cli_client import reins

    fact = _item("acme", "contact")
    memory.put(fact)
    memory.put(_item("acme", "other", user="cu_2"))
    listed = json.loads(reins(api_url, keys.acme, "memory", "ls", "--json").stdout)
    assert sorted(i["key"] for i in listed["items"]) == ["contact", "other"]
    assert json.loads(reins(api_url, keys.globex, "memory", "ls", "--json").stdout) == {"items": []}
    theirs = reins(api_url, keys.globex, "memory", "rm", fact.item_id)
    assert theirs.returncode == 2 and "404" in theirs.stderr
    both = reins(api_url, keys.acme, "memory", "rm", fact.item_id, "--user", "cu_1")
    assert both.returncode == 2 and "not both" in both.stderr
    exported = json.loads(reins(api_url, keys.acme, "memory", "export", "--user", "cu_1").stdout)
    assert [i["key"] for i in exported["facts"]] == ["contact"]
    done = reins(api_url, keys.acme, "memory", "rm", fact.item_id)
    assert done.returncode == 0, done.stderr
    erased = json.loads(
        reins(api_url, keys.acme, "memory", "rm", "--user", "cu_2", "--json").stdout
    )
    assert (erased["user"], erased["deleted"]) == ("cu_2", 1)
    assert memory.items("acme") == []
