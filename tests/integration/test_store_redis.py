"""The Redis store against real servers: lost replies, bounded retries, key layout, durability.

Lost replies are made by a fault-injecting connection class: it drops the connection either
before a command is sent or after its reply arrived (so the script did run), exactly once.
Durability uses a test-owned ``redis-server`` (AOF, ``appendfsync always``) that is SIGKILLed by
its PID and restarted on the same directory.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import NoScriptError, ResponseError
from redis.retry import Retry

from kernel.errors import ConcurrentModification, ReinsError, StoreUnavailable
from kernel.states import LifecycleState
from store.base import prepare_commit
from store.redis_client import client_from_url
from store.redis_direct import DirectBatch, direct_batch, direct_command
from store.redis_keys import COMMITS_KEPT, INDEX_BUCKETS, bucket_of
from store.redis_store import RedisStore
from tests.conftest import REDIS_URL
from tests.contract.advance_worker import make_record, next_version, row_for
from tests.support.redis_server import OwnRedis

pytestmark = pytest.mark.redis


@dataclass
class Fault:
    """One connection drop to inject, and what the connection saw."""

    command: str = "EVALSHA"
    when: str | None = None  # "before_send" or "after_reply"; cleared once it fires
    then: Callable[[], None] | None = None  # runs after the script ran, before the drop
    fired: int = 0
    sent: list[str] = field(default_factory=list)
    connects: int = 0


def faulty_client(fault: Fault, url: str = REDIS_URL) -> redis.Redis:
    """A client whose connections obey ``fault``; redis-py's own retries are off."""

    class FaultyConnection(redis.Connection):
        def connect(self) -> None:
            fault.connects += 1
            super().connect()

        def send_command(self, *args: Any, **kwargs: Any) -> None:
            self._reins_command = str(args[0])
            if fault.when == "before_send" and args[0] == fault.command:
                fault.when, fault.fired = None, fault.fired + 1
                self.disconnect()
                raise redis.ConnectionError("connection dropped before sending (injected)")
            fault.sent.append(str(args[0]))
            super().send_command(*args, **kwargs)

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            response = super().read_response(*args, **kwargs)
            if fault.when == "after_reply" and self._reins_command == fault.command:
                fault.when, fault.fired = None, fault.fired + 1
                if fault.then is not None:
                    fault.then()
                self.disconnect()
                raise redis.ConnectionError("reply lost (injected)")
            return response

    pool = redis.ConnectionPool.from_url(
        url, connection_class=FaultyConnection, retry=Retry(NoBackoff(), 0)
    )
    return redis.Redis(connection_pool=pool)


@pytest.fixture
def fault() -> Fault:
    return Fault()


@pytest.fixture
def stores(key_prefix: str, fault: Fault) -> Iterator[tuple[RedisStore, RedisStore]]:
    """(the store under faults, a plain store on the same keys for the other writer)."""
    faulty = RedisStore(faulty_client(fault), prefix=key_prefix)
    plain = RedisStore(client_from_url(REDIS_URL), prefix=key_prefix)
    yield faulty, plain
    faulty.close()
    plain.close()


# --- lost replies -----------------------------------------------------------------------------


def test_a_reply_lost_after_the_script_ran_is_resolved_by_commit_id(
    stores: tuple[RedisStore, RedisStore], fault: Fault
) -> None:
    store, _ = stores
    rec = make_record()
    store.create(rec)
    v2 = next_version(rec, LifecycleState.CALLING_MODEL)
    fault.sent.clear()
    fault.when = "after_reply"
    assert store.compare_and_set(v2, 1, [row_for(v2, 0)], commit_id="cid-2") == 2
    assert fault.fired == 1
    assert fault.sent.count("EVALSHA") == 1  # resolved by reading back, not by sending again
    assert store.load("acme", "t1") == v2
    assert len(store.read("acme", "t1")) == 1
    assert store.committed("acme", "t1", 2) == "cid-2"
    assert store.list("acme", LifecycleState.CALLING_MODEL) == ["t1"]


def test_commands_before_a_commit_run_first_in_its_round_trip(
    stores: tuple[RedisStore, RedisStore], redis_client: redis.Redis, key_prefix: str
) -> None:
    store, other = stores
    rec = make_record()
    store.create(rec)
    mark = f"{key_prefix}:mark"
    v2 = next_version(rec, LifecycleState.CALLING_MODEL)
    commit = prepare_commit(v2, 1, [row_for(v2, 0)], "cid-b")
    assert store.apply(commit, before=[("RPUSH", mark, "held")]) == 2
    assert other.load("acme", "t1") == v2 and redis_client.lrange(mark, 0, -1) == [b"held"]
    # Ahead of the script: a command that moves the stored version makes the commit lose.
    snap_key = store.trajectory_keys("acme", "t1")[0]
    v3 = next_version(v2, LifecycleState.WAITING_TOOL)
    with pytest.raises(ConcurrentModification) as lost:
        store.apply(prepare_commit(v3, 2, [], "cid-c"), before=[("HSET", snap_key, "v", "7")])
    assert lost.value.current_version == 7, "the command ran first"


def test_a_lost_reply_is_no_conflict_even_when_another_writer_moved_on(
    stores: tuple[RedisStore, RedisStore], fault: Fault
) -> None:
    store, other = stores
    rec = make_record()
    store.create(rec)
    v2 = next_version(rec)
    v3 = next_version(v2, LifecycleState.WAITING_TOOL)

    def other_moves_on() -> None:
        other.compare_and_set(v3, 2, [row_for(v3, 1, "other")])

    fault.then = other_moves_on
    fault.when = "after_reply"
    assert store.compare_and_set(v2, 1, [row_for(v2, 0, "mine")], commit_id="mine") == 2
    assert fault.fired == 1
    assert store.load("acme", "t1") == v3
    assert [row.detail for row in store.read("acme", "t1")] == [
        {"writer": "mine"},
        {"writer": "other"},
    ]


def test_a_lost_reply_to_a_lost_race_is_still_a_conflict(
    stores: tuple[RedisStore, RedisStore], fault: Fault
) -> None:
    store, other = stores
    rec = make_record()
    store.create(rec)
    theirs = next_version(rec, LifecycleState.CALLING_MODEL)
    other.compare_and_set(theirs, 1, [row_for(theirs, 0, "other")])
    fault.when = "after_reply"
    mine = next_version(rec, LifecycleState.WAITING_TOOL)
    with pytest.raises(ConcurrentModification) as caught:
        store.compare_and_set(mine, 1, [row_for(mine, 0, "mine")])
    assert fault.fired == 1
    assert (caught.value.expected_version, caught.value.current_version) == (1, 2)
    assert store.load("acme", "t1") == theirs
    assert len(store.read("acme", "t1")) == 1


def test_a_commit_dropped_before_sending_is_sent_once_more_and_applied_once(
    stores: tuple[RedisStore, RedisStore], fault: Fault
) -> None:
    store, _ = stores
    rec = make_record()
    store.create(rec)
    fault.sent.clear()
    fault.when = "before_send"
    v2 = next_version(rec)
    assert store.compare_and_set(v2, 1, [row_for(v2, 0)]) == 2
    assert fault.fired == 1
    assert fault.sent.count("EVALSHA") == 1
    assert len(store.read("acme", "t1")) == 1


def test_a_read_dropped_before_sending_is_retried(
    stores: tuple[RedisStore, RedisStore], fault: Fault
) -> None:
    store, _ = stores
    store.create(make_record())
    fault.command, fault.when = "HMGET", "before_send"
    assert store.load("acme", "t1").record_version == 1
    assert fault.fired == 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_an_unreachable_redis_fails_after_the_bounded_attempts(fault: Fault) -> None:
    store = RedisStore(
        faulty_client(fault, f"redis://127.0.0.1:{_free_port()}/0"),
        prefix="reins-nowhere",
        retry_attempts=3,
    )
    with pytest.raises(StoreUnavailable, match=r"commit cid-x .*unknown outcome.*3 attempts"):
        store.compare_and_set(next_version(make_record()), 1, commit_id="cid-x")
    assert fault.connects == 1 + 3, "the layout check (tried once), then 3 attempts"
    with pytest.raises(StoreUnavailable, match="loading trajectory t1"):
        store.load("acme", "t1")
    assert fault.connects == 4 + 1 + 3, "checked again: it never succeeded"


# --- key layout -------------------------------------------------------------------------------


def test_keys_are_tenant_scoped_and_a_commit_writes_one_slot(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    store = RedisStore(client_from_url(REDIS_URL), prefix=key_prefix)
    rec = make_record(tid="t:1", tenant="acme")
    store.create(rec)
    v2 = next_version(rec)
    store.compare_and_set(v2, 1, [row_for(v2, 0)])
    store.record("acme", "t:1/s2", {"ok": True})
    keys = sorted({k.decode() for k in redis_client.scan_iter(match=f"{{{key_prefix}*")})
    tag = f"{{{key_prefix}:acme:#{bucket_of('t:1')}}}"
    assert keys == sorted(
        [
            f"{{{key_prefix}:acme:t%3A1%2Fs2}}:idem",
            f"{{{key_prefix}}}:layout",
            f"{tag}:chain:t%3A1",
            f"{tag}:index",
            f"{tag}:snap:t%3A1",
        ]
    )
    assert store.index_key_for("acme", "t:1") == f"{tag}:index"
    assert store.index_key_for("acme", "t:1") in store.index_keys("acme")
    assert len(set(store.index_keys("acme"))) == INDEX_BUCKETS
    slots = {key_slot(k.encode()) for k in (*store.trajectory_keys("acme", "t:1"), f"{tag}:index")}
    assert len(slots) == 1
    assert redis_client.zrange(f"{tag}:index", 0, -1, withscores=True) == [(b"t:1", 1.0)]
    store.close()


def test_a_tenant_spreads_over_its_buckets_and_lists_merge_them(key_prefix: str) -> None:
    store = RedisStore(client_from_url(REDIS_URL), prefix=key_prefix)
    ids = [f"traj-{n}" for n in range(64)]
    for tid in ids:
        store.create(make_record(tid))
    assert len({bucket_of(tid) for tid in ids}) == INDEX_BUCKETS
    assert store.list("acme") == sorted(ids)
    assert store.count("acme", LifecycleState.READY) == 64
    pages, after = [], ""
    for _ in range(7):
        pages.append(store.page("acme", LifecycleState.READY, after, 10))
        after = pages[-1][-1] if pages[-1] else after
    assert [len(page) for page in pages] == [10] * 6 + [4]
    walked = [tid for page in pages for tid in page]
    assert sorted(walked) == sorted(ids) and len(set(walked)) == 64
    assert walked == sorted(ids, key=lambda tid: (bucket_of(tid), tid)), "bucket, then id order"
    store.close()


def test_a_deep_page_costs_what_the_first_page_costs(
    key_prefix: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page 100,000 ids into the index sends the commands the first page sends, none naming
    a position, and reads only the page's ids; taken and left ids alike are found by id."""
    store = RedisStore(client_from_url(REDIS_URL), prefix=key_prefix)
    ids = [f"t{n:07d}" for n in range(160_000)]
    keys = store.index_keys("acme")
    batch = redis_client.pipeline(transaction=False)
    for n in range(0, len(ids), 10_000):
        for key, chunk in _by_bucket(ids[n : n + 10_000], keys).items():
            batch.zadd(key, dict.fromkeys(chunk, 1))  # score 1: READY
    batch.execute()
    in_order = sorted(ids, key=lambda tid: (bucket_of(tid), tid))
    deep = in_order[100_000]
    sent: list[tuple[Any, ...]] = []

    class Recording(DirectBatch):
        def execute_command(self, *args: Any) -> None:
            sent.append(args[3:])  # after EVALSHA sha numkeys: the key and the arguments
            super().execute_command(*args)

    monkeypatch.setattr("store.redis_index.direct_batch", Recording)
    costs = []
    for after, listed in (("", True), (deep, True), (deep, False)):
        if not listed:  # it left the state: the page is found by a search of the ranks
            redis_client.zrem(keys[bucket_of(deep)], deep)
        sent.clear()
        read = store._pager.ids_read
        page = store.page("acme", LifecycleState.READY, after, 50)
        costs.append(([args[1:] for args in sent], store._pager.ids_read - read))
        start = in_order.index(deep) + 1 if after else 0
        assert page == in_order[start : start + 50]
    assert costs[0] == ([(1, "", 50)], 50)
    assert costs[1] == costs[2] == ([(1, deep, 50)], 50)
    store.close()


def _by_bucket(ids: list[str], keys: tuple[str, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for tid in ids:
        out.setdefault(keys[bucket_of(tid)], []).append(tid)
    return out


@pytest.mark.parametrize("topology", ["single", "cluster"])
def test_the_index_is_rebuilt_from_the_snapshots(
    request: pytest.FixtureRequest, topology: str
) -> None:
    if topology == "single":
        redis_client, key_prefix = (
            request.getfixturevalue("redis_client"),
            request.getfixturevalue("key_prefix"),
        )
    else:
        redis_client = request.getfixturevalue("redis_cluster")
        key_prefix = request.getfixturevalue("cluster_key_prefix")
    store = RedisStore(redis_client, prefix=key_prefix)
    for tid in ("t1", "t2", "t:3"):
        store.create(make_record(tid))
    store.create(make_record("t9", tenant="globex"))
    t2 = store.load("acme", "t2")
    store.compare_and_set(next_version(t2, LifecycleState.PAUSED), 1)
    redis_client.delete(*store.index_keys("acme"))
    redis_client.zadd(store.index_key_for("acme", "gone"), {"gone": 1})  # a stale entry
    assert store.list("acme") == ["gone"]
    assert store.rebuild_index("acme") == 3
    assert store.list("acme", LifecycleState.READY) == ["t1", "t:3"]
    assert store.list("acme", LifecycleState.PAUSED) == ["t2"]
    assert store.list("globex") == ["t9"]  # the fixture closes the client


# --- a test-owned server: NOSCRIPT and durability ---------------------------------------------


def test_the_script_is_loaded_again_after_the_server_forgot_it(own_redis: OwnRedis) -> None:
    store = RedisStore(client_from_url(own_redis.url), prefix="reins-noscript")
    rec = make_record()
    store.create(rec)
    redis.Redis.from_url(own_redis.url).script_flush()
    assert store.compare_and_set(next_version(rec), 1) == 2
    store.close()


@pytest.mark.slow
def test_no_acknowledged_commit_is_lost_when_redis_is_killed(own_redis: OwnRedis) -> None:
    store = RedisStore(client_from_url(own_redis.url), prefix="reins-durable", retry_attempts=2)
    store.create(make_record())
    acked: list[tuple[int, str]] = []
    failures: list[BaseException] = []
    enough = threading.Event()

    def write() -> None:
        rec = make_record()
        try:
            while True:
                nxt, cid = next_version(rec), uuid.uuid4().hex
                row = row_for(nxt, rec.record_version - 1)
                store.compare_and_set(nxt, rec.record_version, [row], commit_id=cid)
                acked.append((nxt.record_version, cid))
                rec = nxt
                if len(acked) == 300:
                    enough.set()
        except ReinsError as exc:
            failures.append(exc)
        finally:
            enough.set()

    writer = threading.Thread(target=write)
    writer.start()
    assert enough.wait(timeout=120)
    own_redis.kill()  # while the writer is still committing
    writer.join(timeout=120)
    assert not writer.is_alive()
    assert [type(exc) for exc in failures] == [StoreUnavailable]
    assert len(acked) >= 300
    store.close()

    own_redis.start()
    fresh = RedisStore(client_from_url(own_redis.url), prefix="reins-durable")
    last = acked[-1][0]
    version = fresh.load("acme", "t1").record_version
    assert version in (last, last + 1)  # the commit in flight at the kill may have landed
    recent = [(v, cid) for v, cid in acked if v > version - COMMITS_KEPT]  # older ids trimmed
    assert recent and all(fresh.committed("acme", "t1", v) == cid for v, cid in recent)
    rows = fresh.read("acme", "t1")
    assert [row.index for row in rows] == list(range(version - 1))
    assert [row.record_version for row in rows] == list(range(2, version + 1))
    fresh.close()


# --- the direct command path of the hot calls ------------------------------------------------


def test_direct_commands_give_the_raw_reply_and_keep_the_connection_after_an_error(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    run = direct_command(client)
    key = f"{key_prefix}:direct"
    client.hset(key, mapping={"v": "3", "data": "x"})
    assert run("HMGET", key, "v", "data", "missing") == [b"3", b"x", None]
    with pytest.raises(NoScriptError):
        run("EVALSHA", "0" * 40, 0)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        run("LPUSH", key, "y")
    assert run("HMGET", key, "v") == [b"3"], "the connection answers the next command in order"
    pool = client.connection_pool
    assert len(pool._in_use_connections) == 1, "an error reply does not spend the connection"
    client.close()


def test_each_thread_keeps_its_own_connection_and_a_killed_one_is_replaced(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """The direct path pins one connection per thread: the same one call after call, another
    in another thread; one the server closed fails its next call as a transient error (the
    store's retries take it from there) and the thread takes a fresh one."""
    client = redis.Redis.from_url(REDIS_URL)
    run = direct_command(client)
    mine = run("CLIENT", "ID")
    assert run("CLIENT", "ID") == mine
    theirs: list[Any] = []
    other = threading.Thread(target=lambda: theirs.append(run("CLIENT", "ID")))
    other.start()
    other.join()
    assert theirs and theirs[0] != mine
    assert redis_client.client_kill_filter(_id=mine) == 1
    with pytest.raises(redis.ConnectionError):
        run("CLIENT", "ID")
    fresh = run("CLIENT", "ID")
    assert fresh != mine and run("CLIENT", "ID") == fresh
    batch = direct_batch(client)
    assert batch.execute_command("CLIENT", "ID").execute() == [fresh], "batches share it"
    client.close()


def test_more_threads_than_redis_pys_default_pool_each_keep_a_connection() -> None:
    """A worker runs REINS_WORKER_CONCURRENCY threads (192 in the fleet bench), each keeping
    its own connection: a pool capped at redis-py 8's default 100 refused the 101st."""
    client = client_from_url(REDIS_URL)
    run = direct_command(client)
    threads = 150
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            run("PING")
            barrier.wait(timeout=30)  # every thread holds its connection at once
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()

    pool = [threading.Thread(target=call) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors[:1]
    assert len(client.connection_pool._in_use_connections) == threads
    client.close()


def test_a_store_carries_on_after_its_connection_is_killed(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    store = RedisStore(client_from_url(REDIS_URL), prefix=key_prefix)
    rec = make_record("t1", "acme")
    store.create(rec)
    pinned = store._execute("CLIENT", "ID")
    assert redis_client.client_kill_filter(_id=pinned) == 1
    assert store.load("acme", "t1") == rec, "the read is retried on a fresh connection"
    moved = next_version(rec)
    assert store.compare_and_set(moved, rec.record_version) == moved.record_version
    assert store._execute("CLIENT", "ID") != pinned
    store.close()


def test_a_client_pinned_to_one_connection_keeps_its_own_execute_command() -> None:
    pinned = redis.Redis.from_url(REDIS_URL, single_connection_client=True)
    assert direct_command(pinned) == pinned.execute_command
    pinned.close()


def test_a_direct_batch_answers_as_a_pipeline_does(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    batch = direct_batch(client)
    assert isinstance(batch, DirectBatch)
    replies = []
    for pipe in (client.pipeline(transaction=False), batch):
        key = f"{key_prefix}:batch:{type(pipe).__name__}"
        pipe.rpush(key, "a", "b").lpush(key, "c")
        pipe.execute_command("HSET", f"{key}:h", "f", "v")
        pipe.execute_command("SADD", f"{key}:s", "m", "n")
        pipe.execute_command("EVALSHA", "0" * 40, 0)  # the server has no such script
        pipe.execute_command("HSET", key, "f", "v")  # a list: WRONGTYPE
        replies.append(pipe.execute(raise_on_error=False))
        assert client.lrange(key, 0, -1) == [b"c", b"a", b"b"]
    ours, theirs = replies[1], replies[0]
    assert ours[:4] == theirs[:4] == [2, 3, 1, 2]
    assert isinstance(ours[4], NoScriptError) and isinstance(theirs[4], NoScriptError)
    assert type(ours[5]) is type(theirs[5]) and "WRONGTYPE" in str(ours[5])
    batch.execute_command("EVALSHA", "0" * 40, 0)
    with pytest.raises(NoScriptError):
        batch.execute()
    assert batch.execute() == [], "nothing queued: nothing sent"
    assert len(client.connection_pool._in_use_connections) == 1, "the thread's one connection"
    pinned = redis.Redis.from_url(REDIS_URL, single_connection_client=True)
    assert not isinstance(direct_batch(pinned), DirectBatch)
    pinned.close()
    client.close()
