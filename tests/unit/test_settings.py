import pytest

from kernel.errors import ConfigError, ReinsError
from kernel.settings import Settings


def test_defaults_without_environment() -> None:
    s = Settings.from_env({"PATH": "/bin"})
    assert s.redis_url.startswith("redis://")
    assert s.broker_url != s.redis_url


def test_reads_known_variables() -> None:
    s = Settings.from_env({"REINS_KEY_PREFIX": "t1", "REINS_HEARTBEAT_TIMEOUT_S": "2.5"})
    assert s.key_prefix == "t1"
    assert s.heartbeat_timeout_s == 2.5


def test_unknown_variable_is_named() -> None:
    with pytest.raises(ConfigError, match="REINS_REDIS_URLL"):
        Settings.from_env({"REINS_REDIS_URLL": "redis://x"})


def test_bad_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="REINS_HEARTBEAT_TIMEOUT_S"):
        Settings.from_env({"REINS_HEARTBEAT_TIMEOUT_S": "-1"})


def test_one_tree() -> None:
    assert issubclass(ConfigError, ReinsError)
