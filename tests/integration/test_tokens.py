"""API tokens: created, listed and revoked by the commands and the admin; stored only hashed;
checked on every queue endpoint by scope and namespace."""
import asyncio
import hashlib
import io
import os
import re
import secrets
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest
import redis
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command

from delayqueue.models import ApiToken, Message
from delayqueue.runtime import current
from delayqueue.stores.refreshed import REFRESH_SECONDS
from tests.helpers import REDIS_URL, ROOT, WebProcess, call, drain_log, scanner_env, wait_until
from tests.integration.test_http_edge import client_from
from tools.stack import free_port

TOKEN_RE = re.compile(r"dq_[A-Za-z0-9_-]{43}")


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_create_token_prints_the_token_alone_on_its_last_line_and_stores_only_its_hash():
    out = run("create_token", "--namespace", "shop", "--scopes", "consume,produce", "--name", "orders-app")
    token = out.splitlines()[-1]
    assert TOKEN_RE.fullmatch(token)
    row = ApiToken.objects.get(name="orders-app")
    assert (row.namespace, row.scopes) == ("shop", "produce,consume")
    assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in str(ApiToken.objects.values().get())  # the token itself is nowhere in the row


@pytest.mark.django_db
def test_create_token_generates_a_name_and_refuses_bad_input_in_one_line():
    first = run("create_token", "--namespace", "shop", "--scopes", "monitor").splitlines()[-1]
    assert ApiToken.objects.get().name.startswith("shop-")
    assert TOKEN_RE.fullmatch(first)
    run("create_token", "--namespace", "shop", "--scopes", "monitor", "--name", "dup")
    for args, problem in [(("--scopes", "produce,admin"), "unknown scope 'admin'"),
                          (("--scopes", "produce", "--name", "dup"), "a token named 'dup' already exists"),
                          (("--scopes", ","), "at least one scope"),
                          (("--scopes", "produce", "--namespace", "a:b"), "not a namespace")]:
        options = {"--namespace": "shop", **dict(zip(args[::2], args[1::2]))}
        with pytest.raises(CommandError, match=re.escape(problem)) as caught:
            run("create_token", *[x for kv in options.items() for x in kv])
        assert "\n" not in str(caught.value)
    assert ApiToken.objects.count() == 2
    # A name whose bytes are not UTF-8 (a lone surrogate in Python) is refused by the parser: PostgreSQL cannot take it.
    for args in (("create_token", "--namespace", "shop", "--scopes", "monitor", "--name", "bad\udcffbyte"),
                 ("revoke_token", "bad\udcffbyte")):
        with pytest.raises(CommandError, match="not UTF-8 text"):
            run(*args)


@pytest.mark.django_db
def test_list_tokens_shows_each_token_but_never_the_token_and_revoke_marks_it():
    token = run("create_token", "--namespace", "shop", "--scopes", "produce", "--name", "a").splitlines()[-1]
    run("create_token", "--namespace", "other", "--scopes", "manage,monitor", "--name", "b")
    assert run("revoke_token", "a") == "revoked token a (namespace shop)\n"
    listing = run("list_tokens").splitlines()
    assert listing[0].split() == ["NAME", "NAMESPACE", "SCOPES", "CREATED", "REVOKED"]
    a, b = (line.split() for line in listing[1:])
    assert a[:3] == ["a", "shop", "produce"] and a[-1] != "-"
    assert b[:3] == ["b", "other", "manage,monitor"] and b[-1] == "-"
    assert token not in "\n".join(listing)
    assert ApiToken.objects.get(name="a").token_hash not in "\n".join(listing)
    with pytest.raises(CommandError, match="no token named 'nope'"):
        run("revoke_token", "nope")


@pytest.mark.process
@pytest.mark.parametrize("command", [["create_token", "--namespace", "shop", "--scopes", "produce"],
                                     ["revoke_token", "a"], ["list_tokens"]])
def test_a_token_command_says_in_one_line_that_postgresql_is_unreachable(command):
    unreachable = f"postgres://postgres:secret@127.0.0.1:{free_port()}/delayqueue"  # nothing listens there
    ran = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "DATABASE_URL": unreachable})
    assert ran.returncode == 1 and ran.stdout == ""
    assert re.fullmatch(r"CommandError: tokens unavailable: connection failed: .*Connection refused\n", ran.stderr)
    assert "secret" not in ran.stderr


@pytest.mark.django_db
def test_the_admin_creates_a_token_shown_once_and_revokes_it(client):
    User.objects.create_superuser("boss", password="pw")
    client.force_login(User.objects.get())
    response = client.post("/admin/delayqueue/apitoken/add/",
                           {"name": "web", "namespace": "shop", "scopes": ["produce", "monitor"]})
    assert response.status_code == 200  # the token on the answer's own page, not after a redirect
    assert "no-store" in response["Cache-Control"]
    shown = TOKEN_RE.findall(response.content.decode())
    assert len(shown) == 1
    # Nowhere else: not in a cookie (Django's messages keep theirs in one), not in the session.
    assert not any(shown[0] in morsel.value for morsel in client.cookies.values())
    assert shown[0] not in str(dict(client.session))
    assert shown[0] not in client.get("/admin/").content.decode()  # no message left to show it again
    row = ApiToken.objects.get(name="web")
    assert (row.scopes, row.token_hash) == ("produce,monitor", hashlib.sha256(shown[0].encode()).hexdigest())
    listing = client.get("/admin/delayqueue/apitoken/").content.decode()
    assert "web" in listing and shown[0] not in listing
    detail = client.get(f"/admin/delayqueue/apitoken/{row.pk}/change/").content.decode()
    assert shown[0] not in detail
    refused = client.post("/admin/delayqueue/apitoken/add/", {"name": "x", "namespace": "a{b}", "scopes": ["produce"]})
    assert "not a namespace" in refused.content.decode()
    client.post("/admin/delayqueue/apitoken/", {"action": "revoke_selected", "_selected_action": [row.pk]})
    assert ApiToken.objects.get(name="web").revoked_at is not None


@pytest.mark.django_db
def test_revoking_tokens_in_the_admin_needs_the_change_permission(client):
    for name in ("a", "b"):
        new_token(name=name)
    selected = {"action": "revoke_selected", "_selected_action": list(ApiToken.objects.values_list("pk", flat=True))}
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_apitoken"))
    client.force_login(viewer)
    assert client.get("/admin/delayqueue/apitoken/").status_code == 200  # may look
    client.post("/admin/delayqueue/apitoken/", selected)
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()  # may not revoke
    changer = User.objects.create_user("changer", password="pw", is_staff=True)
    changer.user_permissions.add(*Permission.objects.filter(codename__in=["view_apitoken", "change_apitoken"]))
    client.force_login(changer)
    client.post("/admin/delayqueue/apitoken/", selected)
    assert ApiToken.objects.filter(revoked_at__isnull=False).count() == 2


# --- The queue API with DELAYQUEUE_AUTH=tokens

# Each endpoint, the scope it needs and a valid call's parameters (GET endpoints take a query).
ENDPOINTS = [
    ("delayQueue/sendMsg", "produce", "post", {"topic": "orders", "msg": "m", "delayMillis": "0", "msgId": "m1"}),
    ("delayQueue/sendMsgBatch", "produce", "json", [{"topic": "orders", "msg": "m", "delayMillis": 0}]),
    ("delayQueue/pullMsg", "consume", "post", {"topic": "orders"}),
    ("delayQueue/longPollingMsg", "consume", "post", {"topic": "orders", "longPollingTimeoutMillis": "1"}),
    ("delayQueue/ackMsg", "consume", "post", {"topic": "orders", "msgId": "m1"}),
    ("delayQueue/getMsg", "consume", "post", {"topic": "orders", "msgId": "m1"}),
    ("delayQueue/deleteMsg", "manage", "post", {"topic": "orders", "msgId": "m1"}),
    ("delayQueue/restore", "manage", "post", {}),
    ("delayQueue/restoreMsg", "manage", "post", {"topic": "orders", "msgId": "m1"}),
    ("delayQueue/ackMsgBatch", "consume", "json", {"topic": "orders", "msgIds": ["m1"]}),
    ("delayQueue/touchMsg", "consume", "post", {"topic": "orders", "msgId": "m1", "ackTimeoutMillis": "1000"}),
    ("delayQueue/rescheduleMsg", "manage", "post", {"topic": "orders", "msgId": "m1", "delayMillis": "0"}),
    # The whole host's: no tenant's token, whatever its scopes (test_host_operator_credential...).
    ("health/online", (), "get", {}),
    ("health/offline", (), "get", {}),
    ("delayQueue/getMonitorData", "monitor", "get", {}),
    ("delayQueue/getTopicInfo", "monitor", "get", {"topic": "orders"}),
    ("delayQueue/getTopicInfoList", "monitor", "get", {}),
    ("delayQueue/getTopicConfig", ("monitor", "manage"), "get", {"topic": "orders"}),
    ("delayQueue/setTopicConfig", "manage", "post", {"topic": "orders", "retryBackoffMillis": "0"}),
    ("delayQueue/pauseTopic", "manage", "post", {"topic": "orders"}),
    ("delayQueue/resumeTopic", "manage", "post", {"topic": "orders"}),
    ("delayQueue/purgeTopic", "manage", "post", {"topic": "orders"}),
    ("delayQueue/getDeadMsgList", ("monitor", "manage"), "get", {"topic": "orders"}),
    ("delayQueue/redriveDeadMsg", "manage", "json", {"topic": "orders", "msgIds": ["m1"]}),
    ("delayQueue/getRedriveTask", "manage", "get", {"taskId": "1"}),
    ("delayQueue/purgeDeadMsg", "manage", "json", {"topic": "orders", "msgIds": ["m1"]}),
]
SCOPES = ("produce", "consume", "manage", "monitor")


@pytest.fixture
def tokens_on(settings, clean_state):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "AUTH": "tokens"}


def new_token(namespace="shop", scopes=SCOPES, name=None) -> str:
    return run("create_token", "--namespace", namespace, "--scopes", ",".join(scopes),
               *(("--name", name) if name else ())).splitlines()[-1]


async def ask(api, endpoint, how, params, token=None, prefix=False) -> dict:
    """One call, its token as a Bearer header or as the /t/<token> path prefix; the envelope's body
    (health endpoints answer their code as the HTTP status too)."""
    path = (f"/t/{token}" if prefix else "") + "/camellia/" + endpoint
    headers = {"Authorization": f"Bearer {token}"} if token and not prefix else {}
    if how == "json":
        response = await api.post(path, json=params, headers=headers)
    elif how == "get":
        response = await api.get(path, params=params, headers=headers)
    else:
        response = await api.post(path, data=params, headers=headers)
    assert response.headers["content-type"].startswith("application/json")
    if not endpoint.startswith("health/"):
        assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.usefixtures("tokens_on")
async def test_every_endpoint_takes_exactly_its_scope_in_either_token_form(api):
    single = {scope: await sync_to_async(new_token)(scopes=[scope]) for scope in SCOPES}
    for endpoint, needed, how, params in ENDPOINTS:
        allowed = needed if isinstance(needed, tuple) else (needed,)  # a tuple: any one of them
        for scope, token in single.items():
            for prefix in (False, True):
                body = await ask(api, endpoint, how, params, token, prefix)
                if scope in allowed:
                    assert body["code"] not in (401, 403), (endpoint, scope, body)
                else:
                    assert body == {"code": 403, "msg": f"this API token lacks the {' or '.join(allowed)} scope"} or (
                        endpoint.startswith("health/") and body == {"code": 403}), (endpoint, scope, body)
                    assert token not in str(body)


@pytest.mark.usefixtures("tokens_on")
async def test_a_missing_bad_or_revoked_token_answers_401_and_health_checks_stay_open(api):
    for endpoint, _needed, how, params in ENDPOINTS:
        body = await ask(api, endpoint, how, params)
        assert body["code"] == 401, (endpoint, body)
    missing = await ask(api, "delayQueue/pullMsg", "post", {"topic": "orders"})
    assert missing["msg"].startswith("missing API token: send the header 'Authorization: Bearer <token>'")
    for bad in ("dq_nope", "Basic abc"):
        answer = await ask(api, "delayQueue/pullMsg", "post", {"topic": "orders"}, bad)
        assert answer == {"code": 401, "msg": "invalid or revoked API token"}
    prefixed = await ask(api, "delayQueue/pullMsg", "post", {"topic": "orders"}, "dq_nope", prefix=True)
    assert prefixed == {"code": 401, "msg": "invalid or revoked API token"}
    token = await sync_to_async(new_token)(name="soon-gone")
    assert (await ask(api, "delayQueue/pullMsg", "post", {"topic": "orders"}, token))["code"] == 200
    await sync_to_async(run)("revoke_token", "soon-gone")
    await asyncio.sleep(1.0)  # the promise: refused within 1 s
    assert (await ask(api, "delayQueue/pullMsg", "post", {"topic": "orders"}, token))["code"] == 401
    for open_endpoint in ("health/status", "health/check"):
        response = await api.get("/camellia/" + open_endpoint)
        assert (response.status_code, response.json()) == (200, {"code": 200})


@pytest.mark.usefixtures("tokens_on")
async def test_two_namespaces_do_not_see_each_others_messages(api, start_scanner):
    a = await sync_to_async(new_token)("ns-a")
    b = await sync_to_async(new_token)("ns-b")
    sent = await ask(api, "delayQueue/sendMsg", "post", {"topic": "orders", "msg": "for a", "delayMillis": "300",
                                                         "msgId": "x1"}, a)
    assert sent["code"] == 200
    for token, expected in ((a, 200), (b, 404)):
        got = await ask(api, "delayQueue/getMsg", "post", {"topic": "orders", "msgId": "x1"}, token)
        assert got["code"] == expected
    listed_b = await ask(api, "delayQueue/getTopicInfoList", "get", {}, b)
    assert listed_b["data"] == []
    # The message becomes ready through the scanner of its own namespace, and only a's consumer gets it.
    await start_scanner(current().for_namespace("ns-a"))
    await asyncio.sleep(0.5)
    pulled_b = await ask(api, "delayQueue/longPollingMsg", "post",
                         {"topic": "orders", "longPollingTimeoutMillis": "300"}, b)
    assert pulled_b["delayMsgList"] == []
    pulled_a = await ask(api, "delayQueue/longPollingMsg", "post",
                         {"topic": "orders", "longPollingTimeoutMillis": "3000"}, a)
    assert [m["msgId"] for m in pulled_a["delayMsgList"]] == ["x1"]
    logged = await sync_to_async(lambda: list(Message.objects.values_list("namespace", "msg_id")))()
    assert logged == [("ns-a", "x1")]


@pytest.mark.usefixtures("tokens_on")
async def test_a_tenant_reaches_nothing_of_another_namespace(api, start_scanner):
    """Every call that names a topic, msgId, schedule or task works in the token's namespace alone:
    another tenant's token with every scope neither reads nor changes a thing of ns-a's."""
    a = await sync_to_async(new_token)("ns-a")
    b = await sync_to_async(new_token)("ns-b")

    async def by(token, endpoint, how="post", **params):
        return await ask(api, f"delayQueue/{endpoint}", how, params, token)

    assert (await by(a, "setTopicConfig", topic="t", maxRetry=0, ackTimeoutMillis=200))["code"] == 200
    assert (await by(a, "sendMsg", topic="t", msg="a's", msgId="live", delayMillis=60_000))["code"] == 200
    assert (await by(a, "sendMsg", topic="t", msg="a's", msgId="dies", delayMillis=0))["code"] == 200
    assert (await by(a, "createSchedule", scheduleId="s1", topic="t", msg="tick", everyMillis=60_000,
                     paused="true"))["code"] == 200
    await start_scanner(current().for_namespace("ns-a"))
    pulled = await by(a, "pullMsg", topic="t")
    assert [m["msgId"] for m in pulled["delayMsgList"]] == ["dies"]
    await by(a, "ackMsg", topic="t", msgId="dies", ack="false", deadLetter="true")
    await drain_log(current().for_namespace("ns-a"), ["t"])
    dead = await by(a, "getDeadMsgList", "get", topic="t")
    assert [m["msgId"] for m in dead["delayMsgList"]] == ["dies"]
    task = await ask(api, "delayQueue/redriveDeadMsg", "json", {"topic": "t", "msgIds": ["nope"]}, a)
    assert task["code"] == 404

    # b's every call, on a's names.
    assert (await by(b, "getMsg", topic="t", msgId="live"))["code"] == 404
    assert (await by(b, "deleteMsg", topic="t", msgId="live"))["code"] == 404
    assert (await by(b, "rescheduleMsg", topic="t", msgId="live", delayMillis=0))["code"] == 404
    assert (await by(b, "touchMsg", topic="t", msgId="live", ackTimeoutMillis=1000))["code"] == 404
    assert (await by(b, "ackMsg", topic="t", msgId="live"))["done"] is False
    assert (await by(b, "restoreMsg", topic="t", msgId="live"))["code"] == 404
    assert (await by(b, "restore", topic="t"))["code"] == 404
    assert (await by(b, "getDeadMsgList", "get", topic="t"))["delayMsgList"] == []
    assert (await ask(api, "delayQueue/redriveDeadMsg", "json", {"topic": "t"}, b))["code"] == 404
    assert (await ask(api, "delayQueue/purgeDeadMsg", "json", {"topic": "t"}, b))["count"] == 0
    assert (await by(b, "getSchedule", scheduleId="s1"))["code"] == 404
    assert (await by(b, "listSchedules", "get"))["schedules"] == []
    for change in ("updateSchedule", "pauseSchedule", "resumeSchedule", "deleteSchedule"):
        assert (await by(b, change, scheduleId="s1", msg="b's"))["code"] == 404, change
    assert (await by(b, "getTopicConfig", topic="t"))["data"]["maxRetry"] != 0
    assert (await by(b, "getTopicInfo", topic="t"))["data"]["waitingQueueSize"] == 0
    assert (await by(b, "getTopicInfoList", "get"))["data"] == []
    assert all(not stats for stats in (await by(b, "getMonitorData", "get"))["data"].values())
    assert (await by(b, "pauseTopic", topic="t"))["code"] == 200
    assert (await by(b, "purgeTopic", topic="t"))["count"] == 0
    assert (await by(b, "setTopicConfig", topic="t", maxRetry=5))["code"] == 200
    assert (await by(b, "sendMsg", topic="t", msg="b's", msgId="live", delayMillis=0))["delayMsg"]["msg"] == "b's"

    # a's things are as a left them.
    got = await by(a, "getMsg", topic="t", msgId="live")
    assert (got["delayMsg"]["msg"], got["delayMsg"]["status"]) == ("a's", 1)
    assert (await by(a, "getTopicConfig", topic="t"))["data"]["maxRetry"] == 0
    assert (await by(a, "getTopicConfig", topic="t"))["data"]["paused"] is False
    assert [m["msgId"] for m in (await by(a, "getDeadMsgList", "get", topic="t"))["delayMsgList"]] == ["dies"]
    schedule = (await by(a, "getSchedule", scheduleId="s1"))["schedule"]
    assert (schedule["msg"], schedule["paused"]) == ("tick", True)


@pytest.mark.usefixtures("tokens_on")
async def test_a_resend_shows_another_messages_body_only_to_a_token_that_may_read_messages(api):
    """A produce-only token resending someone else's live msgId learns that the msgId is taken, not
    the message's body (getMsg is consume's); a consume token, or the sender of that very body, gets it."""
    owner = await sync_to_async(new_token)(scopes=["produce", "consume"])
    producer = await sync_to_async(new_token)(scopes=["produce"])
    send = {"topic": "orders", "msg": "card 4111 1111", "delayMillis": "60000", "msgId": "pay-1"}
    stored = (await ask(api, "delayQueue/sendMsg", "post", send, owner))["delayMsg"]
    for how, params in (("post", {**send, "msg": "guess"}), ("json", [{**send, "msg": "guess", "delayMillis": 0}])):
        answer = await ask(api, "delayQueue/" + ("sendMsg" if how == "post" else "sendMsgBatch"), how, params,
                           producer, prefix=True)
        delay_msg = answer["delayMsg"] if how == "post" else answer["results"][0]["delayMsg"]
        assert answer["code"] == 200 and delay_msg == {k: v for k, v in stored.items() if k != "msg"}
        assert "card" not in str(answer)
    same_body = await ask(api, "delayQueue/sendMsg", "post", send, producer)
    assert same_body["delayMsg"] == stored  # it sent that body: it knew it
    consumer_view = await ask(api, "delayQueue/sendMsg", "post", {**send, "msg": "other"}, owner)
    assert consumer_view["delayMsg"] == stored


@pytest.mark.usefixtures("tokens_on")
async def test_a_produce_token_cannot_erase_a_dead_letter_by_resending_its_msgid(api):
    admin = await sync_to_async(new_token)()
    producer = await sync_to_async(new_token)(scopes=["produce"])
    await ask(api, "delayQueue/sendMsg", "post", {"topic": "orders", "msg": "poison", "delayMillis": "0",
                                                  "msgId": "bad-1", "maxRetry": "0"}, admin)
    assert len((await ask(api, "delayQueue/pullMsg", "post", {"topic": "orders"}, admin))["delayMsgList"]) == 1
    dead = await ask(api, "delayQueue/ackMsg", "post", {"topic": "orders", "msgId": "bad-1", "ack": "false",
                                                         "deadLetter": "true"}, admin)
    assert dead["done"]
    await drain_log(current().for_namespace("shop"), ["orders"])
    for _ in range(2):  # once while Redis still holds the dead body, once after it is purged from Redis
        answer = await ask(api, "delayQueue/sendMsg", "post", {"topic": "orders", "msg": "harmless",
                                                               "delayMillis": "0", "msgId": "bad-1"}, producer)
        assert answer["code"] == 200 and answer["delayMsg"]["status"] == 6 and "msg" not in answer["delayMsg"]
        listed = await ask(api, "delayQueue/getDeadMsgList", "get", {"topic": "orders"}, admin)
        assert [(m["msgId"], m["msg"]) for m in listed["delayMsgList"]] == [("bad-1", "poison")]
        assert (await ask(api, "delayQueue/pullMsg", "post", {"topic": "orders"}, admin))["delayMsgList"] == []
        keys = current().for_namespace("shop").ns.topic("orders")
        with redis.Redis.from_url(REDIS_URL) as client:  # as purge_ended.lua does after the ended retention
            client.hdel(keys.msgs, "bad-1")
            client.zrem(keys.ended, "bad-1")


async def test_open_mode_needs_no_token_and_works_in_the_configured_namespace(api):
    body = await call(api, "sendMsg", topic="orders", msg="m", delayMillis="0", msgId="o1")
    assert body["code"] == 200
    logged = await sync_to_async(lambda: list(Message.objects.values_list("namespace", "msg_id")))()
    assert logged == [("default", "o1")]


def test_the_dashboard_warns_in_open_mode_only(admin_client, settings, clean_state):
    assert 'id="auth-open"' in admin_client.get("/admin/dashboard/").content.decode()
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "AUTH": "tokens"}
    assert 'id="auth-open"' not in admin_client.get("/admin/dashboard/").content.decode()


# --- Real uvicorn processes

@pytest.fixture
def two_web_processes(clean_state):
    """Two web processes with tokens required, the first with its access log on."""
    procs = [WebProcess(f"tokens{i}", dict(scanner_env(), REDIS_URL=REDIS_URL, DELAYQUEUE_AUTH="tokens"),
                        access_log=i == 0) for i in range(2)]
    try:
        for proc in procs:
            proc.wait_started()
        yield procs
    finally:
        for proc in procs:
            proc.stop()


@pytest.mark.process
def test_java_sdk_style_prefix_bearer_and_revocation_across_two_web_processes(two_web_processes):
    first, second = (proc.url for proc in two_web_processes)
    token = new_token(name="app")
    # camellia's Java SDK, configured with <url>/t/<token>, appends /camellia/delayQueue/<endpoint>
    # and sends a form body.
    sent = httpx.post(f"{first}/t/{token}/camellia/delayQueue/sendMsg",
                      data={"topic": "orders", "msg": "m", "delayMillis": "0", "msgId": "j1"}).json()
    assert sent["code"] == 200, sent
    pulled = httpx.post(f"{second}/camellia/delayQueue/pullMsg", data={"topic": "orders"},
                        headers={"Authorization": f"Bearer {token}"}).json()
    assert [m["msgId"] for m in pulled["delayMsgList"]] == ["j1"]
    run("revoke_token", "app")
    time.sleep(1.0)  # the promise: every web process refuses it within 1 s
    for url in (first, second):
        for prefix, headers in ((f"/t/{token}", {}), ("", {"Authorization": f"Bearer {token}"})):
            answer = httpx.post(f"{url}{prefix}/camellia/delayQueue/pullMsg", data={"topic": "t"},
                                headers=headers).json()
            assert answer == {"code": 401, "msg": "invalid or revoked API token"}
    logged = two_web_processes[0].output()
    assert "/camellia/delayQueue/sendMsg" in logged and "/camellia/delayQueue/pullMsg" in logged
    assert token not in logged and "/t/" not in logged


@pytest.mark.process
@pytest.mark.usefixtures("tokens_on")
async def test_run_scanners_runs_a_scanner_for_each_token_namespace_and_restore_takes_a_namespace(
        api, scanner_process):
    first = await sync_to_async(new_token)("ns-a")
    proc = scanner_process("multi")
    await asyncio.to_thread(proc.wait_started)
    later = await sync_to_async(new_token)("ns-late")  # picked up at the next check of the token table
    for token, msg_id in ((first, "a1"), (later, "l1")):
        sent = await ask(api, "delayQueue/sendMsg", "post",
                         {"topic": "orders", "msg": "m", "delayMillis": "200", "msgId": msg_id}, token)
        assert sent["code"] == 200
    # Nothing pulls them: made ready, each was promoted by its namespace's scanner.
    for token, msg_id in ((first, "a1"), (later, "l1")):
        async def ready(token=token, msg_id=msg_id):
            got = await ask(api, "delayQueue/getMsg", "post", {"topic": "orders", "msgId": msg_id}, token)
            return got["delayMsg"]["status"] == 2
        await wait_until(ready, timeout=15, interval=0.05, what=f"{msg_id} promoted")
    for token, msg_id in ((first, "a1"), (later, "l1")):
        pulled = await ask(api, "delayQueue/longPollingMsg", "post",
                           {"topic": "orders", "longPollingTimeoutMillis": "10000"}, token)
        assert [m["msgId"] for m in pulled["delayMsgList"]] == [msg_id]
    output = proc.output()
    for namespace in ("default", "ns-a", "ns-late"):
        assert f"started (namespace {namespace})" in output

    await ask(api, "delayQueue/sendMsg", "post",
              {"topic": "later", "msg": "m", "delayMillis": "600000", "msgId": "r1"}, first)
    redis.Redis.from_url(REDIS_URL).flushall()  # Redis loses its data
    assert (await ask(api, "delayQueue/getMsg", "post", {"topic": "later", "msgId": "r1"}, first))["code"] == 404
    out = await sync_to_async(run)("restore", "--namespace", "ns-a", "--topic", "later")
    assert out.startswith("restored 1,")
    got = await ask(api, "delayQueue/getMsg", "post", {"topic": "later", "msgId": "r1"}, first)
    assert (got["code"], got["delayMsg"]["status"]) == (200, 1)
    with pytest.raises(CommandError, match="not a namespace"):
        await sync_to_async(run)("restore", "--namespace", "a:b")


@pytest.mark.usefixtures("tokens_on")
async def test_concurrent_checks_of_one_token_share_one_query(api):
    token = await sync_to_async(new_token)()
    cache = current().tokens
    grants = await asyncio.gather(*(cache.grant(token) for _ in range(50)))
    assert grants[0].namespace == "shop"
    assert all(g is grants[0] for g in grants)  # one query answered them all: one Grant object
    await asyncio.sleep(0.6)
    assert await cache.grant(token) is not grants[0]  # an answer older than 0.5 s is asked again


@pytest.mark.fault
@pytest.mark.usefixtures("tokens_on")
async def test_postgres_down_a_known_token_keeps_its_answer_an_unknown_one_gets_500(api, postgres):
    known = await sync_to_async(new_token)()
    unknown = "dq_" + "x" * 43
    info = ("delayQueue/getTopicInfo", "get", {"topic": "orders"})  # Redis only: works without the log
    assert (await ask(api, *info, known))["code"] == 200
    postgres.stop()
    try:
        await asyncio.sleep(0.6)  # past the refresh time: the check asks PostgreSQL, which is down
        assert (await ask(api, *info, known))["code"] == 200
        refused = await ask(api, *info, unknown)
        assert refused == {"code": 500, "msg": "token check unavailable: the message log (PostgreSQL) does not answer"}
    finally:
        await asyncio.to_thread(postgres.start)
    await asyncio.sleep(0.6)
    assert (await ask(api, *info, unknown))["code"] == 401


@pytest.mark.process
def test_the_web_process_warns_at_start_in_open_mode_and_refuses_an_unknown_mode():
    def start(mode: str) -> subprocess.CompletedProcess:
        env = dict(scanner_env(), DELAYQUEUE_AUTH=mode)
        return subprocess.run([sys.executable, "-c", "import project.asgi"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)

    opened, tokens, unknown = start("open"), start("tokens"), start("Tokens")
    assert opened.returncode == 0 and "DELAYQUEUE_AUTH=open: the queue API takes no token" in opened.stderr
    assert tokens.returncode == 0 and "DELAYQUEUE_AUTH" not in tokens.stderr
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "environment variable DELAYQUEUE_AUTH must be tokens or open, got 'Tokens'"


# --- A flood of random tokens (issue 29, item 6)

FLOOD_WORKERS = 40  # concurrent connections from the flooding address
FLOOD_MOST = 3_000  # random tokens at most: a bound on a failing run, not the size of the flood
FLOOD_LIMIT = 50  # DELAYQUEUE_AUTH_FAILURE_LIMIT's default
VALID_ROUNDS = 10  # rounds of calls with valid tokens made while the flood goes on, once it is refused


@pytest.mark.process
async def test_a_flood_of_random_tokens_is_refused_per_address_while_valid_tokens_keep_answering(clean_state):
    """The flood lasts until the process refuses it (429) and valid tokens, one first used
    after the address went over its limit among them, have answered at least VALID_ROUNDS
    rounds, over two of the token cache's refresh times (the held token is asked of PostgreSQL
    again meanwhile): every valid call is made while random tokens keep coming. Its size is
    then what it takes, not a fixed count."""
    held = await sync_to_async(new_token)(scopes=["monitor"], name="held")
    web = WebProcess("flood", dict(scanner_env(), REDIS_URL=REDIS_URL, DELAYQUEUE_AUTH="tokens"))
    info = "/camellia/delayQueue/getTopicInfo?topic=orders"  # Redis only once the token passes
    flooding = httpx.AsyncClient(base_url=web.url, timeout=60, limits=httpx.Limits(max_connections=FLOOD_WORKERS),
                                 transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"))
    other = httpx.AsyncClient(base_url=web.url, timeout=60)  # from 127.0.0.1
    try:
        await asyncio.to_thread(web.wait_started)
        assert (await other.get(info, headers={"Authorization": f"Bearer {held}"})).json()["code"] == 200
        flood_answers, valid_answers = Counter(), []
        valid_done, flood_done = asyncio.Event(), asyncio.Event()

        def flooding_on() -> bool:
            refused_enough = valid_done.is_set() and flood_answers[429] >= FLOOD_WORKERS
            return not refused_enough and sum(flood_answers.values()) < FLOOD_MOST

        async def flood():
            while flooding_on():
                random_token = f"dq_{secrets.token_urlsafe(32)}"
                answer = (await flooding.get(info, headers={"Authorization": f"Bearer {random_token}"})).json()
                flood_answers[answer["code"]] += 1
                if answer["code"] == 429:
                    assert answer["retryAfterMillis"] > 0 and answer["msg"].startswith("too many invalid API tokens")

        async def use_valid_tokens():
            new, rounds, until = None, 0, None
            while rounds < VALID_ROUNDS or time.monotonic() < until:
                assert not flood_done.is_set(), "the flood ended before the valid tokens' rounds"
                if new is None and sum(flood_answers.values()) > FLOOD_LIMIT:
                    new = await sync_to_async(new_token)(scopes=["monitor"], name="first-used-in-the-flood")
                    until = time.monotonic() + 2 * REFRESH_SECONDS
                for client, token in ((other, held), (flooding, held), (other, new)):
                    if token is not None:
                        answer = (await client.get(info, headers={"Authorization": f"Bearer {token}"})).json()
                        valid_answers.append(answer["code"])
                rounds += new is not None
            valid_done.set()

        checking = asyncio.ensure_future(use_valid_tokens())
        try:
            await asyncio.gather(*(flood() for _ in range(FLOOD_WORKERS)))
        finally:
            flood_done.set()
        await checking
        assert set(flood_answers) == {401, 429}, flood_answers
        # Concurrent checks in flight when the count reached the limit may still have been asked.
        assert FLOOD_LIMIT <= flood_answers[401] < FLOOD_LIMIT + FLOOD_WORKERS, flood_answers
        assert len(valid_answers) >= 3 * VALID_ROUNDS and set(valid_answers) == {200}, Counter(valid_answers)
        # Another address is not refused for the flooding one.
        unknown = (await other.get(info, headers={"Authorization": "Bearer dq_nope"})).json()
        assert unknown == {"code": 401, "msg": "invalid or revoked API token"}
    finally:
        await flooding.aclose()
        await other.aclose()
        await asyncio.to_thread(web.stop)


INFO = ("delayQueue/getTopicInfo", "get", {"topic": "orders"})  # Redis only once the token passes


async def code_from(address: str, token: str) -> int:
    async with client_from(address) as client:
        return (await ask(client, *INFO, token))["code"]


@pytest.mark.usefixtures("tokens_on")
async def test_the_failed_token_limit_counts_an_ipv6_client_by_its_64_and_an_ipv4_one_by_its_address(api, settings):
    """A host picks its IPv6 addresses from its /64 at will: each address counted apart would give
    it 2^64 fresh starts."""
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "AUTH_FAILURE_LIMIT": 3}
    for address in ("2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:ffff:ffff:ffff:ffff"):
        assert await code_from(address, "dq_nope") == 401
    assert await code_from("2001:db8:1:2:abcd::9", "dq_nope") == 429
    assert await code_from("2001:db8:1:3::1", "dq_nope") == 401  # the next /64 is another client
    for address in ("192.0.2.1", "192.0.2.1", "192.0.2.2", "192.0.2.3"):
        assert await code_from(address, "dq_nope") == 401
    # An IPv4 client seen through a dual-stack socket is the same client.
    assert await code_from("::ffff:192.0.2.1", "dq_nope") == 401
    assert await code_from("::ffff:192.0.2.1", "dq_nope") == 429
    assert await code_from("192.0.2.1", "dq_nope") == 429


@pytest.mark.usefixtures("tokens_on")
async def test_the_failed_token_limit_counts_an_ipv6_address_carrying_an_ipv4_one_by_that(api, settings):
    """Behind NAT64 / SIIT every IPv4 client arrives in one /64 (64:ff9b::/96): counted by its /64,
    one client would lock them all out. A 6to4 /48 is one IPv4 host's."""
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "AUTH_FAILURE_LIMIT": 3}
    for address in ("64:ff9b::192.0.2.1", "64:ff9b::192.0.2.1", "64:ff9b::192.0.2.1"):
        assert await code_from(address, "dq_nope") == 401
    assert await code_from("64:ff9b::192.0.2.1", "dq_nope") == 429
    assert await code_from("192.0.2.1", "dq_nope") == 429  # the same client
    assert await code_from("64:ff9b::192.0.2.2", "dq_nope") == 401  # another one
    for address in ("2002:c000:203::1", "2002:c000:203:1::1", "2002:c000:203:2::1"):  # 6to4 of 192.0.2.3
        assert await code_from(address, "dq_nope") == 401
    assert await code_from("192.0.2.3", "dq_nope") == 429


@pytest.mark.usefixtures("tokens_on")
async def test_an_address_over_the_failure_limit_is_refused_for_a_revoked_token_the_process_holds(api, settings):
    """A revoked token is a failed check like an unknown one, whether or not this process happens to
    hold its row: past the limit both answer 429; only a token held as valid still works."""
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "AUTH_FAILURE_LIMIT": 3}
    valid = await sync_to_async(new_token)(name="valid")
    revoked = await sync_to_async(new_token)(name="soon-gone")
    for token in (valid, revoked):
        assert await code_from("192.0.2.9", token) == 200  # both held as valid now
    await sync_to_async(run)("revoke_token", "soon-gone")
    await asyncio.sleep(1.0)  # refused within 1 s: its row, revoked, is held
    for _ in range(3):
        assert await code_from("192.0.2.9", revoked) == 401
    assert await code_from("192.0.2.9", revoked) == 429
    assert await code_from("192.0.2.9", "dq_nope") == 429
    assert await code_from("192.0.2.9", valid) == 200
    assert await code_from("192.0.2.10", revoked) == 401


@pytest.mark.fault
@pytest.mark.usefixtures("tokens_on")
async def test_misses_never_evict_a_valid_grant(api, postgres, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "AUTH_FAILURE_LIMIT": 1_000_000}  # the cache alone, unthrottled
    token = await sync_to_async(new_token)()
    cache = current().tokens
    assert (await cache.grant(token)).namespace == "shop"
    for start in range(0, 12_000, 1_000):  # more unknown tokens than the cache holds answers
        assert not any(await asyncio.gather(*(cache.grant(f"dq_random-{start + i}") for i in range(1_000))))
    postgres.stop()
    try:
        await asyncio.sleep(0.6)  # past the refresh time: PostgreSQL is asked, and cannot answer
        held = await cache.grant(token)  # its grant was kept: its last answer stands
        assert (held.namespace, held.revoked) == ("shop", False)
    finally:
        await asyncio.to_thread(postgres.start)


# --- While PostgreSQL is down (issue 29, item 7)

@pytest.mark.fault
@pytest.mark.usefixtures("tokens_on")
async def test_postgres_down_a_held_grant_stands_only_within_the_trust_bound(api, postgres, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "TOKEN_TRUST_SECONDS": 5}
    token = await sync_to_async(new_token)()
    info = ("delayQueue/getTopicInfo", "get", {"topic": "orders"})  # Redis only: works without the log
    assert (await ask(api, *info, token))["code"] == 200  # confirmed by PostgreSQL now
    postgres.stop()
    try:
        await asyncio.sleep(0.6)  # past the refresh time: the check asks PostgreSQL, which is down
        assert (await ask(api, *info, token))["code"] == 200  # within the bound: its last answer stands

        async def refused():
            return await ask(api, *info, token) == {
                "code": 500, "msg": "token check unavailable: the message log (PostgreSQL) does not answer"}
        await wait_until(refused, timeout=30, interval=0.2, what="the grant refused past the trust bound")
    finally:
        await asyncio.to_thread(postgres.start)

    async def trusted_again():
        return (await ask(api, *info, token))["code"] == 200
    await wait_until(trusted_again, timeout=30, interval=0.2, what="the grant confirmed again")


# --- The host operator's credential (issue 29, item 3)

HOST_TOKEN = "host-" + "7" * 40


async def host_call(api, which: str, token: str | None = None) -> int:
    """health online/offline's code (its HTTP status too)."""
    response = await api.get(f"/camellia/health/{which}",
                             headers={"Authorization": f"Bearer {token}"} if token else {})
    assert response.json()["code"] == response.status_code
    return response.status_code


async def host_online(api) -> bool:
    return (await api.get("/camellia/health/status")).status_code == 200


@pytest.mark.usefixtures("tokens_on")
async def test_without_a_host_token_only_a_manage_token_of_the_hosts_namespace_takes_it_offline(api, settings):
    tenant = await sync_to_async(new_token)("shop", ["manage"])
    own = await sync_to_async(new_token)(settings.DELAYQUEUE["NAMESPACE"], ["manage"])
    own_monitor = await sync_to_async(new_token)(settings.DELAYQUEUE["NAMESPACE"], ["monitor"])
    for which in ("offline", "online"):
        assert await host_call(api, which, tenant) == 403
        assert await host_call(api, which, own_monitor) == 403
        assert await host_call(api, which) == 401
    assert await host_online(api)  # no tenant changed it
    assert await host_call(api, "offline", own) in (200, 500)  # 500: still serving (see the endpoint)
    assert not await host_online(api)
    assert await host_call(api, "online", own) == 200
    assert await host_online(api)


@pytest.mark.parametrize("mode", ["tokens", "open"])
async def test_with_a_host_token_it_alone_takes_the_host_offline_in_either_mode(api, settings, clean_state, mode):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "AUTH": mode, "HOST_TOKEN": HOST_TOKEN}
    own = await sync_to_async(new_token)(settings.DELAYQUEUE["NAMESPACE"], ["manage"])
    for which in ("offline", "online"):
        assert await host_call(api, which, own) == 403
        assert await host_call(api, which, HOST_TOKEN + "x") == 403
        assert await host_call(api, which) == 401
    assert await host_online(api)
    assert await host_call(api, "offline", HOST_TOKEN) in (200, 500)
    assert not await host_online(api)
    prefixed = await api.get(f"/t/{HOST_TOKEN}/camellia/health/online")  # as camellia's Java SDK sends it
    assert prefixed.status_code == 200 and await host_online(api)
