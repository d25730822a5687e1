"""The cluster harness and the cluster client: a three-master cluster of the session's own,
and a client from its URL that reaches every master."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, ResponseError

from kernel.errors import ConfigError
from kernel.memory import MemoryItem, MemoryKind, Scope, Visibility
from kernel.settings import Settings
from store.memory_redis import RedisMemory
from store.redis_client import client_for, client_from_url, is_cluster
from store.redis_direct import direct_batch, direct_command
from store.redis_store import RedisStore
from tests.contract.advance_worker import make_record, next_version

pytestmark = pytest.mark.redis


def _key_on_each_master(client: RedisCluster, prefix: str) -> dict[str, str]:
    """A key of ``prefix`` served by each master, by the master's ``host:port``."""
    found: dict[str, str] = {}
    n = 0
    while len(found) < len(client.get_primaries()) and n < 10_000:
        key = f"{prefix}:k{n}"
        node = client.get_node_from_key(key)
        found.setdefault(node.name, key)
        n += 1
    return found


def test_a_client_from_the_url_round_trips_a_key_on_each_master(
    redis_cluster_url: str, cluster_key_prefix: str
) -> None:
    assert redis_cluster_url.startswith("redis+cluster://127.0.0.1:")
    client = client_from_url(redis_cluster_url, connect_timeout_s=2, timeout_s=2)
    assert is_cluster(client) and isinstance(client, RedisCluster)
    masters = client.get_primaries()
    assert len(masters) == 3
    keys = _key_on_each_master(client, cluster_key_prefix)
    assert sorted(keys) == sorted(node.name for node in masters)
    for name, key in keys.items():
        client.set(key, name)
        assert client.get(key) == name.encode()
        host, port = name.rsplit(":", 1)
        with redis.Redis(host=host, port=int(port)) as direct:  # stored on that master alone
            assert direct.get(key) == name.encode()
    client.close()


def test_the_fast_paths_fall_back_to_the_cluster_client(
    redis_cluster: redis.Redis, cluster_key_prefix: str
) -> None:
    execute = direct_command(redis_cluster)
    keys = list(_key_on_each_master(redis_cluster, cluster_key_prefix).values())  # type: ignore[arg-type]
    for key in keys:
        assert execute("SET", key, "x") in (True, b"OK")
        assert execute("GET", key) == b"x"
    batch = direct_batch(redis_cluster)  # keys of three slots on three nodes, replies in order
    for n, key in enumerate(keys):
        batch.execute_command("HSET", f"{key}:h", "f", n)
        batch.rpush(f"{key}:l", "a", "b")
    assert batch.execute() == [1, 2] * len(keys)


def test_the_cluster_setting_makes_a_plain_url_a_cluster_client(redis_cluster_url: str) -> None:
    first = redis_cluster_url.removeprefix("redis+cluster://").split(",")[0]
    settings = Settings.from_env(
        {"REINS_REDIS_URL": f"redis://{first}", "REINS_REDIS_CLUSTER": "1"}
    )
    client = client_for(settings)
    assert is_cluster(client) and len(client.get_primaries()) == 3  # type: ignore[attr-defined]
    client.close()
    broker = client_for(settings, broker=True)  # the broker's Redis is never the cluster
    assert not is_cluster(broker)
    broker.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://127.0.0.1:notaport", "port 'notaport' of 127.0.0.1 is not a number"),
        ("redis+cluster://127.0.0.1:7000/3", "database 0 only"),
        ("redis+sentinel://127.0.0.1:26379", "redis+sentinel://host:port"),
        ("redis+sentinel://127.0.0.1:26379/mymaster/x", "database 'x' is not a number"),
        ("redis+cluster://:7000", "':7000' is not host:port"),
    ],
)
def test_a_bad_url_is_refused_naming_the_setting(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match="REINS_REDIS_URL") as caught:
        client_from_url(url)
    assert message in str(caught.value)


def test_a_script_over_two_slots_is_refused_by_the_cluster(
    redis_cluster: redis.Redis, cluster_key_prefix: str
) -> None:
    """What the contract suite on the cluster relies on: layout 1's commit (a trajectory's tag
    and its tenant's) could not run here."""
    keys = (f"{{{cluster_key_prefix}:acme:t1}}:snap", f"{{{cluster_key_prefix}:acme}}:index")
    assert redis_cluster.keyslot(keys[0]) != redis_cluster.keyslot(keys[1])  # type: ignore[attr-defined]
    script = "redis.call('HSET', KEYS[1], 'v', 1); return redis.call('ZADD', KEYS[2], 1, 'x')"
    with pytest.raises((RedisClusterException, ResponseError), match=r"(?i)slot"):
        redis_cluster.eval(script, 2, *keys)
    assert redis_cluster.exists(*keys) == 0


def test_the_cluster_fast_path_follows_a_moved_reply(
    redis_cluster_url: str, cluster_key_prefix: str
) -> None:
    """A client whose slot map names the wrong master (as after a resharding) gets ``MOVED``
    from it; the command is sent again through the cluster client, which learns the map."""
    client: Any = client_from_url(redis_cluster_url, connect_timeout_s=2, timeout_s=2)
    key = f"{{{cluster_key_prefix}}}:moved"
    slot = client.keyslot(key)
    right = client.nodes_manager.get_node_from_slot(slot)
    wrong = next(node for node in client.get_primaries() if node.name != right.name)
    client.nodes_manager.slots_cache[slot] = [wrong]
    execute = direct_command(client)
    assert execute("SET", key, "v") in (True, b"OK")
    assert execute("GET", key) == b"v"
    assert client.nodes_manager.get_node_from_slot(slot).name == right.name, "the map learnt it"
    host, port = right.name.rsplit(":", 1)
    with redis.Redis(host=host, port=int(port)) as direct:
        assert direct.get(key) == b"v"
    client.close()


def test_scripts_the_masters_lost_are_loaded_again(
    redis_cluster: redis.Redis, cluster_key_prefix: str
) -> None:
    """After ``SCRIPT FLUSH`` on every master (a restart), a commit and a memory write and
    recall each load their script again and go on."""
    cluster: Any = redis_cluster
    store = RedisStore(redis_cluster, prefix=cluster_key_prefix)
    bank = RedisMemory(redis_cluster, prefix=cluster_key_prefix)
    rec = make_record()
    store.create(rec)
    item = MemoryItem(
        kind=MemoryKind.FACT,
        tenant="acme",
        scope=Scope.USER,
        subject="cu_ana",
        key="lang",
        value={"text": "de"},
        tags=["language"],
        written_ms=1,
    )
    for node in cluster.get_primaries():
        cluster.get_redis_connection(node).script_flush()
    store.compare_and_set(next_version(rec), 1)
    bank.put(item)
    assert store.load("acme", "t1").record_version == 2
    found = bank.recall(Visibility("acme", "cu_ana", "m"), MemoryKind.FACT, ["language"], 2, 5)
    assert [i.item_id for i in found] == [item.item_id]
