"""Every registered bench names its peer: what it is, the installed version, the path it takes.

Running every bench here would take minutes (``soak`` alone two); each bench's own smoke test
checks that its quick run's JSON carries exactly the peer declared here.
"""

from __future__ import annotations

import re

import pytest

from kernel.errors import InvalidInput
from ops import bench as benchmarks
from ops.bench.peers import NO_PEER, NOT_INSTALLED

#: Each bench with its default options, and the options that change its peer's path.
DECLARED = [(name, {}) for name in benchmarks.BENCHMARKS] + [
    ("store", {"cluster": True}),
    ("fleet", {"broker": "amqp"}),
]


@pytest.mark.parametrize(("name", "options"), DECLARED, ids=lambda v: str(v or ""))
def test_every_bench_declares_its_peer_by_name_version_and_path(
    name: str, options: dict[str, object]
) -> None:
    peer = benchmarks.peer(name, **options)
    assert set(peer) == {"name", "version", "path"}, peer
    assert peer["name"] and peer["path"], f"bench {name} names no peer or path"
    if peer["name"] == NO_PEER:  # judged against stated bounds: the path says which
        assert peer["version"] == "n/a" and len(peer["path"]) > 20, peer
        return
    if peer["version"] == NOT_INSTALLED:
        pytest.skip(f"bench {name}'s peer is not installed (pip install -e '.[bench]')")
    assert re.fullmatch(r"\d+(\.\d+)+\S*", peer["version"]), f"{name}: {peer['version']!r}"


def test_the_options_a_peer_depends_on_change_its_path() -> None:
    assert benchmarks.peer("store") != benchmarks.peer("store", cluster=True)
    assert "RabbitMQ" in benchmarks.peer("fleet", broker="amqp")["path"]


def test_the_peer_of_an_unknown_bench_is_refused_naming_it() -> None:
    with pytest.raises(InvalidInput, match="unknown benchmark 'nope'"):
        benchmarks.peer("nope")
