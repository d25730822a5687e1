"""`reins archive` and `reins retire` on the running Redis: what is past its tenant's retention is
written (record and chain, one JSON line each) and retired only after; bad input is refused
naming what is wrong, and changes nothing."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
import redis
import typer
from typer.testing import CliRunner

from kernel.chain import ChainRow
from kernel.errors import InvalidInput, UnknownTenant
from kernel.record import TrajectoryRecord
from kernel.states import LifecycleState
from ops.cli import retention as cli_retention
from router.fleet import config as fleet_config
from router.process.retention import DAY_S
from store.redis_client import client_from_url
from store.redis_store import RedisStore
from tests.conftest import REDIS_URL
from tests.contract.test_retention_contract import finish

pytestmark = pytest.mark.redis
AGENTS = ["examples.support_store:agent"]


@pytest.fixture
def store(key_prefix: str, redis_client: redis.Redis) -> Iterator[RedisStore]:
    """The fleet's store, with acme keeping 30 days and globex 90, and on it, for each tenant,
    one run finished 40 days ago, one 1 day ago, one 40 days ago still owing, one live."""
    tenants = [
        {"name": n, "weight": 1, "max_ready": 9, "largest_call_tokens": 9, "agents": AGENTS}
        for n in ("acme", "globex")
    ]
    tenants[0]["retention_days"] = 30
    tenants[1]["retention_days"] = 90
    doc = {"quantum_tokens": 10, "credit_cap_tokens": 10, "tenants": tenants}
    fleet_config.apply(redis_client, key_prefix, doc)
    made = RedisStore(client_from_url(REDIS_URL), prefix=key_prefix)
    now = time.time()
    for tenant in ("acme", "globex"):
        finish(made, "old", at=now - 40 * DAY_S, tenant=tenant)
        finish(made, "new", at=now - DAY_S, tenant=tenant)
        finish(made, "owes", at=now - 40 * DAY_S, tenant=tenant, owes=True)
        finish(made, "live", at=now - 40 * DAY_S, tenant=tenant, state=LifecycleState.READY)
    yield made
    made.close()


@pytest.fixture
def cli(key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    monkeypatch.setenv("REINS_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("REINS_KEY_PREFIX", key_prefix)
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, so each command is called by its name
    cli_retention.register(app)
    return app


def everything(store: RedisStore, client: redis.Redis) -> dict[str, object]:
    """Every key under the test's prefix with its content: to show that nothing changed.

    Content, not ``DUMP`` bytes: a large hash's field order in its dump moves with the
    server's incremental rehashing, which reads alone can advance."""
    keys = sorted(client.scan_iter(match=f"{{{store.prefix}*", count=1000))
    read: dict[bytes, Callable[[bytes], object]] = {
        b"string": client.get,
        b"hash": client.hgetall,
        b"list": lambda k: client.lrange(k, 0, -1),
        b"set": client.smembers,
        b"zset": lambda k: client.zrange(k, 0, -1, withscores=True),
        b"stream": client.xrange,
    }
    kinds = {k: cast(bytes, client.type(k)) for k in keys}
    return {k.decode(): (kinds[k], read[kinds[k]](k)) for k in keys}


def test_archive_writes_what_expired_then_retires_it(
    cli: typer.Typer, store: RedisStore, tmp_path: Path
) -> None:
    before = {t: store.load("acme", t) for t in ("old", "new", "owes", "live")}
    chain = store.read("acme", "old")
    result = CliRunner().invoke(cli, ["archive", str(tmp_path), "--retire", "--json"])
    assert result.exit_code == 0, result.output
    archives = {a["tenant"]: a for a in json.loads(result.output)["archives"]}
    assert archives["globex"] == {"tenant": "globex", "path": None, "written": 0, "retired": 0}
    acme = archives["acme"]
    assert (acme["written"], acme["retired"]) == (1, 1)
    assert Path(acme["path"]).parent == tmp_path and acme["path"].endswith(".jsonl")
    (entry,) = [json.loads(ln) for ln in Path(acme["path"]).read_text().splitlines()]
    assert (entry["tenant"], entry["trajectory_id"]) == ("acme", "old")
    assert TrajectoryRecord.model_validate(entry["record"]) == before["old"]
    assert entry["version"] == before["old"].record_version
    assert [ChainRow.model_validate(r) for r in entry["chain"]] == chain
    assert store.list("acme") == ["live", "new", "owes"]
    assert all(store.load("acme", t) == before[t] for t in ("new", "owes", "live"))
    assert store.list("globex") == ["live", "new", "old", "owes"], "globex keeps 90 days"
    assert [p.name for p in tmp_path.iterdir()] == [Path(acme["path"]).name], "no partial left"


def test_archive_without_retire_deletes_nothing(
    cli: typer.Typer, store: RedisStore, redis_client: redis.Redis, tmp_path: Path
) -> None:
    before = everything(store, redis_client)
    result = CliRunner().invoke(cli, ["archive", str(tmp_path), "--retention-days", "0"])
    assert result.exit_code == 0, result.output
    assert everything(store, redis_client) == before
    names = sorted(p.name.split("-")[0] for p in tmp_path.iterdir())
    assert names == ["acme", "globex"], "0 days: every finished run that owes nothing"
    for path in tmp_path.iterdir():
        ids = [json.loads(ln)["trajectory_id"] for ln in path.read_text().splitlines()]
        assert sorted(ids) == ["new", "old"]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (["--tenant", "initech"], UnknownTenant, r"unknown tenants \['initech'\]"),
        (["--retention-days", "-1"], InvalidInput, "--retention-days -1.0: must not be negative"),
        (["--to", "missing"], InvalidInput, "missing: not a directory"),
        (["--to", "a-file"], InvalidInput, "a-file: not a directory"),
    ],
)
def test_bad_input_is_refused_by_name_and_changes_nothing(
    cli: typer.Typer,
    store: RedisStore,
    redis_client: redis.Redis,
    tmp_path: Path,
    args: list[str],
    error: type[Exception],
    match: str,
) -> None:
    (tmp_path / "a-file").write_text("")
    target = tmp_path
    if args[0] == "--to":
        target, args = tmp_path / args[1], []
    before = everything(store, redis_client)
    for verb in (["archive", str(target), "--retire"], ["retire"]):
        if verb == ["retire"] and target != tmp_path:
            continue  # retire writes no file
        result = CliRunner().invoke(cli, [*verb, *args])
        assert isinstance(result.exception, error), result.output
        assert re.search(match, str(result.exception)), str(result.exception)
    assert everything(store, redis_client) == before
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]


def test_retire_by_hand_walks_every_tenant_once(
    cli: typer.Typer, store: RedisStore, redis_client: redis.Redis
) -> None:
    result = CliRunner().invoke(cli, ["retire", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"retired": {"acme": 1, "globex": 0}}
    assert store.list("acme") == ["live", "new", "owes"]
    snap_key, chain_key = store.trajectory_keys("acme", "old")
    assert redis_client.exists(snap_key, chain_key) == 0
    assert all(redis_client.zscore(k, snap_key) is None for k in store.index_keys("acme"))
    again = CliRunner().invoke(cli, ["retire", "--tenant", "globex", "--retention-days", "30"])
    assert again.exit_code == 0, again.output
    assert "globex: 1 finished trajectories retired" in again.output
    assert store.list("globex") == ["live", "new", "owes"]
