"""The OpenAPI schema and its UI pages, which must work without the internet. Neither needs
Redis nor the database."""
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest

API_ENDPOINTS = ["sendMsg", "sendMsgBatch", "pullMsg", "longPollingMsg", "ackMsg", "getMsg", "deleteMsg",
                 "getMonitorData", "getTopicInfo", "getTopicInfoList", "restore", "restoreMsg"]


def test_openapi_schema_lists_every_endpoint_and_parameter(client):
    response = client.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    expected = {f"/camellia/delayQueue/{name}" for name in API_ENDPOINTS}
    expected |= {f"/camellia/health/{name}" for name in ("status", "check", "online", "offline")}
    assert expected <= set(paths)
    assert set(paths["/camellia/delayQueue/sendMsg"]) == {"get", "post"}

    def form_fields(path):
        body = paths[path]["post"]["requestBody"]["content"]
        ref = body["application/x-www-form-urlencoded"]["schema"]["$ref"].rsplit("/", 1)[1]
        return schema["components"]["schemas"][ref]

    send_form = form_fields("/camellia/delayQueue/sendMsg")
    assert {"topic", "msgId", "msg", "delayMillis", "ttlMillis", "maxRetry"} == set(send_form["properties"])
    assert {"topic", "msg", "delayMillis"} == set(send_form["required"])
    assert {"topic", "batch", "ackTimeoutMillis", "longPollingTimeoutMillis"} == set(
        form_fields("/camellia/delayQueue/longPollingMsg")["properties"])
    query = {p["name"] for p in paths["/camellia/delayQueue/getTopicInfo"]["get"]["parameters"]}
    assert query == {"topic"}
    assert {p["name"] for p in paths["/camellia/delayQueue/ackMsg"]["get"]["parameters"]} == {"topic", "msgId", "ack"}
    answer = paths["/camellia/delayQueue/getTopicInfo"]["get"]["responses"]["200"]["content"]["application/json"]
    assert answer["schema"]["$ref"].endswith("/TopicInfoResult")
    assert set(paths["/camellia/health/status"]["get"]["responses"]) == {"200", "500"}


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
