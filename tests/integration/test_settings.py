"""Settings from the environment: a value the service cannot run with stops it at start with one
line naming the variable (README "Configuration"), before it misbehaves (a monitor interval of 0
divides by zero, a negative retention prunes every ended message, a huge one overflows)."""
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT


# Every test here starts manage.py or ./dev as a process; none needs a server.
pytestmark = pytest.mark.process


def manage_check(**env):
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name, value, problem", [
    ("DELAYQUEUE_REDIS_TIMEOUT_MILLIS", "0", "must be at least 1, got 0"),
    ("DELAYQUEUE_LOG_TIMEOUT_MILLIS", "0", "must be at least 1, got 0"),
    ("DELAYQUEUE_MONITOR_INTERVAL_SECONDS", "0", "must be at least 1, got 0"),
    ("DELAYQUEUE_SCANNER_BATCH", "-5", "must be at least 1, got -5"),
    ("DELAYQUEUE_SCANNER_LOCK_TTL_MILLIS", "10", "must be at least 100, got 10"),
    ("DELAYQUEUE_MAX_RETRY", "-1", "must be at least 0, got -1"),
    ("DELAYQUEUE_LOG_RETENTION_DAYS", "-1", "must be at least 1, got -1"),
    ("DELAYQUEUE_LOG_RETENTION_DAYS", "99999999999", "must be at most 36500, got 99999999999"),
    ("DELAYQUEUE_TTL_MILLIS", "1h", "must be an integer, got '1h'"),
])
def test_a_setting_out_of_range_stops_the_service_with_one_line(name, value, problem):
    refused = manage_check(**{name: value})
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.strip() == f"environment variable {name} {problem}"


def test_settings_at_their_bounds_are_taken():
    taken = manage_check(DELAYQUEUE_MAX_RETRY="0", DELAYQUEUE_SCANNER_LOCK_TTL_MILLIS="100",
                         DELAYQUEUE_LOG_RETENTION_DAYS="36500", DELAYQUEUE_MONITOR_INTERVAL_SECONDS="1")
    assert taken.returncode == 0, taken.stderr


@pytest.mark.parametrize("name, value, problem", [
    ("REDIS_URL", "localhost:6379", "must be a redis://, rediss://, unix:// or redis-cluster://"),
    ("REDIS_URL", "redis://127.0.0.1:63790x/0", "has a port that is not a number"),
    ("REDIS_URL", "redis-cluster://127.0.0.1:7000,127.0.0.1:x", "has a port that is not a number"),
    ("REDIS_URL", "redis://127.0.0.1:6379/queue", "names the database 'queue': the path must be a database number"),
    ("DATABASE_URL", "mysql://dq:secret@db/dq", "must be a postgres://"),
    ("DATABASE_URL", "postgres://dq:secret@db:port/dq", "must be a postgres://"),
])
def test_a_url_the_service_cannot_use_stops_it_with_one_line_that_hides_the_password(name, value, problem):
    refused = manage_check(**{name: value})
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.strip().startswith(f"environment variable {name} {problem}")
    assert "secret" not in refused.stderr


def test_urls_of_every_supported_form_are_taken():
    for redis_url in ("redis://u:p@127.0.0.1:6379/2", "rediss://127.0.0.1:6380", "unix:///run/redis.sock?db=1",
                      "redis-cluster://127.0.0.1:7000,127.0.0.1:7001"):
        taken = manage_check(REDIS_URL=redis_url, DATABASE_URL="postgresql://dq:pw@db.internal:5433/dq")
        assert taken.returncode == 0, (redis_url, taken.stderr)


def test_a_scanner_that_cannot_reach_redis_at_start_exits_with_one_line():
    refused = subprocess.run([sys.executable, "manage.py", "run_scanners"], cwd=ROOT,
                             env={**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0"},
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("CommandError: redis unavailable: ") and "127.0.0.1:1" in last


@pytest.mark.parametrize("name, value, problem", [
    ("DELAYQUEUE_SCANNER_BATCH", "0", "must be at least 1, got 0"),
    ("PORT", "http", "must be an integer, got 'http'"),
    ("DELAYQUEUE_LOCAL_PG_PORT", "70000", "must be at most 65535, got 70000"),
    ("WEB_CONCURRENCY", "0", "must be at least 1, got 0"),
])
def test_dev_run_refuses_a_bad_setting_before_starting_anything(name, value, problem):
    refused = subprocess.run([sys.executable, "-m", "tools.stack", "run"], cwd=ROOT,
                             env={**os.environ, name: value}, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"environment variable {name} {problem}"
    assert "[dev] started" not in refused.stdout  # no Redis, no PostgreSQL
