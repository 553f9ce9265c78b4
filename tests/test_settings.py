"""Settings from the environment: a value the service cannot run with stops it at start with one
line naming the variable (README "Configuration"), before it misbehaves (a monitor interval of 0
divides by zero, a negative retention prunes every ended message, a huge one overflows)."""
import os
import subprocess
import sys

import pytest

from .conftest import ROOT


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
