"""The OpenAPI schema and its UI pages, which must work without the internet. Neither needs
Redis nor the database."""
import ast
import re
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest

from delayqueue.api.validation import JAVA_LONG_MIN, MIN_COUNT
from delayqueue.core import exceptions
from delayqueue.core.constants import MAX_DELAY_MILLIS, MAX_TOPIC_BYTES
from tests.helpers import ROOT

API_ENDPOINTS = ["sendMsg", "sendMsgBatch", "pullMsg", "longPollingMsg", "ackMsg", "getMsg", "deleteMsg",
                 "getMonitorData", "getTopicInfo", "getTopicInfoList", "restore", "restoreMsg", "ackMsgBatch",
                 "touchMsg", "rescheduleMsg"]


def test_openapi_schema_lists_every_endpoint_and_parameter(client):
    response = client.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    expected = {f"/camellia/delayQueue/{name}" for name in API_ENDPOINTS}
    expected |= {f"/camellia/health/{name}" for name in ("status", "check", "online", "offline")}
    assert expected <= set(paths)
    # One operation per endpoint (GET and POST both work; the description says so).
    assert {path: len(operations) for path, operations in paths.items()} == {path: 1 for path in paths}
    assert set(paths["/camellia/delayQueue/sendMsg"]) == {"post"}
    assert set(paths["/camellia/delayQueue/getTopicInfo"]) == {"get"}
    for path, operations in paths.items():
        [operation] = operations.values()
        assert operation["summary"] and len(operation["description"]) > 40, path
    assert "query string" in paths["/camellia/delayQueue/sendMsg"]["post"]["description"]
    assert schema["components"]["securitySchemes"]["apiToken"]["scheme"] == "bearer"
    send = paths["/camellia/delayQueue/sendMsg"]["post"]
    assert send["security"] == [{"apiToken": []}] and "`produce` scope" in send["description"]
    offline = paths["/camellia/health/offline"]["get"]
    assert offline["security"] == [{"apiToken": []}] and "the host token (DELAYQUEUE_HOST_TOKEN)" in offline["description"]
    assert paths["/camellia/health/status"]["get"]["security"] == []

    components = schema["components"]["schemas"]

    def resolve(ref):
        return components[ref.rsplit("/", 1)[1]]

    def form_fields(path):
        return resolve(paths[path]["post"]["requestBody"]["content"]["application/x-www-form-urlencoded"]["schema"]["$ref"])

    send_form = form_fields("/camellia/delayQueue/sendMsg")
    assert {"topic", "msgId", "msg", "delayMillis", "ttlMillis", "maxRetry", "triggerTime", "priority"} == set(
        send_form["properties"])
    assert {"topic", "msg"} == set(send_form["required"])  # and one of delayMillis, triggerTime
    assert {"topic", "batch", "ackTimeoutMillis", "longPollingTimeoutMillis"} == set(
        form_fields("/camellia/delayQueue/longPollingMsg")["properties"])
    query = {p["name"] for p in paths["/camellia/delayQueue/getTopicInfo"]["get"]["parameters"]}
    assert query == {"topic"}
    assert set(form_fields("/camellia/delayQueue/ackMsg")["properties"]) == {"topic", "msgId", "ack", "delayMillis",
                                                                             "deadLetter", "reason", "retry"}
    assert {"topic", "msgId", "ackTimeoutMillis"} == set(form_fields("/camellia/delayQueue/touchMsg")["required"])
    answer = paths["/camellia/delayQueue/getTopicInfo"]["get"]["responses"]["200"]["content"]["application/json"]
    assert [ref["$ref"].rsplit("/", 1)[1] for ref in resolve(answer["schema"]["$ref"])["oneOf"]] == [
        "TopicInfoResult", "Error"]
    assert set(paths["/camellia/health/status"]["get"]["responses"]) == {"200", "500"}


def test_openapi_schema_states_the_limits_validation_enforces(client, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MAX_BATCH_SEND": 7, "MAX_PULL_BATCH": 9, "MAX_MSG_BYTES": 99,
                           "SCHEDULE_MIN_INTERVAL_MILLIS": 5000}
    schema = client.get("/api/schema/", {"format": "json"}).json()
    components = schema["components"]["schemas"]
    # An error answer is code 4xx/5xx and msg, and retryAfterMillis when throttled, nothing else.
    assert components["Error"]["required"] == ["code", "msg"] and set(components["Error"]["properties"]) == {
        "code", "msg", "retryAfterMillis"}
    assert components["Error"]["additionalProperties"] is False
    assert components["SendMsgBatchItemAnswer"]["oneOf"][1]["$ref"].endswith("/Error")
    batch = schema["paths"]["/camellia/delayQueue/sendMsgBatch"]["post"]["requestBody"]["content"]
    assert set(batch) == {"application/json"}
    assert (batch["application/json"]["schema"]["minItems"], batch["application/json"]["schema"]["maxItems"]) == (1, 7)
    for request in ("AckMsgBatchRequest", "RedriveDeadMsgRequest", "PurgeDeadMsgRequest"):
        msg_ids = components[request]["properties"]["msgIds"]
        assert (msg_ids["minItems"], msg_ids["maxItems"]) == (1, 7), request
    send = components["SendMsgRequest"]["properties"]
    assert send["msg"]["minLength"] == 1 and send["msg"]["maxLength"] == 99
    for request in ("CreateScheduleRequest", "UpdateScheduleRequest"):  # each tick's body: a message's
        assert components[request]["properties"]["msg"]["maxLength"] == 99, request
        assert components[request]["properties"]["everyMillis"]["minimum"] == 5000, request
    msg_id = components["MessageRefRequest"]["properties"]["msgId"]
    assert msg_id["minLength"] == 1 and not re.search(msg_id["pattern"], " \t\u3000")  # spaces only: 400
    # On a send empty is an answer too (generate one), spaces only still 400.
    spaces, empty = send["msgId"]["oneOf"]
    assert spaces["pattern"] == msg_id["pattern"] and spaces["maxLength"] == 256 and "minLength" not in spaces
    assert empty == {"type": "string", "maxLength": 0}
    assert msg_id["not"] == spaces["not"] == {"pattern": "[\\x00-\\x1f\\x7f-\\x9f]"}  # control characters: 400
    assert send["msg"]["not"] == {"pattern": "\\x00"}  # DRF refuses NUL characters
    topic = send["topic"]  # as far as JSON Schema can: its lengths count characters, not bytes
    assert (topic["minLength"], topic["maxLength"]) == (1, MAX_TOPIC_BYTES) and "bytes" in topic["description"]
    assert "pattern" not in topic and all(re.search(topic["not"]["pattern"], c) for c in "\x00\n\x1f\x7f\x85\x9f")
    assert not re.search(topic["not"]["pattern"], " /{}*?[]\\%\xa0订单")
    assert (send["delayMillis"]["minimum"], send["delayMillis"]["maximum"]) == (JAVA_LONG_MIN, MAX_DELAY_MILLIS)
    assert "ms" in send["delayMillis"]["description"] and "bytes" in send["msg"]["description"]
    pull = components["PullMsgRequest"]["properties"]["batch"]
    assert pull["maximum"] == 9 and pull["minimum"] == MIN_COUNT


class Loads(HTMLParser):
    """What a page makes the browser fetch: src/href of script, link, img, iframe, source, embed."""

    FETCHING = {"script", "link", "img", "iframe", "source", "embed"}

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in self.FETCHING:
            self.urls += [value for name, value in attrs if name in ("src", "href") and value]


@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_api_docs_work_offline(client, page):
    """Everything the page loads comes from this server; the page's random text (a CSRF token)
    cannot fool the check, which reads the fetched URLs only."""
    parser = Loads()
    parser.feed(client.get(page).content.decode())
    assert parser.urls, "the page loads nothing"
    elsewhere = [url for url in parser.urls if urlsplit(url).scheme or urlsplit(url).netloc]
    assert not elsewhere, elsewhere
    assets = [url for url in parser.urls if url.endswith((".js", ".css"))]
    assert assets and all(a.startswith("/static/") for a in assets), assets
    for asset in assets:
        response = client.get(asset)
        assert response.status_code == 200, asset
        assert b"".join(response.streaming_content if response.streaming else [response.content])


def test_openapi_schema_says_a_nack_without_a_delay_waits_the_topics_backoff(client):
    """nack.lua applies the topic's retry backoff to a nack without delayMillis, as to an ack timeout
    (test_topic_config): the schema does not promise an immediate redelivery."""
    schema = client.get("/api/schema/", {"format": "json"}).json()
    ack_msg = schema["paths"]["/camellia/delayQueue/ackMsg"]["post"]
    components = schema["components"]["schemas"]
    ack = components[ack_msg["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]]
    texts = [ack_msg["description"], ack["properties"]["ack"]["description"],
             ack["properties"]["delayMillis"]["description"],
             components["SetTopicConfigRequest"]["properties"]["retryBackoffMillis"]["description"]]
    assert all("retry backoff" in text or "a nack without delayMillis" in text for text in texts), texts
    assert not any("immediate" in text for text in texts), texts


def refused_codes() -> set[int]:
    """The codes the source passes to Refused(msg, code) (401, 403, ... as literals)."""
    codes = set()
    for path in (ROOT / "delayqueue").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Refused" and node.args \
                    and isinstance(node.args[-1], ast.Constant):
                codes.add(node.args[-1].value)
    return codes


def test_every_error_code_is_listed_where_the_answers_are_described(client):
    """A code the API answers (a Conflict's 409 too) is in ANSWER_CODES, which the schema's Error, its
    description and the README's list of answer codes name, each and no other."""
    kinds, codes = [exceptions.QueueError], set()
    while kinds:
        kind = kinds.pop()
        kinds += kind.__subclasses__()
        codes.add(kind.code)
    codes |= refused_codes() | {exceptions.CapReached("x", setting="S", cap=1).code}
    assert codes == set(exceptions.ANSWER_CODES)
    schema = client.get("/api/schema/", {"format": "json"}).json()
    listed = re.compile(r"\b([1-5]\d\d) [a-z]")
    for where, text in (("Error.code", schema["components"]["schemas"]["Error"]["properties"]["code"]["description"]),
                        ("the description", schema["info"]["description"].split("otherwise", 1)[1])):
        assert set(map(int, listed.findall(text))) == codes, where
    readme = (ROOT / "README.md").read_text()
    paragraph = readme[readme.index("Every answer is HTTP 200"):readme.index("An error answer carries")]
    assert set(map(int, listed.findall(paragraph))) == {200} | codes


def test_the_readme_names_every_field_of_get_topic_info(client):
    """The README's row is where a caller looks first: a field it leaves out (the cold tier's counts) goes unseen."""
    schema = client.get("/api/schema/", {"format": "json"}).json()
    fields = set(schema["components"]["schemas"]["TopicInfo"]["properties"])
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `getTopicInfo` |"))
    assert fields - set(re.findall(r"`(\w+)`", row)) == set()
