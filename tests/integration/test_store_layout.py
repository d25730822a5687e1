"""A store written in key layout 1 (one ``{P:T}:index`` per tenant, two slots per commit) is
refused until ``reins store migrate`` moves it, in place or from another Redis to a cluster."""

from __future__ import annotations

import json

import pytest
import redis
import typer
from typer.testing import CliRunner

from kernel.errors import UnsupportedLayout
from kernel.states import LifecycleState
from ops.cli import store as cli_store
from store.base import prepare_commit
from store.redis_client import client_from_url
from store.redis_keys import COMMITS_KEPT, layout_key
from store.redis_layout import migrate
from store.redis_store import RedisStore
from tests.conftest import REDIS_URL
from tests.contract.advance_worker import make_record, next_version, row_for

pytestmark = pytest.mark.redis
KINDS = ("snap", "chain")


def write_layout_1(client: redis.Redis, prefix: str) -> None:
    """Tenant acme: t1 READY at version 12 with two chain rows and a commit id per version;
    t:2 CANCELED and owing; an idempotency result. Keys exactly as layout 1 wrote them."""
    t1 = next_version(make_record("t1"), LifecycleState.READY, step=11)
    commit_ids = {f"c{v}": f"cid-{v}" for v in range(1, 13)}
    client.hset(f"{{{prefix}:acme:t1}}:snap", mapping={"v": 12, "s": 1, "data": t1.to_json()})
    client.hset(f"{{{prefix}:acme:t1}}:snap", mapping=commit_ids)  # type: ignore[arg-type]
    client.rpush(
        f"{{{prefix}:acme:t1}}:chain",
        *prepare_commit(t1, 11, [row_for(t1, 0), row_for(t1, 1)]).rows,
    )
    t2 = next_version(make_record("t:2"), LifecycleState.CANCELED)
    client.hset(f"{{{prefix}:acme:t%3A2}}:snap", mapping={"v": 2, "s": 9, "data": t2.to_json()})
    client.zadd(f"{{{prefix}:acme}}:index", {f"{{{prefix}:acme:t1}}:snap": 1})
    client.zadd(f"{{{prefix}:acme}}:index", {f"{{{prefix}:acme:t%3A2}}:snap": 9})
    client.zadd(f"{{{prefix}:acme}}:owing", {"t:2": 0})
    client.set(f"{{{prefix}:acme:k1}}:idem", json.dumps({"refund_id": "rf_1"}))


def check_migrated(store: RedisStore) -> None:
    assert store.load("acme", "t1").record_version == 12
    assert [row.index for row in store.read("acme", "t1")] == [0, 1]
    assert store.list("acme") == ["t1", "t:2"]
    assert store.list("acme", LifecycleState.CANCELED) == ["t:2"]
    assert store.owing("acme") == ["t:2"]
    assert store.lookup("acme", "k1") == {"refund_id": "rf_1"}
    kept = [store.committed("acme", "t1", v) for v in range(1, 13)]
    assert kept == [None] * (12 - COMMITS_KEPT) + [f"cid-{v}" for v in range(13 - COMMITS_KEPT, 13)]


def test_a_store_of_layout_1_is_refused_and_nothing_is_written(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    write_layout_1(redis_client, key_prefix)
    before = sorted(redis_client.scan_iter(match=f"{{{key_prefix}*"))
    store = RedisStore(client_from_url(REDIS_URL), prefix=key_prefix)
    for attempt in (
        lambda: store.load("acme", "t1"),
        lambda: store.list("acme"),
        lambda: store.create(make_record("t3")),
    ):
        with pytest.raises(UnsupportedLayout, match=r"layout 1 .*run 'reins store migrate'"):
            attempt()
    assert sorted(redis_client.scan_iter(match=f"{{{key_prefix}*")) == before
    store.close()


def test_reins_store_migrate_moves_it_in_place(
    redis_client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_layout_1(redis_client, key_prefix)
    monkeypatch.setenv("REINS_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("REINS_KEY_PREFIX", key_prefix)
    app = typer.Typer()
    app.callback()(lambda: None)
    app.add_typer(cli_store.store_app, name="store")
    result = CliRunner().invoke(app, ["store", "migrate", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["trajectories"] == 2 and figures["chains"] == 1 and figures["owing"] == 1
    assert figures["deleted"] == 5 and figures["commit_ids_trimmed"] == 12 - COMMITS_KEPT
    old = [f"{{{key_prefix}:acme}}:{name}" for name in ("index", "owing")]
    old += [f"{{{key_prefix}:acme:{tid}}}:{kind}" for tid in ("t1", "t%3A2") for kind in KINDS]
    assert redis_client.exists(*old) == 0
    assert redis_client.get(layout_key(key_prefix)) == b"2"
    store = RedisStore(client_from_url(REDIS_URL), prefix=key_prefix)
    check_migrated(store)
    t1 = store.load("acme", "t1")  # and it goes on from there
    store.compare_and_set(next_version(t1, LifecycleState.CALLING_MODEL), 12)
    assert store.list("acme", LifecycleState.CALLING_MODEL) == ["t1"]
    store.close()
    again = CliRunner().invoke(app, ["store", "migrate", "--json"])  # nothing left to move
    assert again.exit_code == 0 and json.loads(again.output)["trajectories"] == 0


def test_migrate_copies_a_single_redis_into_a_cluster(
    redis_client: redis.Redis,
    key_prefix: str,
    redis_cluster: redis.Redis,
) -> None:
    write_layout_1(redis_client, key_prefix)
    done = migrate(redis_client, redis_cluster, key_prefix, same=False)
    assert (done.trajectories, done.ledger, done.deleted) == (2, 1, [])
    assert redis_client.exists(f"{{{key_prefix}:acme}}:index"), "the source is left as it was"
    store = RedisStore(redis_cluster, prefix=key_prefix)
    try:
        check_migrated(store)
    finally:
        keys = list(redis_cluster.scan_iter(match=f"{{{key_prefix}*"))
        redis_cluster.delete(*keys)
