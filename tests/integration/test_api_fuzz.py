"""Schema-driven fuzzing: requests generated from /api/schema/ against a real uvicorn server on
the test Redis and PostgreSQL. Every answer must match the schema (status, content type, body)
none may be a server error, neither HTTP 5xx nor code 500 in the envelope, and none may refuse
as bad input (code 400) a request the schema allows.

Not fuzzed: /camellia/health/online and /offline. They flip this host's online state for every
process and every later test, and offline answers HTTP 500 by design while the host serves."""
import asyncio
import socket
import threading

import hypothesis
import pytest
import requests
import schemathesis
import uvicorn
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

from delayqueue.runtime import close_current

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES_PER_OPERATION = 25
# Operations without parameters have a single possible request.
PARAMETERLESS = {"/camellia/delayQueue/getMonitorData", "/camellia/delayQueue/getTopicInfoList",
                 "/camellia/health/status", "/camellia/health/check"}

OPERATIONS = [
    ("/camellia/delayQueue/sendMsg", "POST"),
    ("/camellia/delayQueue/sendMsgBatch", "POST"),
    ("/camellia/delayQueue/pullMsg", "POST"),
    ("/camellia/delayQueue/longPollingMsg", "POST"),
    ("/camellia/delayQueue/ackMsg", "POST"),
    ("/camellia/delayQueue/getMsg", "POST"),
    ("/camellia/delayQueue/deleteMsg", "POST"),
    ("/camellia/delayQueue/getMonitorData", "GET"),
    ("/camellia/delayQueue/getTopicInfo", "GET"),
    ("/camellia/delayQueue/getTopicInfoList", "GET"),
    ("/camellia/delayQueue/restore", "POST"),
    ("/camellia/delayQueue/restoreMsg", "POST"),
    ("/camellia/delayQueue/getDeadMsgList", "GET"),
    ("/camellia/delayQueue/redriveDeadMsg", "POST"),
    ("/camellia/delayQueue/getRedriveTask", "GET"),
    ("/camellia/delayQueue/purgeDeadMsg", "POST"),
    ("/camellia/delayQueue/ackMsgBatch", "POST"),
    ("/camellia/delayQueue/touchMsg", "POST"),
    ("/camellia/delayQueue/rescheduleMsg", "POST"),
    ("/camellia/health/status", "GET"),
    ("/camellia/health/check", "GET"),
]


@pytest.fixture
def server(settings, clean_state):
    """uvicorn serving project.asgi on a free 127.0.0.1 port, in a thread of this process so it
    sees the test database and settings. Long polls are capped short: a generated timeout must
    not hold the fuzz for the default 60 s."""
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MAX_LONG_POLLING_TIMEOUT_MILLIS": 50}
    from project.asgi import application

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(application, lifespan="off", log_level="warning"))

    async def serve():
        try:
            await server.serve(sockets=[sock])
        finally:
            await close_current()  # the runtime this loop built: its Redis and PostgreSQL connections

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        schema = schemathesis.openapi.from_url(f"{base}/api/schema/?format=json", wait_for_schema=10)
        yield base, schema
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def _unstated_rule(case, answer) -> bool:
    """A refusal under a rule JSON Schema cannot state (the descriptions do): ackMsgBatch's retries,
    one per msgId; and a parameter given twice, which is how a form body carries a list or an
    object (one field per item or key)."""
    body = case.body if isinstance(case.body, dict) else {}
    retries, msg_ids = body.get("retries"), body.get("msgIds")
    if answer["msg"].endswith("given more than once in the request body"):
        return case.media_type == "application/x-www-form-urlencoded" and any(
            isinstance(value, (list, dict)) and len(value) > 1 for value in body.values())
    return (isinstance(retries, list) and isinstance(msg_ids, list) and len(retries) != len(msg_ids)
            and answer["msg"].startswith("retries: has "))


@pytest.mark.parametrize("path,method", OPERATIONS, ids=[path.rsplit("/", 1)[1] for path, _ in OPERATIONS])
def test_every_answer_matches_the_schema(server, path, method):
    base, schema = server
    operation = schema[path][method]
    session = requests.Session()
    seen = []

    @hypothesis.given(case=operation.as_strategy())
    @hypothesis.settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck), phases=[hypothesis.Phase.generate])
    def run(case):
        response = case.call_and_validate(base_url=base, session=session, checks=CHECKS)
        body = response.json()
        assert body["code"] != 500, (case.as_curl_command(), body)
        # The schema states what validation accepts: a request it allows is not refused as bad input.
        # (ackMsgBatch's results carry no code of their own.)
        refused = [answer for answer in [body, *body.get("results", [])] if answer.get("code") == 400
                   and not _unstated_rule(case, answer)]
        assert not refused, (case.as_curl_command(), refused)
        seen.append(body["code"])

    run()
    assert len(seen) >= (1 if path in PARAMETERLESS else 10), seen  # the bounded run did exercise it
