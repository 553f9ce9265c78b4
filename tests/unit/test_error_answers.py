"""Error answers say what failed, not where: the stores' own texts (hosts, ports, socket paths)
become fixed reasons for the caller and go to the log, once per failure."""
import logging

import psycopg
import pytest
from redis.exceptions import BusyLoadingError, ConnectionError, ResponseError, TimeoutError

from delayqueue.core import exceptions
from delayqueue.core.exceptions import LogUnreachable, RedisUnavailable, error_answer, redis_reason
from delayqueue.messagelog.connection import log_reason, log_unavailable

REDIS_FAILURES = [
    (ConnectionError("Error 111 connecting to 10.1.2.3:6379. Connect call failed ('10.1.2.3', 6379)."),
     "connection refused"),
    (ConnectionError("cannot connect to Redis: [Errno 113] Connect call failed ('10.1.2.3', 6379)"), "host unreachable"),
    (ConnectionError("Error -2 connecting to redis.internal:6379. Name or service not known."), "host name not found"),
    (ConnectionError("Error 2 connecting to /run/redis/redis.sock. No such file or directory."), "socket not found"),
    (ConnectionError("Connection closed by server."), "connection lost"),
    (ConnectionError("connection to Redis lost"), "connection lost"),
    (TimeoutError("Timeout reading from 10.1.2.3:6379"), "timed out"),
    (BusyLoadingError("Redis is loading the dataset in memory"), "Redis is loading its data"),
    (ResponseError("LOADING Redis is loading the dataset in memory"), "Redis is loading its data"),
    (ResponseError("MOVED 3999 10.1.2.3:6381"), "error reply MOVED"),
    (ResponseError("OOM command not allowed when used memory > 'maxmemory'."), "out of memory (maxmemory)"),
]


@pytest.mark.parametrize("exc, reason", REDIS_FAILURES, ids=[reason for _, reason in REDIS_FAILURES])
def test_redis_failures_answer_a_reason_naming_no_place(exc, reason):
    assert redis_reason(exc) == reason
    assert error_answer(exc, "test") == (500, f"redis unavailable: {reason}")


def test_message_log_failures_answer_a_reason_naming_no_place():
    refused = psycopg.OperationalError('connection failed: connection to server at "10.1.2.3", port 5432 failed: '
                                       "Connection refused\n\tIs the server running on that host?")
    assert log_reason(refused) == "connection refused"
    assert log_reason(psycopg.errors.QueryCanceled("canceling statement due to statement timeout")) == \
        "statement timed out"
    assert log_reason(psycopg.errors.AdminShutdown("terminating connection due to administrator command")) == \
        "server shutting down or starting"
    assert log_reason(psycopg.OperationalError('connection failed: connection to server at "10.1.2.3", port 5432 '
                                               "failed: FATAL:  the database system is starting up")) == \
        "server shutting down or starting"
    assert log_reason(psycopg.errors.DiskFull("could not extend file")) == "database error 53100 (DiskFull)"


@pytest.mark.parametrize("exc, retried", [
    (psycopg.OperationalError('connection failed: connection to server at "10.1.2.3", port 5432 failed: '
                              "Connection refused"), True),
    (psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly"), True),
    (psycopg.OperationalError('connection failed: connection to server at "10.1.2.3", port 5432 failed: FATAL:  the '
                              "database system is starting up"), True),
    (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),
    (psycopg.errors.CannotConnectNow("the database system is shutting down"), True),
    (psycopg.OperationalError('connection failed: connection to server at "10.1.2.3", port 5432 failed: FATAL:  '
                              'password authentication failed for user "dq"'), False),
    (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), False),
    (psycopg.errors.UniqueViolation("duplicate key value violates unique constraint"), False),
    (psycopg.errors.DiskFull("could not extend file"), False),
])
def test_only_a_log_that_cannot_be_reached_is_worth_a_retry(exc, retried):
    """A send's log write is retried for a while when PostgreSQL is restarting or out of reach,
    never when it refused the work (messagelog/group_commit.py)."""
    failure = log_unavailable(exc)
    assert isinstance(failure, LogUnreachable) is retried
    assert failure.code == 500 and str(failure).startswith("message log unavailable: ")


def test_the_log_has_the_place_once_per_failure(caplog, monkeypatch):
    monkeypatch.setattr(exceptions, "_logged", {})
    clock = [1000.0]
    monkeypatch.setattr(exceptions.time, "monotonic", lambda: clock[0])
    down = RedisUnavailable("redis unavailable: connection refused", detail="Error 111 connecting to 10.1.2.3:6379.")
    with caplog.at_level(logging.ERROR):
        for _ in range(50):
            assert error_answer(down, "SendMsgView") == (500, "redis unavailable: connection refused")
        clock[0] += exceptions.REPEAT_LOG_SECONDS
        error_answer(down, "SendMsgView")
    assert [r.getMessage() for r in caplog.records] == [
        "SendMsgView failed: redis unavailable: connection refused (Error 111 connecting to 10.1.2.3:6379.)",
        "SendMsgView failed: redis unavailable: connection refused (Error 111 connecting to 10.1.2.3:6379.) "
        "(and 49 more like it in the last 10 s)",
    ]
