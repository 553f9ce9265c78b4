"""The browser-safe edge: the queue API checks the Host header and refuses requests that another
site's page made a browser send, unless DELAYQUEUE_ALLOWED_ORIGINS lists that site; /metrics and
the API docs take a bearer token when DELAYQUEUE_METRICS_TOKEN is set. In-process through the
project's ASGI application, and through a real uvicorn for the attacks a web page can make."""
import logging

import httpx
import pytest

from delayqueue.config.settings import load_config
from tests.helpers import API, call

APP = "https://app.example.com"
EVIL = "https://evil.example"
METRICS_TOKEN = "metrics-token-7f3a9c"


async def send_one(api, msg_id: str) -> None:
    sent = await call(api, "sendMsg", topic="edge", msg=f"secret body of {msg_id}", delayMillis=60_000, msgId=msg_id)
    assert sent["code"] == 200


async def still_stored(api, msg_id: str) -> bool:
    return (await call(api, "getMsg", topic="edge", msgId=msg_id))["delayMsg"]["status"] == 1


async def test_a_host_not_in_allowed_hosts_is_refused_and_an_allowed_one_served(api):
    await send_one(api, "m1")
    refused = await api.post(API + "getMsg", data={"topic": "edge", "msgId": "m1"}, headers={"Host": "attacker.example"})
    assert refused.status_code == 200
    assert refused.json() == {"code": 400, "msg": "Host 'attacker.example' is not allowed: it is not in ALLOWED_HOSTS"}
    for host in ("localhost", "localhost:8000", "127.0.0.1:8000"):
        served = await api.post(API + "getMsg", data={"topic": "edge", "msgId": "m1"}, headers={"Host": host})
        assert served.json()["code"] == 200, host


async def test_dns_rebinding_shape_cannot_read_a_message(api):
    """A page of attacker.example whose name now resolves to this host: to the browser it is same-origin."""
    await send_one(api, "m1")
    rebound = await api.get(API + "getMsg", params={"topic": "edge", "msgId": "m1"}, headers={
        "Host": "attacker.example:8000", "Origin": "http://attacker.example:8000", "Sec-Fetch-Site": "same-origin"})
    assert rebound.json()["code"] == 400
    assert "secret body" not in rebound.text


async def test_load_balancer_probes_are_served_whatever_the_host_but_online_and_offline_are_not(api):
    for path in ("status", "check"):
        probe = await api.get(f"/camellia/health/{path}", headers={"Host": "10.0.0.7:8000"})
        assert (probe.status_code, probe.json()) == (200, {"code": 200})
    offline = await api.post("/camellia/health/offline", headers={"Host": "attacker.example"})
    # As the other health answers: the code is the HTTP status, so no drain script reads it as done.
    assert offline.status_code == 400 and offline.json()["code"] == 400
    assert (await api.get("/camellia/health/status")).status_code == 200


@pytest.mark.parametrize("headers", [
    {},  # curl, the Java SDK
    {"Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-origin"},
    {"Origin": "http://127.0.0.1"},  # a browser that does not send Sec-Fetch-*
    {"Sec-Fetch-Site": "none"},  # typed into the address bar
], ids=["no-browser-headers", "same-origin", "same-origin-origin-only", "user-typed"])
async def test_same_origin_and_non_browser_requests_are_served(api, headers):
    sent = await api.post(API + "sendMsg", data={"topic": "edge", "msg": "hi", "delayMillis": 0}, headers=headers)
    assert sent.json()["code"] == 200
    assert "access-control-allow-origin" not in sent.headers


@pytest.mark.parametrize("headers, named", [
    ({"Origin": EVIL, "Sec-Fetch-Site": "cross-site"}, "origin 'https://evil.example'"),
    ({"Origin": EVIL}, "origin 'https://evil.example'"),  # no Sec-Fetch-*: the Origin alone tells
    ({"Origin": "http://127.0.0.1:9999", "Sec-Fetch-Site": "same-site"}, "origin 'http://127.0.0.1:9999'"),
    ({"Origin": "null", "Sec-Fetch-Site": "cross-site"}, "origin 'null'"),  # a sandboxed frame
    ({"Sec-Fetch-Site": "cross-site"}, "another site"),  # <img src=...deleteMsg?...>: no Origin on a GET
], ids=["cross-site", "origin-only", "same-site-other-port", "null-origin", "no-origin"])
async def test_cross_site_browser_requests_are_refused_naming_the_origin_and_the_setting(api, headers, named):
    await send_one(api, "m1")
    refused = await api.get(API + "deleteMsg", params={"topic": "edge", "msgId": "m1"}, headers=headers)
    assert refused.status_code == 200
    assert refused.json() == {"code": 403, "msg": f"cross-site browser request from {named} refused: list the "
                                                  "origin in DELAYQUEUE_ALLOWED_ORIGINS to allow it"}
    assert "access-control-allow-origin" not in refused.headers
    assert await still_stored(api, "m1")


async def test_an_allowed_origin_is_served_with_cors_headers_and_its_preflight_answered(api, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "ALLOWED_ORIGINS": f"{APP},http://localhost:3000"}
    browser = {"Origin": APP, "Sec-Fetch-Site": "cross-site"}
    preflight = await api.options(API + "sendMsgBatch", headers={
        **browser, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == APP
    assert preflight.headers["access-control-allow-methods"] == "GET, POST"
    assert preflight.headers["access-control-allow-headers"] == "Authorization, Content-Type"
    assert preflight.headers["vary"] == "Origin"

    sent = await api.post(API + "sendMsgBatch", json=[{"topic": "edge", "msg": "hi", "delayMillis": 0}], headers=browser)
    assert sent.json()["results"][0]["code"] == 200
    assert (sent.headers["access-control-allow-origin"], sent.headers["vary"]) == (APP, "Origin")
    # Error answers too, so the page can read why.
    bad = await api.post(API + "sendMsg", data={"topic": "edge"}, headers=browser)
    assert bad.json()["code"] == 400 and bad.headers["access-control-allow-origin"] == APP

    other = await api.post(API + "getTopicInfoList", headers={"Origin": "http://localhost:3000",
                                                              "Sec-Fetch-Site": "same-site"})
    assert other.json()["code"] == 200
    assert other.headers["access-control-allow-origin"] == "http://localhost:3000"


async def test_a_preflight_from_an_origin_not_allowed_is_refused(api, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "ALLOWED_ORIGINS": APP}
    preflight = await api.options(API + "deleteMsg", headers={
        "Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Access-Control-Request-Method": "POST"})
    assert preflight.json()["code"] == 403 and EVIL in preflight.json()["msg"]
    assert "access-control-allow-origin" not in preflight.headers
    # A lookalike of the allowed origin is another origin.
    lookalike = await api.post(API + "getTopicInfoList", headers={"Origin": APP + ".evil.example"})
    assert lookalike.json()["code"] == 403


DOCS_AND_METRICS = ["/metrics", "/api/schema/", "/api/docs/", "/api/redoc/"]


async def test_metrics_and_docs_are_open_while_no_token_is_set(api):
    for path in DOCS_AND_METRICS:
        assert (await api.get(path)).status_code == 200, path


async def test_metrics_and_docs_require_the_metrics_token_when_it_is_set(api, settings, caplog):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "METRICS_TOKEN": METRICS_TOKEN}
    caplog.set_level(logging.DEBUG)
    for path in DOCS_AND_METRICS:
        for authorization in (None, "Bearer wrong-token", f"Basic {METRICS_TOKEN}", f"Bearer {METRICS_TOKEN}x"):
            headers = {"Authorization": authorization} if authorization else {}
            refused = await api.get(path, headers=headers)
            assert refused.status_code == 401, (path, authorization)
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert METRICS_TOKEN not in refused.text
        served = await api.get(path, headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        assert served.status_code == 200, path
    assert (await api.get("/metrics", headers={"Authorization": f"bearer {METRICS_TOKEN}"})).status_code == 200
    assert METRICS_TOKEN not in caplog.text
    assert METRICS_TOKEN not in repr(load_config())


@pytest.fixture
def uvicorn_url(web_processes):
    """A real uvicorn serving the project, as ./dev run does, with one allowed origin."""
    # Written as an operator may write it (a trailing slash): normalized at start.
    [web] = web_processes(1, DELAYQUEUE_ALLOWED_ORIGINS=f"{APP}/")
    return web.url


@pytest.mark.process
def test_a_web_page_cannot_take_the_host_offline_or_delete_a_message(uvicorn_url):
    page = {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    with httpx.Client(base_url=uvicorn_url, timeout=30) as client:
        sent = client.post(API + "sendMsg", data={"topic": "edge", "msg": "keep me", "delayMillis": 60_000,
                                                  "msgId": "m1"}).json()
        assert sent["code"] == 200

        # fetch(url, {method: "POST", mode: "no-cors", body: "..."}): a text/plain POST needs no preflight.
        offline = client.post("/camellia/health/offline", content=b"x", headers={**page, "Content-Type": "text/plain"})
        assert offline.status_code == 403 and offline.json()["code"] == 403
        assert client.get("/camellia/health/status").status_code == 200  # still online

        # <form method=post action=.../deleteMsg> submitted by the page.
        deleted = client.post(API + "deleteMsg", data={"topic": "edge", "msgId": "m1"},
                              headers={**page, "Sec-Fetch-Mode": "navigate"})
        assert deleted.json()["code"] == 403
        stored = client.post(API + "getMsg", data={"topic": "edge", "msgId": "m1"}).json()
        assert stored["code"] == 200 and stored["delayMsg"]["status"] == 1

        # The origin the operator allowed (written with a trailing slash) is served, with CORS headers.
        allowed = client.post(API + "getMsg", data={"topic": "edge", "msgId": "m1"},
                              headers={"Origin": APP, "Sec-Fetch-Site": "cross-site"})
        assert allowed.json()["code"] == 200 and allowed.headers["access-control-allow-origin"] == APP
