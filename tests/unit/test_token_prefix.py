"""The /t/<token>/ path prefix: taken off before the queue API's paths only, and never left in the
path (uvicorn's access log and Django's request log read the path)."""
import pytest

from delayqueue.api.asgi import strip_token_prefix


@pytest.mark.parametrize("path, stripped, token", [
    ("/t/dq_abc/camellia/delayQueue/sendMsg", "/camellia/delayQueue/sendMsg", "dq_abc"),
    ("/t/dq_abc/metrics", "/t/-/metrics", None),
    ("/t/dq_abc/admin/login/", "/t/-/admin/login/", None),
    ("/t/dq_abc/camelliax", "/t/-/camelliax", None),
    ("/t/dq_abc", "/t/-/", None),
    ("/t/", "/t/-/", None),
])
def test_the_token_leaves_the_path_and_only_the_queue_api_is_reached(path, stripped, token):
    scope = {"path": path, "raw_path": path.encode()}
    strip_token_prefix(scope)
    assert (scope["path"], scope["raw_path"], scope.get("delayqueue.token")) == (stripped, stripped.encode(), token)
