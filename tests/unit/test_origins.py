"""DELAYQUEUE_ALLOWED_ORIGINS' normalization and the edge's comparison of an Origin with the Host."""
import pytest

from delayqueue.api.edge import same_host
from delayqueue.config.settings import checked_origins


def test_origins_are_normalized_as_browsers_send_them():
    assert checked_origins("") == ""
    assert checked_origins(" HTTPS://App.Example.com/ , http://localhost:3000,,https://x.example:443") == \
        "https://app.example.com,http://localhost:3000,https://x.example"


@pytest.mark.parametrize("value", ["app.example.com", "https://app.example.com/page", "ftp://files.example",
                                   "https://user@app.example.com", "https://app.example.com?x=1", "https://",
                                   "https://app.example.com:port"])
def test_anything_but_an_origin_is_refused(value):
    with pytest.raises(ValueError, match="must be comma-separated origins like https://app.example.com"):
        checked_origins(value)


@pytest.mark.parametrize("origin, host, same", [
    ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
    ("https://Queue.Example.com", "queue.example.com", True),
    ("https://queue.example.com", "queue.example.com:443", True),
    ("http://queue.example.com", "queue.example.com:443", False),
    ("http://127.0.0.1:9999", "127.0.0.1:8000", False),
    ("http://evil.example", "127.0.0.1", False),
    ("null", "127.0.0.1", False),
])
def test_an_origin_is_the_same_host_only_with_the_same_host_and_port(origin, host, same):
    assert same_host(origin, host) is same
