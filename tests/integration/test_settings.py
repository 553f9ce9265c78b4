"""Settings from the environment: a value the service cannot run with stops it at start with one
line naming the variable (README "Configuration"), before it misbehaves (a monitor interval of 0
divides by zero, a negative retention prunes every ended message, a huge one overflows)."""
import os
import re
import runpy
import subprocess
import sys

import pytest
from django.core.cache import CacheHandler

from delayqueue.api.validation import PullMsgSerializer, SendMsgSerializer, first_error
from delayqueue.config.settings import SETTINGS, load_config
from tests.helpers import ROOT

# The tests here start manage.py or ./dev as a process, or run the settings module they start
# with; none needs a server.
pytestmark = pytest.mark.process


def manage_check(**env):
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)


def settings_module(monkeypatch, **env) -> dict:
    """project/settings.py, the code every process of the service (manage.py, uvicorn, ./dev run)
    runs first and where each of them reads and checks the environment, run afresh in this
    process with these variables: the settings it makes. A value it refuses raises the
    SystemExit that stops such a process with its message as the one line on stderr."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(ROOT / "project" / "settings.py"))


def refusal(monkeypatch, **env) -> str:
    """The one line project/settings.py stops a process with, for these variables."""
    with pytest.raises(SystemExit) as stopped:
        settings_module(monkeypatch, **env)
    return str(stopped.value)


# in_a_process: also as manage.py meets it, exit code 1 and that line alone on stderr (one of
# each kind; the others run the same module in this process).
@pytest.mark.parametrize("name, value, problem, in_a_process", [
    ("DELAYQUEUE_REDIS_TIMEOUT_MILLIS", "0", "must be at least 1, got 0", False),
    ("DELAYQUEUE_LOG_TIMEOUT_MILLIS", "0", "must be at least 1, got 0", False),
    ("DELAYQUEUE_MONITOR_INTERVAL_SECONDS", "0", "must be at least 1, got 0", True),
    ("DELAYQUEUE_SCANNER_BATCH", "-5", "must be at least 1, got -5", False),
    ("DELAYQUEUE_SCANNER_LOCK_TTL_MILLIS", "10", "must be at least 100, got 10", False),
    ("DELAYQUEUE_MAX_RETRY", "-1", "must be at least 0, got -1", False),
    ("DELAYQUEUE_LOG_RETENTION_DAYS", "-1", "must be at least 1, got -1", False),
    ("DELAYQUEUE_LOG_RETENTION_DAYS", "99999999999", "must be at most 36500, got 99999999999", False),
    ("DELAYQUEUE_TTL_MILLIS", "1h", "must be an integer, got '1h'", False),
    # A mistyped flag read as false would run the service without its message log.
    ("DELAYQUEUE_MESSAGE_LOG", "ture", "must be one of 1, true, yes, on or 0, false, no, off, got 'ture'", True),
    ("SECURE_SSL_REDIRECT", "yse", "must be one of 1, true, yes, on or 0, false, no, off, got 'yse'", False),
    ("LOG_LEVEL", "verbose", "must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'verbose'", True),
])
def test_a_setting_out_of_range_stops_the_service_with_one_line(name, value, problem, in_a_process, monkeypatch):
    assert refusal(monkeypatch, **{name: value}) == f"environment variable {name} {problem}"
    if in_a_process:
        refused = manage_check(**{name: value})
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.strip() == f"environment variable {name} {problem}"


def test_a_log_level_is_taken_in_any_case(monkeypatch):
    assert settings_module(monkeypatch, LOG_LEVEL=" debug")["LOGGING"]["root"]["level"] == "DEBUG"
    taken = manage_check(LOG_LEVEL="warning")
    assert taken.returncode == 0, taken.stderr


def test_settings_at_their_bounds_are_taken():
    taken = manage_check(DELAYQUEUE_MAX_RETRY="0", DELAYQUEUE_SCANNER_LOCK_TTL_MILLIS="100",
                         DELAYQUEUE_LOG_RETENTION_DAYS="36500", DELAYQUEUE_MONITOR_INTERVAL_SECONDS="1")
    assert taken.returncode == 0, taken.stderr


@pytest.mark.parametrize("name, value, problem, in_a_process", [
    ("REDIS_URL", "localhost:6379", "must be a redis://, rediss://, unix://, redis-cluster://", False),
    ("REDIS_URL", "redis+sentinel://127.0.0.1:26379", "must name the master's service after the sentinels", False),
    ("REDIS_URL", "redis+sentinel://:secret@127.0.0.1:26379/mymaster/queue", "names the database 'queue'", True),
    ("REDIS_URL", "redis://127.0.0.1:63790x/0", "has a port that is not a number", False),
    ("REDIS_URL", "redis-cluster://127.0.0.1:7000,127.0.0.1:x", "has a port that is not a number", False),
    ("REDIS_URL", "redis://127.0.0.1:6379/queue", "names the database 'queue': the path must be a database number", False),
    ("DATABASE_URL", "mysql://dq:secret@db/dq", "must be a postgres://", False),
    ("DATABASE_URL", "postgres://dq:secret@db:port/dq", "must be a postgres://", False),
])
def test_a_url_the_service_cannot_use_stops_it_with_one_line_that_hides_the_password(name, value, problem,
                                                                                     in_a_process, monkeypatch):
    line = refusal(monkeypatch, **{name: value})
    assert line.startswith(f"environment variable {name} {problem}") and "\n" not in line
    assert "secret" not in line
    if in_a_process:
        refused = manage_check(**{name: value})
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.strip() == line
        assert "secret" not in refused.stderr


def test_urls_of_every_supported_form_are_taken(monkeypatch):
    database_url = "postgresql://dq:pw@db.internal:5433/dq"
    forms = ("redis://u:p@127.0.0.1:6379/2", "rediss://127.0.0.1:6380", "unix:///run/redis.sock?db=1",
             "redis-cluster://127.0.0.1:7000,127.0.0.1:7001", "redis-cluster://:pw@127.0.0.1:7000,127.0.0.1:7001",
             "redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379/mymaster/1?sentinel_password=s")
    for redis_url in forms:
        made = settings_module(monkeypatch, REDIS_URL=redis_url, DATABASE_URL=database_url)
        assert (made["REDIS_URL"], made["DATABASE_URL"]) == (redis_url, database_url)
        CacheHandler(made["CACHES"])["default"]  # Django's cache built from them, as manage.py check builds it
    # And manage.py takes one as a whole: a cluster's (whose cache is per process). The plain form
    # is taken by every process the suite starts, the sentinel form by one in test_local_stack.
    taken = manage_check(REDIS_URL=forms[3], DATABASE_URL=database_url)
    assert taken.returncode == 0, (forms[3], taken.stderr)


@pytest.mark.parametrize("name, value, problem", [
    ("DELAYQUEUE_SCANNER_BATCH", "0", "must be at least 1, got 0"),
    ("PORT", "http", "must be an integer, got 'http'"),
    ("DELAYQUEUE_LOCAL_PG_PORT", "70000", "must be at most 65535, got 70000"),
    ("WEB_CONCURRENCY", "0", "must be at least 1, got 0"),
    ("DELAYQUEUE_ALLOWED_ORIGINS", "https://app.example.com/page", "must be comma-separated origins like "
     "https://app.example.com (scheme, host and optional port, no path)"),
])
def test_dev_run_refuses_a_bad_setting_before_starting_anything(name, value, problem):
    refused = subprocess.run([sys.executable, "-m", "tools.stack", "run"], cwd=ROOT,
                             env={**os.environ, name: value}, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"environment variable {name} {problem}"
    assert "[dev] started" not in refused.stdout  # no Redis, no PostgreSQL


DECLARED = list(SETTINGS.values())


def readme_default(value) -> str:
    if value == "":
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if isinstance(value, int) else f"`{value}`"


def test_the_readme_lists_every_declared_setting_with_its_default_and_nothing_else():
    section = (ROOT / "README.md").read_text().split("\n## Configuration\n", 1)[1]
    table = section.split("| queue setting | meaning |\n", 1)[1].split("\n\n", 1)[0]
    first_cells = [line.split(" | ")[0] for line in table.splitlines()[1:]]
    listed = re.findall(r"`([A-Z][A-Z0-9_]*)` \[([^\]]+)\]", "\n".join(first_cells))
    assert sorted(listed) == sorted((s.env, readme_default(s.default)) for s in DECLARED)


def test_the_readme_states_every_declared_bound():
    """A bound other than the usual minimum of 1 is written in the setting's row of the table or in
    the section's opening paragraph, which lists the exceptions to that rule."""
    section = (ROOT / "README.md").read_text().split("\n## Configuration\n", 1)[1]
    opening, table = section.split("| queue setting | meaning |\n", 1)
    unstated = []
    for declared in DECLARED:
        row = next(line for line in table.splitlines() if f"`{declared.env}` [" in line.split(" | ")[0])
        bounds = {declared.maximum} | ({declared.minimum} - {1})
        unstated += [f"{declared.env}: {bound}" for bound in bounds - {None}
                     if not re.search(rf"\b{bound}\b", row) and not (declared.env in opening and
                                                                   re.search(rf"\b{bound}\b", opening))]
    assert not unstated


@pytest.mark.parametrize("declared", [s for s in DECLARED if s.minimum is not None or s.maximum is not None],
                         ids=lambda s: s.env)
def test_every_declared_bound_is_enforced(declared, monkeypatch):
    for bound, outside, word in ((declared.minimum, -1, "least"), (declared.maximum, 1, "most")):
        if bound is None:
            continue
        monkeypatch.setenv(declared.env, str(bound))
        assert declared.read() == bound
        monkeypatch.setenv(declared.env, str(bound + outside))
        with pytest.raises(SystemExit) as refused:
            declared.read()
        assert str(refused.value) == f"environment variable {declared.env} must be at {word} {bound}, got {bound + outside}"


def test_the_spark_jobs_take_their_defaults_from_the_declarations(monkeypatch):
    from spark import common

    for declared in (SETTINGS["database_url"], SETTINGS["redis_url"], SETTINGS["namespace"],
                     SETTINGS["log_databases"], SETTINGS["namespace_databases"]):
        monkeypatch.delenv(declared.env, raising=False)
    _job, args = common.parse_args("spark.restore", [])
    assert (args.database_url, args.database_urls, args.redis_url, args.namespace) == (
        SETTINGS["database_url"].default, [SETTINGS["database_url"].default], SETTINGS["redis_url"].default,
        SETTINGS["namespace"].default)
    monkeypatch.setenv("DELAYQUEUE_NAMESPACE", "other")
    monkeypatch.setenv("DATABASE_URL", "mysql://dq:secret@db/dq")
    with pytest.raises(SystemExit) as refused:
        common.parse_args("spark.restore", [])
    assert str(refused.value).startswith("environment variable DATABASE_URL must be a postgres://")
    monkeypatch.delenv("DATABASE_URL")
    assert common.parse_args("spark.restore", [])[1].namespace == "other"
    # A namespace routed to a database of its own reads that one; the job over all namespaces, every one.
    monkeypatch.setenv("DELAYQUEUE_LOG_DATABASES", "tenants=postgres://dq:secret@tenants-db/dq")
    monkeypatch.setenv("DELAYQUEUE_NAMESPACE_DATABASES", "other=tenants")
    args = common.parse_args("spark.stats", [])[1]
    assert args.database_url == "postgres://dq:secret@tenants-db/dq"
    assert args.database_urls == [SETTINGS["database_url"].default, "postgres://dq:secret@tenants-db/dq"]
    monkeypatch.setenv("DELAYQUEUE_NAMESPACE_DATABASES", "other=elsewhere")
    with pytest.raises(SystemExit) as refused:
        common.parse_args("spark.stats", [])
    assert str(refused.value) == ("spark/stats.py: error: environment variable DELAYQUEUE_NAMESPACE_DATABASES names "
                                  "database elsewhere, which DELAYQUEUE_LOG_DATABASES does not declare")


def test_the_config_is_read_once_and_again_when_the_settings_change(settings):
    config = load_config()
    assert load_config() is config
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MAX_MSG_BYTES": 10}
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    changed = load_config()
    assert (changed.max_msg_bytes, changed.redis_url) == (10, "redis://127.0.0.1:1/0")
    assert load_config() is changed


def test_the_serializers_take_their_limits_from_the_config(settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MAX_MSG_BYTES": 4, "MAX_PULL_BATCH": 2}
    too_big = SendMsgSerializer(data={"topic": "t", "msg": "é" * 3, "delayMillis": 0})
    assert not too_big.is_valid() and first_error(too_big.errors) == "msg: is 6 bytes, over the limit of 4 bytes"
    assert SendMsgSerializer(data={"topic": "t", "msg": "abcd", "delayMillis": 0}).is_valid()
    too_many = PullMsgSerializer(data={"topic": "t", "batch": 3})
    assert not too_many.is_valid() and first_error(too_many.errors) == "batch: must be at most 2"


def test_the_migrations_describe_the_models_as_they_are():
    """A model changed without its migration (a field, an index, a table name from
    messagelog/tables.py) is found here, not by the next makemigrations."""
    ran = subprocess.run([sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr
