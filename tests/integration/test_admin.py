"""The admin over the message log: login, list, search, filters, detail with history and live
state, and the actions going through the queue's service layer."""
import re
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
import redis
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from delayqueue.core.constants import Status
from delayqueue.messagelog.selectors import EXACT_COUNT_LIMIT, estimated_count
from delayqueue.models import Message
from delayqueue.runtime import run_with_runtime
from delayqueue.services.consume import nack_message, pull_messages
from delayqueue.services.messages import get_message
from delayqueue.services.topics import topic_info
from delayqueue.stores import rows
from tests.helpers import REDIS_URL, drain_history, log_database_url, send

# Every page reads the log and the live state; actions go through the queue.
pytestmark = pytest.mark.usefixtures("clean_state")

LIST = "/admin/delayqueue/message/"
NOW = datetime.now(timezone.utc).replace(microsecond=0)


def log_message(topic="orders", msg_id="m1", status=Status.WAITING, produced=NOW, delay=timedelta(minutes=5),
                namespace="default", **fields) -> Message:
    return Message.objects.create(
        namespace=namespace, topic=topic, msg_id=msg_id, payload=fields.pop("payload", f"body of {msg_id}"),
        produce_time=produced, trigger_time=produced + delay, expire_time=produced + delay + timedelta(hours=1),
        max_retry=fields.pop("max_retry", 3), retry=fields.pop("retry", 0), status=status,
        updated_at=produced, **fields,
    )


def listed_ids(response) -> list[str]:
    return re.findall(r'<th class="field-msg_id"><a href="[^"]+">([^<]+)</a>', response.content.decode())


def test_a_staff_session_is_kept_in_the_redis_cache_and_outlives_its_loss(client):
    User.objects.create_superuser("boss", password="pw")
    assert client.post("/admin/login/", {"username": "boss", "password": "pw"}).status_code == 302
    session_key = client.cookies["sessionid"].value
    cached = redis.Redis.from_url(REDIS_URL)
    try:
        assert any(session_key in key.decode() for key in cached.keys("dqcache:*"))
        cached.flushall()  # the cache is lost: the session is still in the database
        assert client.get(LIST).status_code == 200
        assert any(session_key in key.decode() for key in cached.keys("dqcache:*"))  # and cached again
    finally:
        cached.close()


def test_the_admin_works_while_the_cache_is_unreachable(client, settings):
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    User.objects.create_superuser("boss", password="pw")
    assert client.post("/admin/login/", {"username": "boss", "password": "pw"}).status_code == 302
    assert client.get(LIST).status_code == 200


@pytest.mark.parametrize("path", [
    LIST, LIST + "1/change/", LIST + "1/history/", "/admin/", "/admin/delayqueue/", "/admin/dashboard/",
    "/admin/dashboard/?topic=orders",
])
def test_every_page_needs_a_staff_login(client, path):
    log_message()
    anonymous = client.get(path)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/")
    User.objects.create_user("clerk", password="pw", is_staff=False)
    client.login(username="clerk", password="pw")
    not_staff = client.get(path)
    assert not_staff.status_code == 302 and not_staff["Location"].startswith("/admin/login/")
    assert b"body of m1" not in not_staff.content


def test_actions_need_a_staff_login(client):
    send("orders", "keep", 60_000)
    row = Message.objects.get(msg_id="keep")
    User.objects.create_user("clerk", password="pw", is_staff=False)
    for login in (False, True):
        if login:
            client.login(username="clerk", password="pw")
        response = client.post(LIST, {"action": "delete_selected_messages", "_selected_action": [row.pk]})
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert run_with_runtime(get_message, topic="orders", msg_id="keep").status == Status.WAITING


def test_list_newest_first_with_search_and_filters(admin_client):
    log_message(msg_id="old", produced=NOW - timedelta(days=10), status=Status.ACKED)
    log_message(msg_id="mid", produced=NOW - timedelta(hours=2), status=Status.WAITING)
    log_message(msg_id="new", produced=NOW, status=Status.READY, topic="payments")
    assert listed_ids(admin_client.get(LIST)) == ["new", "mid", "old"]
    assert listed_ids(admin_client.get(LIST, {"q": "mid"})) == ["mid"]
    assert listed_ids(admin_client.get(LIST, {"q": "mi"})) == []  # exact msgId, on its index
    assert listed_ids(admin_client.get(LIST, {"status__exact": "4"})) == ["old"]
    assert listed_ids(admin_client.get(LIST, {"topic": "payments"})) == ["new"]
    assert listed_ids(admin_client.get(LIST, {"topic": "orders", "status__exact": "1"})) == ["mid"]
    since = (NOW - timedelta(days=1)).strftime("%Y-%m-%d %H:%M:%S%z")
    assert listed_ids(admin_client.get(LIST, {"produce_time__gte": since})) == ["new", "mid"]
    day = NOW - timedelta(days=10)
    drill = admin_client.get(LIST, {"produce_time__year": day.year, "produce_time__month": day.month,
                                    "produce_time__day": day.day})
    assert listed_ids(drill) == ["old"]


def test_search_finds_a_msg_id_with_spaces_around_it_as_typed_first(admin_client):
    """The API keeps a msgId's spaces (" a " is another msgId than "a"): the search takes the term
    as typed, and only when no msgId is that, trimmed (an id pasted with spaces or a tab)."""
    log_message(msg_id=" spaced ")
    log_message(msg_id="a", produced=NOW - timedelta(hours=1))
    log_message(msg_id=" a ", produced=NOW - timedelta(hours=2))
    assert listed_ids(admin_client.get(LIST, {"q": " spaced "})) == [" spaced "]
    assert listed_ids(admin_client.get(LIST, {"q": " a "})) == [" a "]
    assert listed_ids(admin_client.get(LIST, {"q": "a"})) == ["a"]
    assert listed_ids(admin_client.get(LIST, {"q": "\ta\n"})) == ["a"]
    assert listed_ids(admin_client.get(LIST, {"q": "spaced"})) == []


def test_topic_filter_offers_registered_topics(admin_client):
    send("alpha", "a1")
    send("beta", "b1", 60_000)
    page = admin_client.get(LIST).content.decode()
    assert "?topic=alpha" in page and "?topic=beta" in page


@pytest.mark.parametrize("params, error", [
    ({"topic": "bad\ttopic"}, "topic: must be 1-255 bytes of UTF-8 text without control characters; "
                              "it has U+0009"),
    ({"q": "x" * 300}, "msgId: Ensure this field has no more than 256 characters."),
])
def test_bad_filter_input_is_refused_with_the_api_message(admin_client, params, error):
    log_message()
    response = admin_client.get(LIST, params)
    assert response.status_code == 200
    assert error.lower() in response.content.decode().lower()  # the admin capitalises messages
    assert listed_ids(response) == []


def test_list_never_counts_the_whole_table(admin_client):
    Message.objects.bulk_create([
        Message(namespace="default", topic="bulk", msg_id=f"b{i}", payload="x", produce_time=NOW,
                trigger_time=NOW, expire_time=NOW, max_retry=1, retry=0, status=Status.ACKED, updated_at=NOW)
        for i in range(EXACT_COUNT_LIMIT + 200)
    ])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE delayqueue_message")
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(LIST)
        assert admin_client.get(LIST, {"_facets": "True"}).status_code == 200  # no per-choice counts either
    assert response.status_code == 200 and "Show counts" not in response.content.decode()
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and "delayqueue_message" in q["sql"]]
    assert all("LIMIT" in sql.upper() for sql in counts), counts
    # Unfiltered: PostgreSQL's own estimate; filtered: exact up to the limit, estimated beyond.
    assert estimated_count(Message.objects.all()) == EXACT_COUNT_LIMIT + 200
    assert estimated_count(Message.objects.filter(msg_id="b7")) == 1
    assert estimated_count(Message.objects.filter(status=Status.ACKED)) > EXACT_COUNT_LIMIT


def test_detail_shows_history_timeline_and_live_state(admin_client):
    send("orders", "o-42", 0)
    run_with_runtime(pull_messages, topic="orders")
    drain_history("orders")
    run_with_runtime(nack_message, topic="orders", msg_id="o-42")
    send("orders", "someone-else", 0)
    drain_history("orders")
    message = Message.objects.get(msg_id="o-42")
    assert message.status == Status.READY
    page = admin_client.get(f"{LIST}{message.pk}/change/").content.decode()
    history = page[page.index('id="history"'):]
    assert re.findall(r"<em>\((\w+)", history) == ["Sent", "Pulled", "Nacked"]
    assert "none → ready" in history and "ready → consuming" in history and "consuming → ready" in history
    live = page[page.index('id="live-state"'):page.index('id="history"')]
    assert "2 (ready)" in live and "in ready list</th><td>yes" in live
    assert "Redis is ahead of the log" not in live  # the nack's event is logged by now


def test_detail_flags_redis_ahead_of_the_log(admin_client):
    send("orders", "o-43", 0)
    run_with_runtime(pull_messages, topic="orders")  # not drained: the log still says ready
    message = Message.objects.get(msg_id="o-43")
    live = admin_client.get(f"{LIST}{message.pk}/change/").content.decode()
    assert "3 (consuming)" in live and "Redis is ahead of the log" in live
    assert 'name="_save"' not in live  # read-only


def test_detail_of_a_message_redis_no_longer_holds(admin_client):
    message = log_message(msg_id="gone", status=Status.ACKED)
    page = admin_client.get(f"{LIST}{message.pk}/change/").content.decode()
    assert "Not in Redis" in page and "No history logged yet." in page


def test_delete_selected_goes_through_the_queue(admin_client):
    send("orders", "d1", 60_000)
    send("orders", "d2", 0)
    log_message(msg_id="never-in-redis")  # live in the log only (Redis lost it): ended there, or a restore revives it
    log_message(msg_id="acked-long-ago", status=Status.ACKED)
    selected = list(Message.objects.values_list("pk", flat=True))
    response = admin_client.post(LIST, {"action": "delete_selected_messages", "_selected_action": selected},
                                 follow=True)
    assert "Deleted 3; 1 were not live" in response.content.decode()
    for msg_id in ("d1", "d2"):
        assert run_with_runtime(get_message, topic="orders", msg_id=msg_id).status == Status.DELETED
    info = run_with_runtime(topic_info, topic="orders")
    assert info.waiting == 0 and info.ready == 0
    assert Message.objects.count() == 4  # the log keeps its rows
    drain_history("orders")
    assert set(Message.objects.filter(msg_id__in=["d1", "d2", "never-in-redis"]).values_list("status", flat=True)) == {
        Status.DELETED}
    assert Message.objects.get(msg_id="acked-long-ago").status == Status.ACKED


def test_delete_selected_says_when_the_log_fails_it(admin_client, settings):
    """A message Redis lost is deleted in the log too: PostgreSQL failing that (here the table
    locked against writes past the statement timeout) is said on the page, not a server error."""
    message = log_message(msg_id="never-in-redis")
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "LOG_TIMEOUT_MILLIS": 500}
    with psycopg.connect(log_database_url()) as locker:
        locker.execute("LOCK TABLE delayqueue_message IN EXCLUSIVE MODE")  # reads pass, writes wait
        response = admin_client.post(LIST, {"action": "delete_selected_messages", "_selected_action": [message.pk]},
                                     follow=True)
    page = response.content.decode()
    assert response.status_code == 200 and "Message log unavailable" in page and "some may be left undeleted" in page


@pytest.mark.fault
def test_restore_selected_brings_back_what_redis_lost(admin_client):
    """As restoreMsg would each: one due beyond the hot window stays in the log for the loader."""
    sent = send("orders", "r1", 60_000)
    send("orders", "r2", 0)
    far = send("orders", "far", 2 * 3_600_000)  # beyond the default hot window, an hour
    log_message(msg_id="finished", status=Status.ACKED)
    client = redis.Redis.from_url(REDIS_URL)
    client.flushall()  # Redis lost everything
    selected = list(Message.objects.values_list("pk", flat=True))
    action = {"action": "restore_selected", "_selected_action": selected}
    page = admin_client.post(LIST, action, follow=True).content.decode()
    assert "Restored 2; 0 already live in Redis; 1 skipped (ended or expired); 1 left in the message log" in page
    restored = run_with_runtime(get_message, topic="orders", msg_id="r1")
    assert restored.status == Status.WAITING
    assert (restored.trigger_time, restored.expire_time) == (sent.trigger_time, sent.expire_time)
    assert run_with_runtime(get_message, topic="orders", msg_id="r2").status == Status.READY
    assert run_with_runtime(get_message, topic="orders", msg_id="finished") is None
    assert not run_with_runtime(lambda rt: rt.redis.hexists(rt.ns.topic("orders").msgs, "far"))
    assert run_with_runtime(get_message, topic="orders", msg_id="far") == far  # found cold, in the log
    client.close()
    again = admin_client.post(LIST, action, follow=True).content.decode()
    assert "Restored 0; 2 already live in Redis; 1 skipped (ended or expired); 1 left in the message log" in again


def in_namespace(namespace, func, **kwargs):
    return run_with_runtime(lambda rt: func(rt.for_namespace(namespace), **kwargs))


@pytest.mark.fault
def test_actions_act_on_each_message_in_its_own_namespace(admin_client):
    rows.create_token(namespace="other", scopes=["produce"])  # "other" is now served
    send("orders", "here", 60_000)
    send("orders", "there", 60_000, namespace="other")  # the same topic name in another namespace
    send("elsewhere", "e1", 0, namespace="other")
    listing = admin_client.get(LIST).content.decode()
    assert "?topic=orders" in listing and "?topic=elsewhere" in listing  # every served namespace's topics
    client = redis.Redis.from_url(REDIS_URL)
    client.flushall()  # Redis lost everything, of both namespaces
    client.close()
    selected = list(Message.objects.values_list("pk", flat=True))
    page = admin_client.post(LIST, {"action": "restore_selected", "_selected_action": selected},
                             follow=True).content.decode()
    assert "Restored 3; 0 already live in Redis; 0 skipped" in page and "another namespace" not in page
    assert in_namespace("other", get_message, topic="orders", msg_id="there").status == Status.WAITING
    assert in_namespace("other", get_message, topic="elsewhere", msg_id="e1").status == Status.READY
    assert run_with_runtime(get_message, topic="orders", msg_id="there") is None  # not put in ours
    assert run_with_runtime(get_message, topic="orders", msg_id="here").status == Status.WAITING
    page = admin_client.post(LIST, {"action": "delete_selected_messages", "_selected_action": selected},
                             follow=True).content.decode()
    assert "Deleted 3; 0 were not live" in page
    for namespace, topic, msg_id in (("other", "orders", "there"), ("other", "elsewhere", "e1"),
                                     ("default", "orders", "here")):
        assert in_namespace(namespace, get_message, topic=topic, msg_id=msg_id).status == Status.DELETED


def test_no_add_or_row_delete_in_the_admin(admin_client):
    message = log_message()
    assert admin_client.get(LIST + "add/").status_code == 403
    assert admin_client.get(f"{LIST}{message.pk}/delete/").status_code == 403
    assert "delete_selected" not in re.findall(r'<option value="(\w+)"', admin_client.get(LIST).content.decode())


def test_date_navigation_spans_first_to_last_without_distinct(admin_client):
    log_message(msg_id="a", produced=datetime(2026, 3, 30, 12, tzinfo=timezone.utc))
    log_message(msg_id="b", produced=datetime(2026, 5, 2, 12, tzinfo=timezone.utc))
    with CaptureQueriesContext(connection) as queries:
        months = admin_client.get(LIST).content.decode()
    # (the served namespaces are a DISTINCT over the small token table, not over the log)
    assert not [q["sql"] for q in queries if "DISTINCT" in q["sql"].upper() and "delayqueue_message" in q["sql"]]
    def toplinks(page):
        return page[page.index('<nav class="toplinks">'):].split("</nav>")[0]

    assert [int(m) for m in re.findall(r"produce_time__month=(\d+)", toplinks(months))] == [3, 4, 5]
    days = admin_client.get(LIST, {"produce_time__year": 2026, "produce_time__month": 3}).content.decode()
    assert re.findall(r"produce_time__day=(\d+)", toplinks(days)) == ["30", "31"]
    assert listed_ids(admin_client.get(LIST, {"produce_time__year": 2026, "produce_time__month": 4})) == []


def test_redis_down_gives_messages_not_errors(admin_client, settings):
    message = log_message(msg_id="m1")
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "REDIS_TIMEOUT_MILLIS": 300}  # how long a refusal is retried
    assert listed_ids(admin_client.get(LIST)) == ["m1"]  # the log still browses
    assert "Redis unavailable" in admin_client.get(f"{LIST}{message.pk}/change/").content.decode()
    for action in ("restore_selected", "delete_selected_messages"):
        response = admin_client.post(LIST, {"action": action, "_selected_action": [message.pk]}, follow=True)
        assert response.status_code == 200 and "Redis unavailable" in response.content.decode()
    dashboard = admin_client.get("/admin/dashboard/")
    assert dashboard.status_code == 200 and "Redis unavailable" in dashboard.content.decode()


@pytest.mark.parametrize("params", [
    {"produce_time__gte": "garbage"}, {"status__exact": "abc"}, {"p": "abc"}, {"p": "99999"},
    {"produce_time__year": "abc"}, {"produce_time__year": "2026", "produce_time__month": "13"},
    {"o": "99"}, {"no_such_field": "1"}, {"topic": ""}, {"q": "\x00"},
    # Django passes these on: PostgreSQL refuses a NUL byte, the date drill-down steps past year 9999.
    {"msg_id": "\x00"}, {"payload__contains": "\x00"}, {"produce_time__year": "9999"},
    {"produce_time__year": "9999", "produce_time__month": "12"}, {"produce_time__year": "99999999999999999999"},
])
def test_garbage_parameters_never_give_a_500(admin_client, params):
    log_message()
    response = admin_client.get(LIST, params, follow=True)
    assert response.status_code == 200


@pytest.mark.parametrize("page, params", [
    ("topicconfig", {"topic": "\x00"}), ("limit", {"topic": "\x00"}), ("schedule", {"topic": "\x00"}),
    ("apitoken", {"namespace": "\x00"}), ("topichourstats", {"topic": "\x00"}),
    ("topichourstats", {"hour__year": "9999", "hour__month": "12", "hour__day": "31"}),
])
def test_every_list_refuses_a_filter_postgresql_or_the_calendar_cannot_take(admin_client, page, params):
    response = admin_client.get(f"/admin/delayqueue/{page}/", params)
    assert response.status_code == 302 and response["Location"].endswith("?e=1")


def test_actions_refuse_more_rows_than_the_limit(admin_client, monkeypatch):
    from delayqueue.ops.admin import messages as message_admin

    monkeypatch.setattr(message_admin, "ACTION_LIMIT", 2)
    for msg_id in ("l1", "l2", "l3"):
        send("orders", msg_id, 60_000)
    page = admin_client.post(LIST, {"action": "delete_selected_messages", "select_across": "1", "index": "0",
                                    "_selected_action": [m.pk for m in Message.objects.all()]}, follow=True)
    assert "Select at most 2 messages at a time" in page.content.decode()
    assert run_with_runtime(topic_info, topic="orders").waiting == 3  # nothing deleted
