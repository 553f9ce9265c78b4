"""A namespace's rows in a PostgreSQL of their own (DELAYQUEUE_NAMESPACE_DATABASES): ./dev test
starts a second PostgreSQL and routes namespace `routed` to it (tools/stack.py); every other
namespace stays in DATABASE_URL's. Sends, the history the scanners write, dead letters, topic
settings, restore and the admin each find a namespace's rows in its own database only."""
import asyncio
import io
import re
from datetime import timedelta

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import DatabaseError, connections
from django.utils import timezone

from delayqueue.core.constants import Status
from delayqueue.messagelog.retention import prune_log
from delayqueue.messagelog.routing import database_of
from delayqueue.models import Message
from delayqueue.ops.admin.topics import topic_url
from delayqueue.live.keys import Shard
from delayqueue.services.consume import long_poll_messages, nack_message, pull_messages
from delayqueue.services.dead_letters import dead_letters
from delayqueue.services.messages import get_message
from delayqueue.services.restore import restore
from delayqueue.services.send import SendRequest, send_message
from delayqueue.services.topic_control import set_topic_config
from delayqueue.stores.rows import create_token
from delayqueue.workers.loader import Loader
from delayqueue.workers.log_writer import LogWriter
from tests.helpers import EVERY_LOG_DATABASE, REDIS_URL, ScannerProcess, make_runtime, query, scanner_env, wait_until
from tests.integration.test_monitoring import sample as metric
from tests.integration.test_monitoring import scrape
from tests.integration.test_operator_ui import form_values

ROUTED, ALIAS = "routed", "second"
pytestmark = EVERY_LOG_DATABASE


@pytest.fixture
async def runtimes(clean_state):
    """The runtime of DELAYQUEUE_NAMESPACE (`default`) and of the routed namespace."""
    if database_of(ROUTED) != ALIAS:
        pytest.fail(f"namespace {ROUTED} is not routed to database {ALIAS}: run the suite with ./dev test, which "
                    "starts the second PostgreSQL and sets DELAYQUEUE_NAMESPACE_DATABASES")
    root = make_runtime(REDIS_URL)
    yield root, root.for_namespace(ROUTED)
    await root.close()


async def keys_in(database: str, table: str = "delayqueue_message", column: str = "msg_id") -> list[tuple]:
    return await query(f"SELECT namespace, {column} FROM {table} ORDER BY 1, 2", database=database)


async def test_each_namespace_writes_its_messages_history_and_settings_to_its_own_database(runtimes, start_scanner):
    root, routed = runtimes
    for rt, msg_id in ((root, "kept"), (routed, "moved")):
        await send_message(rt, request=SendRequest(topic="t", msg=msg_id, msg_id=msg_id, max_retry=0))
    assert await keys_in("default") == [("default", "kept")]
    assert await keys_in(ALIAS) == [(ROUTED, "moved")]

    # Its life after the send: the scanner's log writer records it in the namespace's database.
    await start_scanner(routed)
    [pulled] = await long_poll_messages(routed, topic="t", timeout_millis=5000)
    assert (await nack_message(routed, topic="t", msg_id=pulled.msg_id)).status == Status.EXHAUSTED

    async def routed_history():
        return await query("SELECT reason FROM delayqueue_messageevent WHERE msg_id = 'moved' ORDER BY at, id",
                           database=ALIAS)

    await wait_until(lambda: _ends_with(routed_history(), "retries_exhausted"), what="the routed history")
    assert [reason for (reason,) in await routed_history()] == ["sent", "pulled", "retries_exhausted"]
    assert await keys_in("default", "delayqueue_messageevent") == [("default", "kept")]  # its 'sent' row only
    [(status,)] = await query("SELECT status FROM delayqueue_message WHERE msg_id = 'moved'", database=ALIAS)
    assert status == Status.EXHAUSTED

    # Its dead letters are read there; the other namespace has none.
    page, _ = await dead_letters(routed, topic="t", limit=10, cursor=None)
    assert [d.message.msg_id for d in page] == ["moved"]
    assert (await dead_letters(root, topic="t", limit=10, cursor=None))[0] == []

    # Its topic settings too, and they are in force in its namespace.
    await set_topic_config(routed, topic="t", changes={"ttl_millis": 5_000}, limits={"produce_rate": 7})
    assert await keys_in(ALIAS, "delayqueue_topicconfig", "topic") == [(ROUTED, "t")]
    assert await keys_in(ALIAS, "delayqueue_limit", "topic") == [(ROUTED, "t")]
    assert await keys_in("default", "delayqueue_topicconfig", "topic") == []
    sent = await send_message(routed, request=SendRequest(topic="t", msg="x", delay_millis=60_000))
    assert sent.expire_time - sent.trigger_time == 5_000


async def _ends_with(rows, reason: str) -> bool:
    found = await rows
    return bool(found) and found[-1][0] == reason


@pytest.mark.parametrize("worker, warning", [(LogWriter, "log writer of namespace {}: events wait in Redis"),
                                             (Loader, "loader of namespace {}: cold messages wait in the message log")])
async def test_a_worker_whose_database_is_down_names_its_namespace(clean_state, caplog, worker, warning):
    """One process writes (and loads) every namespace's log; its warning says whose waits."""
    root = make_runtime(REDIS_URL, hot_window_millis=60_000)
    routed = root.for_namespace(ROUTED)
    try:
        await send_message(routed, request=SendRequest(topic="t", msg="x", delay_millis=0))
        await send_message(routed, request=SendRequest(topic="t", msg="cold", delay_millis=600_000))
        await pull_messages(routed, topic="t")
        running_worker, stopping = worker(routed, lambda: [Shard("t")]), asyncio.Event()
        second = connections[ALIAS]
        kept = dict(second.settings_dict)
        second.settings_dict.update(HOST="127.0.0.1", PORT=1)  # nothing listens there
        running = asyncio.ensure_future(running_worker.run(stopping))
        try:
            await wait_until(lambda: _warned(caplog, warning.format(ROUTED)), what="the worker's warning")
        finally:
            stopping.set()
            await running
            second.settings_dict.update(kept)
    finally:
        await root.close()


async def _warned(caplog, warning: str) -> bool:
    return warning in caplog.text


async def test_restore_brings_each_namespace_back_from_its_own_database(runtimes):
    root, routed = runtimes
    for rt, msg_id in ((root, "kept"), (routed, "moved")):
        await send_message(rt, request=SendRequest(topic="t", msg=msg_id, msg_id=msg_id, delay_millis=60_000))
    await root.redis.flushall()
    assert (await restore(routed)).restored == 1
    assert (await get_message(routed, topic="t", msg_id="moved")).status == Status.WAITING
    assert await get_message(root, topic="t", msg_id="kept") is None
    # The command line, for the other namespace.
    await asyncio.to_thread(call_command, "restore", "--namespace", "default", stdout=io.StringIO())
    assert (await get_message(root, topic="t", msg_id="kept")).status == Status.WAITING


def listed_ids(response) -> list[str]:
    return re.findall(r'<th class="field-msg_id"><a href="[^"]+">([^<]+)</a>', response.content.decode())


def saved_rows(status: Status, updated_at) -> dict[str, Message]:
    """A message row in each namespace, saved as the admin saves: routed by its namespace."""
    now = timezone.now()
    rows = {namespace: Message(
        namespace=namespace, topic="t", msg_id=f"of-{namespace}", payload="x", produce_time=now, trigger_time=now,
        expire_time=now + timedelta(hours=1), max_retry=3, status=status, updated_at=updated_at)
        for namespace in ("default", ROUTED)}
    for row in rows.values():
        row.save()
    return rows


def test_prune_log_prunes_every_database():
    saved_rows(Status.ACKED, timezone.now() - timedelta(days=30))
    assert prune_log(timedelta(days=7)) == (2, 0)
    assert not Message.objects.exists() and not Message.objects.using(ALIAS).exists()


def test_prune_log_prunes_the_databases_that_answer_when_one_does_not():
    saved_rows(Status.ACKED, timezone.now() - timedelta(days=30))
    first = connections["default"]
    first.close()
    kept = dict(first.settings_dict)
    first.settings_dict.update(HOST="127.0.0.1", PORT=1)  # nothing listens there
    try:
        with pytest.raises(DatabaseError):
            prune_log(timedelta(days=7))
    finally:
        first.close()
        first.settings_dict.update(kept)
    assert not Message.objects.using(ALIAS).exists() and Message.objects.exists()


def test_the_admin_reads_a_routed_namespace_in_its_database(admin_client):
    rows = saved_rows(Status.WAITING, timezone.now())
    assert rows[ROUTED]._state.db == ALIAS and rows["default"]._state.db == "default"
    listed = "/admin/delayqueue/message/"
    assert listed_ids(admin_client.get(listed)) == ["of-default"]
    assert listed_ids(admin_client.get(listed, {"namespace": ROUTED})) == [f"of-{ROUTED}"]
    page = admin_client.get(listed, {"namespace": ROUTED}).content.decode()
    link = re.search(r'<th class="field-msg_id"><a href="([^"]+)">', page)[1].replace("&amp;", "&")
    opened = admin_client.get(link)
    assert opened.status_code == 200 and f"of-{ROUTED}" in opened.content.decode()


def test_the_dashboard_and_topic_page_say_a_routed_namespace_database_is_down(admin_client, clean_state):
    second = connections[ALIAS]
    second.close()
    kept = dict(second.settings_dict)
    second.settings_dict.update(HOST="127.0.0.1", PORT=1)  # nothing listens there: the ORM's and the log's connections
    try:
        dashboard = admin_client.get("/admin/dashboard/", {"namespace": ROUTED})
        assert dashboard.status_code == 200
        assert "hourly stats not read: message log unavailable: connection refused" in dashboard.content.decode()
        page = admin_client.get(topic_url("topic", ROUTED, "t"))
        # No form of defaults to save over the topic's own settings.
        assert page.status_code == 200 and 'id="settings"' not in page.content.decode()
        assert "Settings not read: message log unavailable: connection refused" in page.content.decode()
        saved = admin_client.post(topic_url("topic", ROUTED, "t"), form_values(namespace=ROUTED, topic="t"))
        assert saved.status_code == 200 and "Not saved: message log unavailable" in saved.content.decode()
        for url, said in (("/admin/delayqueue/message/", "Messages not read"),
                          ("/admin/delayqueue/topicconfig/redrive/1/", "Redrive task 1 not read")):
            listed = admin_client.get(url, {"namespace": ROUTED}, follow=True)
            assert listed.status_code == 200 and f"{said}: message log unavailable: connection refused" in \
                listed.content.decode(), url
    finally:
        second.close()
        second.settings_dict.update(kept)


async def test_metrics_leave_out_only_the_dead_letters_of_a_database_that_does_not_answer(runtimes, api, caplog):
    """/metrics counts each database's dead letters apart: the routed namespace's database down
    leaves out its namespaces' series, not every namespace's."""
    root, routed = runtimes
    await sync_to_async(create_token)(namespace=ROUTED, scopes=["produce"])  # served
    for rt in (root, routed):
        await send_message(rt, request=SendRequest(topic="t", msg="x"))
    second = connections[ALIAS].settings_dict  # every thread's connections are made from it
    kept = second["HOST"], second["PORT"]
    second.update(HOST="127.0.0.1", PORT=1)  # nothing listens there
    try:
        samples = await scrape(api)
    finally:
        second["HOST"], second["PORT"] = kept
    assert metric(samples, "delayqueue_dead_letters", topic="t") == 0
    assert metric(samples, "delayqueue_dead_letters", ROUTED, topic="t") is None
    assert metric(samples, "delayqueue_queue_size", ROUTED, topic="t", queue="ready") == 1
    assert "connection refused" in caplog.text


@pytest.mark.process
async def test_a_routed_namespace_token_sends_and_consumes_through_the_web_and_scanner_processes(web_processes):
    """The processes as deployed (uvicorn, run_scanners) route from their environment alone: a token
    of the routed namespace (kept in the default database) sends, a long poll takes the message the
    scanner promoted, the ack ends it, and its whole history lands in the second database."""
    _row, token = await sync_to_async(create_token)(namespace=ROUTED, scopes=["produce", "consume"])
    [web] = web_processes(1, DELAYQUEUE_AUTH="tokens")
    scanner = ScannerProcess("routing", scanner_env(DELAYQUEUE_AUTH="tokens"))
    try:
        scanner.wait_started()
        async with httpx.AsyncClient(base_url=web.url + "/camellia/delayQueue/", timeout=30,
                                     headers={"Authorization": f"Bearer {token}"}) as http:
            sent = (await http.post("sendMsg", data={"topic": "p", "msg": "hi", "delayMillis": 300})).json()
            assert sent["code"] == 200, sent
            polled = (await http.post("longPollingMsg", data={"topic": "p", "timeoutMillis": 10_000})).json()
            [message] = polled["delayMsgList"]
            assert message["msgId"] == sent["delayMsg"]["msgId"]
            assert (await http.post("ackMsg", data={"topic": "p", "msgId": message["msgId"], "ack": "true"})
                    ).json()["code"] == 200

        async def reasons():
            return [r for (r,) in await query("SELECT reason FROM delayqueue_messageevent ORDER BY at, id",
                                              database=ALIAS)]

        await wait_until(lambda: _has_all(reasons(), ["sent", "due", "pulled", "acked"]), what="the routed history")
        assert await keys_in(ALIAS) == [(ROUTED, message["msgId"])]
        assert await keys_in("default") == [] and await keys_in("default", "delayqueue_messageevent") == []
    finally:
        scanner.stop()


async def _has_all(rows, wanted: list[str]) -> bool:
    return await rows == wanted
