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


def test_metrics_are_off_by_default_and_the_port_is_bounded() -> None:
    s = Settings.from_env({})
    assert s.metrics_port == 0 and s.metrics_host == "127.0.0.1"
    on = Settings.from_env({"REINS_METRICS_PORT": "9100", "REINS_METRICS_HOST": "0.0.0.0"})
    assert (on.metrics_host, on.metrics_port) == ("0.0.0.0", 9100)
    for bad in ("-1", "65536", "http"):
        with pytest.raises(ConfigError, match="REINS_METRICS_PORT"):
            Settings.from_env({"REINS_METRICS_PORT": bad})
    with pytest.raises(ConfigError, match="REINS_METRICS_HOST"):
        Settings.from_env({"REINS_METRICS_HOST": ""})


def test_the_test_suites_variables_are_not_settings() -> None:
    """REINS_TEST_* names belong to the test suite (its Redis, its screenshots): a process the
    tests start ignores them; any other unknown REINS_ name is still refused."""
    s = Settings.from_env({"REINS_TEST_REDIS_URL": "redis://127.0.0.1:6379/3"})
    assert s == Settings.from_env({})
    with pytest.raises(ConfigError, match="REINS_TESTS_REDIS_URL"):
        Settings.from_env({"REINS_TESTS_REDIS_URL": "x"})


def test_a_member_retention_not_above_the_heartbeat_timeout_is_refused_naming_both() -> None:
    assert Settings.from_env({}).member_retention_s == 3600.0
    env = {"REINS_MEMBER_RETENTION_S": "5", "REINS_HEARTBEAT_TIMEOUT_S": "5"}
    with pytest.raises(ConfigError, match=r"REINS_MEMBER_RETENTION_S.*REINS_HEARTBEAT_TIMEOUT_S"):
        Settings.from_env(env)
