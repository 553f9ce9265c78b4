"""Loaded by pytest before Django's settings (`-p tests.environment` in pyproject.toml), which a
conftest would be too late for. The settings refuse to load without a SECRET_KEY (DEBUG is off):
./dev test sets one; a bare `pytest tests/unit` gets a random one here, and so do the processes
the tests start."""
import os
import secrets

os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
# The suite exercises the queue without tokens; tests/integration/test_tokens.py turns them on.
os.environ.setdefault("DELAYQUEUE_AUTH", "open")
