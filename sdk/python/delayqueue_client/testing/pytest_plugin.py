"""pytest fixtures on a FakeServer. Enable them in a conftest.py:

    pytest_plugins = ["delayqueue_client.testing.pytest_plugin"]

`delayqueue_fake`: a FakeServer on a clock that stands still; `delayqueue_client`: a Client on it
(closed after the test); `delayqueue_clock`: its clock (`delayqueue_clock.advance(30)`)."""
from collections.abc import Iterator

import pytest

from delayqueue_client.client import Client
from delayqueue_client.testing.clock import FakeClock
from delayqueue_client.testing.server import FakeServer


@pytest.fixture
def delayqueue_fake() -> FakeServer:
    return FakeServer()


@pytest.fixture
def delayqueue_client(delayqueue_fake: FakeServer) -> Iterator[Client]:
    with delayqueue_fake.client() as client:
        yield client


@pytest.fixture
def delayqueue_clock(delayqueue_fake: FakeServer) -> FakeClock:
    return delayqueue_fake.clock
