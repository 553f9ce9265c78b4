"""Loaded as a pytest plugin (pyproject's addopts), so it runs before pytest-django loads the
settings, which a conftest would be too late for: the suite exercises the queue without tokens
(DELAYQUEUE_AUTH=open); tests/integration/test_tokens.py turns them on."""
import os

os.environ.setdefault("DELAYQUEUE_AUTH", "open")
