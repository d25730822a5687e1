"""``reins up`` brings a fleet up, hands out keys, serves a job to its end, and on Ctrl-C stops
every process it started."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from api.client import ReinsClient
from ops.local.fleet import ROOT
from tests.api.processes import free_port
from tests.conftest import REDIS_URL
from tests.support import wait_for

pytestmark = pytest.mark.redis


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("own_redis", [False, True], ids=["running-redis", "redis-started-here"])
def test_reins_up_serves_a_job_and_ctrl_c_stops_what_it_started(
    tmp_path: Path, key_prefix: str, own_redis: bool
) -> None:
    if own_redis and shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on the PATH")
    # a port where no Redis answers: reins up starts one there, and stops it
    redis_url = f"redis://127.0.0.1:{free_port()}/0" if own_redis else REDIS_URL
    home, port = tmp_path / ".reins", free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REINS_")}
    env.update(
        {
            "REINS_KEY_PREFIX": key_prefix,
            "REINS_REDIS_URL": redis_url,
            "REINS_BROKER_URL": redis_url,
            "PYTHONPATH": str(ROOT),
        }
    )
    code = "from ops.cli.main import main; main()"
    args = ["up", "--port", str(port), "--home", str(home)]
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=tmp_path, env=env, stdout=log, stderr=log
    )
    pids: dict[str, int] = {}
    try:
        wait_for(lambda: (home / "pids").exists() or up.poll() is not None, 90, "reins up")
        assert up.poll() is None, (tmp_path / "up.log").read_text()
        pids = json.loads((home / "pids").read_text())
        assert {"router", "api", "w1", "w2"} <= set(pids)
        assert ("redis" in pids) == own_redis
        handed = json.loads((home / "keys").read_text())
        assert set(handed["keys"]) == {"operator", "acme", "globex"}
        assert (home / "logs" / "api.log").exists()

        with ReinsClient(handed["url"], handed["keys"]["acme"]) as client:
            job = {
                "agent": "examples.support_store:agent",
                "goal": "refund the damaged item on order ord_1001",
                "user": "cu_ana",
            }
            tid = client.submit(job)["trajectory_id"]
            kinds = [event.kind for event in client.events(tid)]
            assert kinds[-1] == "stop"
            assert client.show(tid)["state"] == "COMPLETED"

        # the CLI on the same fleet: submit and follow to the stop
        cli_env = {**env, "REINS_API_URL": handed["url"], "REINS_API_KEY": handed["keys"]["acme"]}
        submit = ["submit", "--agent", job["agent"], "--goal", job["goal"], "--follow", "--json"]
        followed = subprocess.run(
            [sys.executable, "-c", code, *submit],
            cwd=tmp_path,
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert followed.returncode == 0, followed.stderr
        lines = [json.loads(line) for line in followed.stdout.splitlines()]
        assert "trajectory_id" in lines[0] and lines[-1]["event"] == "stop"
        assert [line["id"] for line in lines[1:]] == list(range(len(lines) - 1))
    finally:
        up.send_signal(signal.SIGINT)
        status = up.wait(timeout=120)
        log.close()
    assert status == 0, (tmp_path / "up.log").read_text()
    assert [name for name, pid in pids.items() if _alive(pid)] == []
    assert "stopped" in (tmp_path / "up.log").read_text()
