"""Loaded by pytest before Django's settings (`-p tests.environment` in pyproject.toml), which a
conftest would be too late for. The settings refuse to load without a SECRET_KEY (DEBUG is off):
./dev test sets one; a bare `pytest tests/unit` gets a random one here, and so do the processes
the tests start.

./dev test starts a Redis, a Redis Cluster and two PostgreSQLs (the second: the routed namespace's
log) for each pytest-xdist worker and lists them in DELAYQUEUE_TEST_SERVERS: each worker (PYTEST_XDIST_WORKER; a run without workers
is gw0) puts its own URLs in its environment here, where Django's settings, the tests and the
processes they start (scanners, uvicorn, spark-submit, the SDK's command line) all find them."""
import json
import os
import secrets

os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
# The suite exercises the queue without tokens; tests/integration/test_tokens.py turns them on.
os.environ.setdefault("DELAYQUEUE_AUTH", "open")

if os.environ.get("DELAYQUEUE_TEST_SERVERS"):
    _worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    _servers = json.loads(os.environ["DELAYQUEUE_TEST_SERVERS"])
    if _worker not in _servers:
        raise RuntimeError(f"./dev test started no servers for pytest-xdist worker {_worker}, only for "
                           f"{', '.join(_servers)}: pass -n to ./dev test, which starts a set per worker")
    os.environ.update(_servers[_worker])
