"""Settings and option values: delayqueue/config/env.py reads environment variables the way Django's
settings and ./dev do; delayqueue/config/arguments.py types the command lines' options."""
import argparse

import pytest

from delayqueue.config.arguments import age_in_days, msg_id, non_empty, positive_int, topic_name
from delayqueue.config.env import env_bool, env_int, env_url
from delayqueue.config.settings import HOST_TOKEN_MIN_LENGTH, SETTINGS, checked_host_token
from delayqueue.core.constants import MAX_AGE_DAYS


@pytest.mark.parametrize("value, expected", [(None, True), ("", True), ("1", True), ("TRUE", True), (" yes ", True),
                                             ("on", True), ("0", False), ("false", False), (" Off", False),
                                             ("no", False), ("  ", True)])
def test_env_bool(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("DQ_FLAG", raising=False)
    else:
        monkeypatch.setenv("DQ_FLAG", value)
    assert env_bool("DQ_FLAG", True) is expected


@pytest.mark.parametrize("value", ["ture", "nope", "enabled", "2"])
def test_env_bool_refuses_a_word_it_does_not_know_rather_than_reading_it_as_false(monkeypatch, value):
    # DELAYQUEUE_MESSAGE_LOG=ture must not run the service without its message log.
    monkeypatch.setenv("DQ_FLAG", value)
    with pytest.raises(SystemExit) as stopped:
        env_bool("DQ_FLAG", True)
    assert str(stopped.value) == ("environment variable DQ_FLAG must be one of 1, true, yes, on or 0, false, no, "
                                  f"off, got {value!r}")


def test_env_int_takes_the_default_when_unset_or_blank_and_checks_bounds(monkeypatch):
    monkeypatch.delenv("DQ_N", raising=False)
    assert env_int("DQ_N", 7, minimum=1) == 7
    monkeypatch.setenv("DQ_N", "  ")
    assert env_int("DQ_N", 7, minimum=1) == 7
    monkeypatch.setenv("DQ_N", "1")
    assert env_int("DQ_N", 7, minimum=1, maximum=1) == 1
    for value, message in [("0", "environment variable DQ_N must be at least 1, got 0"),
                           ("11", "environment variable DQ_N must be at most 10, got 11"),
                           ("1h", "environment variable DQ_N must be an integer, got '1h'")]:
        monkeypatch.setenv("DQ_N", value)
        with pytest.raises(SystemExit) as stopped:
            env_int("DQ_N", 7, minimum=1, maximum=10)
        assert str(stopped.value) == message


def test_env_url_names_the_variable_and_never_echoes_the_value(monkeypatch):
    def parse(url):
        if not url.startswith("redis://"):
            raise ValueError("must be a redis:// URL")
        return url.upper()

    monkeypatch.delenv("DQ_URL", raising=False)
    assert env_url("DQ_URL", "redis://default", parse) == "REDIS://DEFAULT"
    monkeypatch.setenv("DQ_URL", "mysql://user:secret@db")
    with pytest.raises(SystemExit) as stopped:
        env_url("DQ_URL", "redis://default", parse)
    assert str(stopped.value) == "environment variable DQ_URL must be a redis:// URL"


def test_option_types_take_good_values_and_refuse_bad_ones_in_argparse_terms():
    assert positive_int("1") == 1 and age_in_days(str(MAX_AGE_DAYS)) == MAX_AGE_DAYS
    assert topic_name("a.b:c-d_e") == "a.b:c-d_e" and non_empty("x") == "x" and msg_id("订单 42/x") == "订单 42/x"
    assert [topic_name(t) for t in ("订单-cancel", " a/b {c}* ", "é" * 127 + "x")] == ["订单-cancel", " a/b {c}* ", "é" * 127 + "x"]
    for parse, text, message in [(positive_int, "0", "must be at least 1, got 0"),
                                 (positive_int, "ten", "not an integer: 'ten'"),
                                 (age_in_days, str(MAX_AGE_DAYS + 1), f"must be at most {MAX_AGE_DAYS} days"),
                                 (topic_name, "", "a topic must be 1-255 bytes of UTF-8 text without control "
                                                  "characters; it is empty"),
                                 (topic_name, "é" * 128, "a topic must be .*; it is 256 bytes"),
                                 (topic_name, "tab\there", "a topic must be .*; it has U\\+0009"),
                                 (topic_name, "bad\udcffbyte", "it has U\\+DCFF"),  # a non-UTF-8 argv byte
                                 (non_empty, "", "must not be empty"),
                                 (non_empty, "bad\udcffbyte", "not UTF-8 text"),  # a lock token in Redis
                                 (msg_id, "", "a msgId must be UTF-8 text without control characters, 1-256 "
                                              "characters long; it is empty"),
                                 (msg_id, "bad\udcffbyte", "a msgId must be .*; it has U\\+DCFF"),
                                 (msg_id, "a\x7fb", "it has U\\+007F"),
                                 (msg_id, "x" * 257, "a msgId must be .*; it has 257")]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse(text)


def test_a_bad_option_value_exits_2_naming_the_option(capsys):
    parser = argparse.ArgumentParser(prog="job")
    parser.add_argument("--older-than-days", type=age_in_days)
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(["--older-than-days", "-3"])
    assert stopped.value.code == 2
    assert "argument --older-than-days: must be at least 1, got -3" in capsys.readouterr().err


def test_a_host_token_shorter_than_the_minimum_is_refused_and_none_is_allowed():
    with pytest.raises(ValueError, match=f"at least {HOST_TOKEN_MIN_LENGTH} characters"):
        checked_host_token("x" * (HOST_TOKEN_MIN_LENGTH - 1))
    assert checked_host_token("x" * HOST_TOKEN_MIN_LENGTH) == "x" * HOST_TOKEN_MIN_LENGTH
    assert checked_host_token("") == ""


def test_the_hot_window_is_off_or_at_least_a_second(monkeypatch):
    declared = SETTINGS["hot_window_millis"]
    for value, expected in [("", 3_600_000), ("0", 0), ("1000", 1000), ("7200000", 7_200_000)]:  # unset: an hour
        monkeypatch.setenv("DELAYQUEUE_HOT_WINDOW_MILLIS", value)
        assert declared.read() == expected
    monkeypatch.setenv("DELAYQUEUE_HOT_WINDOW_MILLIS", "500")
    with pytest.raises(SystemExit) as stopped:
        declared.read()
    assert str(stopped.value) == "environment variable DELAYQUEUE_HOT_WINDOW_MILLIS must be 0 (off) or at least 1000, got 500"


def test_a_runtime_takes_its_namespaces_database_from_the_config_it_is_given():
    """Benchmarks and Spark build a Runtime from a config of their own, outside Django's settings:
    its log, limits and topic settings are read from that config's database for the namespace."""
    from delayqueue.config.settings import QueueConfig
    from delayqueue.runtime import Runtime

    config = QueueConfig(redis_url="redis://127.0.0.1:9/0", namespace="acme",
                         log_databases="tenants=postgres://dq@db2/dq", namespace_databases="acme=tenants")
    rt = Runtime(config, process="test")
    assert rt.log_database == "tenants"
    assert rt.limits._db._database == rt.topic_configs._db._database == "tenants"


def test_log_databases_and_namespace_routes_are_read_and_checked_without_echoing_a_url(monkeypatch):
    from delayqueue.config.settings import QueueConfig

    monkeypatch.setenv("DELAYQUEUE_LOG_DATABASES", " tenants=postgres://dq:s3cret@db2/dq , eu_1=postgres://dq@db3/dq,")
    monkeypatch.setenv("DELAYQUEUE_NAMESPACE_DATABASES", "acme=tenants,shop.eu=eu_1,local=default")
    config = QueueConfig.from_environment()
    assert config.log_database_urls == {"tenants": "postgres://dq:s3cret@db2/dq", "eu_1": "postgres://dq@db3/dq"}
    assert config.log_routes == {"acme": "tenants", "shop.eu": "eu_1", "local": "default"}
    assert "s3cret" not in repr(config)
    monkeypatch.setenv("REDIS_URL", "redis://:redis-s3cret@10.0.0.5:6379/0")
    monkeypatch.setenv("DATABASE_URL", "postgres://dq:pg-s3cret@db1/dq")
    config = QueueConfig.from_environment()
    assert (config.redis_url, config.database_url) == ("redis://:redis-s3cret@10.0.0.5:6379/0",
                                                       "postgres://dq:pg-s3cret@db1/dq")
    assert "s3cret" not in repr(config)  # the two URLs' passwords neither
    refusals = [
        ("DELAYQUEUE_LOG_DATABASES", "tenants", "must be comma-separated alias=postgres://... pairs"),
        ("DELAYQUEUE_LOG_DATABASES", "default=postgres://dq@db/dq", "names a database 'default'"),
        ("DELAYQUEUE_LOG_DATABASES", "Big=postgres://dq@db/dq", "names a database 'Big'"),
        ("DELAYQUEUE_LOG_DATABASES", "a=postgres://dq@db/dq,a=postgres://dq@db/dq", "names database a twice"),
        ("DELAYQUEUE_LOG_DATABASES", "a=mysql://dq:s3cret@db/dq", "database a's URL must be a postgres://"),
        ("DELAYQUEUE_NAMESPACE_DATABASES", "a{b}=tenants", "must be 1-64 of A-Z"),
        ("DELAYQUEUE_NAMESPACE_DATABASES", "acme=tenants,acme=eu_1", "names namespace acme twice"),
        ("DELAYQUEUE_NAMESPACE_DATABASES", "acme=elsewhere", "names database elsewhere, which "
                                                            "DELAYQUEUE_LOG_DATABASES does not declare"),
    ]
    for name, value, words in refusals:
        with monkeypatch.context() as m:
            m.setenv(name, value)
            with pytest.raises(SystemExit) as refused:
                QueueConfig.from_environment()
            assert words in str(refused.value) and "s3cret" not in str(refused.value), (value, str(refused.value))
