"""How a store URL is read: hosts, credentials and the refusals, before anything connects."""

from __future__ import annotations

import pytest

from kernel.errors import ConfigError
from store.redis_client import _credentials, _hosts, client_from_url


def test_hosts_default_their_port_and_keep_their_order() -> None:
    assert _hosts("a:7000,b,c:7002", "X") == [("a", 7000), ("b", 6379), ("c", 7002)]
    assert _hosts("user:secret@a:7000,b:7001", "X") == [("a", 7000), ("b", 7001)]


def test_credentials_are_read_and_unquoted() -> None:
    assert _credentials("a:7000") == {}
    assert _credentials(":p%40ss@a:7000") == {"password": "p@ss"}
    assert _credentials("ops:pw@a:7000,b:7001") == {"username": "ops", "password": "pw"}


@pytest.mark.parametrize(
    ("url", "cluster", "message"),
    [
        ("redis+sentinel://127.0.0.1:26379/m", True, "a Sentinel URL with REINS_REDIS_CLUSTER"),
        ("unix:///tmp/redis.sock", True, "a cluster URL is redis+cluster://"),
        ("redis+cluster://a:1,b:x", False, "port 'x' of b is not a number"),
    ],
)
def test_a_url_that_cannot_mean_what_the_settings_say_is_refused(
    url: str, cluster: bool, message: str
) -> None:
    with pytest.raises(ConfigError, match="REINS_REDIS_URL") as caught:
        client_from_url(url, cluster=cluster)
    assert message in str(caught.value)
