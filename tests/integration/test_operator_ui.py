"""The admin's operator pages: a topic's settings form with pause / resume / purge, a message's
run now / change delay / delete, a topic's dead letters with redrive and purge; the dashboard's
and /metrics' dead letters, pauses and redrives. Each action goes through the queue's services
on the real servers, needs a staff user with the change permission, and the broad ones a
confirmation page first."""
import asyncio
import re
from datetime import datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from delayqueue.api import wire
from delayqueue.core.constants import Status
from delayqueue.models import Limit, Message, TopicConfig
from delayqueue.ops.admin.topics import topic_url
from delayqueue.runtime import run_with_runtime
from delayqueue.services.consume import nack_message, pull_messages
from delayqueue.services.dead_letters import create_redrive, redrive_state
from delayqueue.services.messages import get_message, redis_millis
from delayqueue.services.send import SendRequest, send_message
from delayqueue.services.topic_control import pause_topic
from delayqueue.services.topics import topic_config, topic_info
from delayqueue.stores.rows import save_topic_config
from delayqueue.workers.redriver import Redriver
from tests.helpers import drain_history, send
from tests.integration.test_dead_letters import fill_dead
from tests.integration.test_monitoring import sample, scrape

pytestmark = pytest.mark.usefixtures("clean_state")

MESSAGES = "/admin/delayqueue/message/"


def page_of(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def live(topic: str, msg_id: str):
    return run_with_runtime(get_message, topic=topic, msg_id=msg_id)


def settings_of(topic: str) -> dict:
    return wire.topic_config(run_with_runtime(topic_config, topic=topic))


def form_values(**changes) -> dict:
    """The topic page's settings form as a browser posts it, all defaults, with `changes`."""
    values = {"namespace": "default", "topic": "orders", "ttl_millis": "", "max_retry": "", "ack_timeout_millis": "",
              "retry_backoff_millis": "0", "retry_backoff_max_millis": "3600000", "dead_letter": "on",
              "produce_rate": "", "consume_rate": "", "max_live": "", "push_url": "", "push_concurrency": "8",
              "push_timeout_millis": "10000", "push_rate": "", "shards": "1"}
    return {**values, **changes}


@pytest.fixture
def clerk_client(client):
    """A staff user who may look at everything but change nothing."""
    user = User.objects.create_user("clerk", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_topicconfig", "view_message"]))
    client.login(username="clerk", password="pw")
    return client


def message_page(admin_client, msg_id: str) -> tuple[str, str]:
    pk = Message.objects.get(msg_id=msg_id).pk
    return f"{MESSAGES}{pk}/change/", f"{MESSAGES}{pk}/queue/"


# --- the topic page


def test_any_topic_opens_and_its_settings_form_saves_through_the_service(admin_client):
    send("orders", "o1", 60_000)
    assert not TopicConfig.objects.exists()
    page = page_of(admin_client.get(topic_url("topic", "default", "orders")))
    assert re.search(r'id="paused">active<', page) and re.search(r'id="waiting">1<', page)
    assert 'id="pause"' in page and 'id="purge"' in page
    saved = admin_client.post(topic_url("topic", "default", "orders"), form_values(
        max_retry="7", retry_backoff_millis="2000", retry_backoff_max_millis="60000", dead_letter="",
        consume_rate="50"), follow=True)
    assert "Settings saved" in page_of(saved)
    config = settings_of("orders")
    assert (config["maxRetry"], config["retryBackoffMillis"], config["retryBackoffMaxMillis"],
            config["deadLetter"], config["consumeRatePerSecond"]) == (7, 2000, 60000, False, 50)
    assert Limit.objects.get(namespace="default", topic="orders").consume_rate == 50

    async def mirror(rt):
        return await rt.redis.hgetall(rt.ns.topic("orders").meta)

    assert run_with_runtime(mirror)["retry_backoff"] == "2000"  # the scripts' copy was written too
    # The row's own page is the topic page, showing what is stored.
    row = TopicConfig.objects.get(topic="orders")
    again = admin_client.get(f"/admin/delayqueue/topicconfig/{row.pk}/change/", follow=True)
    assert 'name="max_retry" value="7"' in page_of(again)
    # Cleared: back to the defaults, the limit removed.
    admin_client.post(topic_url("topic", "default", "orders"), form_values(), follow=True)
    assert settings_of("orders")["consumeRatePerSecond"] == 0 and not Limit.objects.exists()


def test_the_topic_page_sets_a_push_url_and_shows_its_secret_once(admin_client):
    refused = page_of(admin_client.post(topic_url("topic", "default", "orders"),
                                        form_values(push_url="http://10.9.9.9/hook")))
    assert "loopback, private or reserved" in refused and not TopicConfig.objects.exists()
    saved = page_of(admin_client.post(topic_url("topic", "default", "orders"),
                                      form_values(push_url="http://127.0.0.1:9/hook", push_concurrency="3")))
    secret = TopicConfig.objects.get(topic="orders").push_secret
    assert secret.startswith("dqps_") and f"<code>{secret}</code>" in saved and "Settings saved" in saved
    assert settings_of("orders")["pushConcurrency"] == 3
    # Never shown again: not on the page, nor after saving other settings.
    assert secret not in page_of(admin_client.get(topic_url("topic", "default", "orders")))
    again = admin_client.post(topic_url("topic", "default", "orders"),
                              form_values(push_url="http://127.0.0.1:9/hook", max_retry="3"), follow=True)
    assert secret not in page_of(again) and TopicConfig.objects.get(topic="orders").push_secret == secret
    rotated = page_of(admin_client.post(topic_url("topic", "default", "orders"), form_values(
        push_url="http://127.0.0.1:9/hook", rotate_push_secret="on")))
    row = TopicConfig.objects.get(topic="orders")
    assert row.push_previous_secret == secret and f"<code>{row.push_secret}</code>" in rotated


def test_push_concurrency_beyond_the_namespace_cap_is_refused_on_the_page_and_nothing_saved(admin_client, settings):
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "MAX_PUSH_CONCURRENCY": 10}
    page = page_of(admin_client.post(topic_url("topic", "default", "orders"), form_values(
        push_url="http://127.0.0.1:9/hook", push_concurrency="11"), follow=True))
    assert "DELAYQUEUE_MAX_PUSH_CONCURRENCY" in page and "the cap is 10" in page
    assert "Settings saved" not in page and not TopicConfig.objects.exists()
    assert 'name="push_concurrency" value="11"' in page  # the form as posted, to change and save again


def test_a_push_secret_cannot_be_guessed_through_the_topic_list_filters(clerk_client):
    """The list takes a field's lookup from its query string: on a signing secret it would tell one
    who may only look whether a guess of its start is right, a character at a time."""
    secret = save_topic_config(namespace="default", topic="orders", changes={"push_url": "http://127.0.0.1:9/hook"},
                               limits={}, by_operator=True)
    for field in ("push_secret", "push_previous_secret"):
        for lookup in (field, f"{field}__startswith", f"{field}__gt"):
            answer = clerk_client.get("/admin/delayqueue/topicconfig/", {lookup: secret[:10]})
            assert answer.status_code == 400, (lookup, answer.status_code)
    assert "orders" in page_of(clerk_client.get("/admin/delayqueue/topicconfig/", {"paused__exact": "0"}))


def test_bad_settings_and_bad_topics_are_refused_with_a_reason(admin_client):
    page = page_of(admin_client.post(topic_url("topic", "default", "orders"),
                                     form_values(retry_backoff_millis="-5", max_live="0")))
    assert "greater than or equal to 0" in page and "greater than or equal to 1" in page
    assert not TopicConfig.objects.exists()
    bad = admin_client.get(topic_url("topic", "default", "bad\ttopic"), follow=True)
    assert "it has U+0009" in page_of(bad)
    bad = admin_client.get(topic_url("topic", "no spaces", "orders"), follow=True)
    assert "namespace: must be 1-64" in page_of(bad).lower()


def test_pause_asks_first_then_pauses_and_resume_resumes(admin_client):
    send("orders", "o1", 0)
    pause = "/admin/delayqueue/topicconfig/topic/pause/"
    question = page_of(admin_client.get(pause, {"namespace": "default", "topic": "orders"}))
    assert "Pause topic orders?" in question and 'name="confirmed"' in question
    unconfirmed = page_of(admin_client.post(pause, {"namespace": "default", "topic": "orders"}))
    assert "Pause topic orders?" in unconfirmed
    assert settings_of("orders")["paused"] is False  # neither the page nor an unconfirmed post paused it
    done = admin_client.post(pause, {"namespace": "default", "topic": "orders", "confirmed": "on"}, follow=True)
    page = page_of(done)
    assert "Paused" in page and re.search(r'id="paused">paused<', page) and 'id="resume"' in page
    assert run_with_runtime(pull_messages, topic="orders")[0] == []  # pulls hand out nothing
    resumed = admin_client.post("/admin/delayqueue/topicconfig/topic/resume/",
                                {"namespace": "default", "topic": "orders"}, follow=True)
    assert re.search(r'id="paused">active<', page_of(resumed))
    assert [m.msg_id for m in run_with_runtime(pull_messages, topic="orders").messages] == ["o1"]


def test_purge_asks_first_with_the_live_count_then_purges(admin_client):
    for msg_id in ("p1", "p2", "p3"):
        send("orders", msg_id, 60_000)
    purge = "/admin/delayqueue/topicconfig/topic/purge/"
    question = page_of(admin_client.get(purge, {"namespace": "default", "topic": "orders"}))
    assert "Purge topic orders?" in question and "(3 now)" in question
    assert run_with_runtime(topic_info, topic="orders").waiting == 3
    done = admin_client.post(purge, {"namespace": "default", "topic": "orders", "confirmed": "on"}, follow=True)
    assert "Purged: 3 messages ended as deleted." in page_of(done)
    assert live("orders", "p2").status == Status.DELETED
    assert re.search(r'id="waiting">0<', page_of(done))


def test_topic_actions_need_staff_and_the_change_permission(client, clerk_client):
    send("orders", "o1", 60_000)
    target = {"namespace": "default", "topic": "orders", "confirmed": "on"}
    # The clerk sees the page, without buttons, and every change is refused.
    page = page_of(clerk_client.get(topic_url("topic", "default", "orders")))
    assert 'id="pause"' not in page and 'value="Save settings"' not in page
    for url in ("topic/pause/", "topic/purge/", "topic/resume/"):
        assert clerk_client.post(f"/admin/delayqueue/topicconfig/{url}", target).status_code == 403
    assert clerk_client.get("/admin/delayqueue/topicconfig/topic/purge/", target).status_code == 403
    assert clerk_client.post(topic_url("topic", "default", "orders"), form_values(max_retry="1")).status_code == 403
    assert clerk_client.post(topic_url("deadletters", "default", "orders"),
                             {**target, "action": "purge", "scope": "all"}).status_code == 403
    clerk_client.logout()
    User.objects.create_user("outsider", password="pw", is_staff=False)
    client.login(username="outsider", password="pw")
    for url in ("topic/", "topic/pause/", "deadletters/"):
        refused = client.post(f"/admin/delayqueue/topicconfig/{url}", target)
        assert refused.status_code == 302 and refused["Location"].startswith("/admin/login/")
    assert settings_of("orders")["paused"] is False and not TopicConfig.objects.exists()
    assert live("orders", "o1").status == Status.WAITING


def test_the_topic_page_counts_messages_waiting_after_a_delivery(admin_client):
    send("orders", "fresh", 60_000)
    send("orders", "tried", 0)
    run_with_runtime(pull_messages, topic="orders")
    run_with_runtime(nack_message, topic="orders", msg_id="tried", delay_millis=30_000)
    page = page_of(admin_client.get(topic_url("topic", "default", "orders")))
    assert re.search(r'id="waiting">2<', page) and re.search(r'id="backoff">1<', page)


def test_redis_down_gives_messages_not_errors(admin_client, settings):
    send("orders", "m1", 60_000)
    change, act = message_page(admin_client, "m1")
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    settings.DELAYQUEUE = {**settings.DELAYQUEUE, "REDIS_TIMEOUT_MILLIS": 300}
    assert "Redis unavailable" in page_of(admin_client.get(topic_url("topic", "default", "orders")))
    paused = admin_client.post("/admin/delayqueue/topicconfig/topic/pause/",
                               {"namespace": "default", "topic": "orders", "confirmed": "on"}, follow=True)
    assert "pause failed" in page_of(paused).lower()
    ran = page_of(admin_client.post(act, {"action": "run_now"}, follow=True))
    assert "Redis unavailable" in ran and "nothing changed" in ran


# --- a message's page




def live_box(page: str) -> str:
    return page[page.index('id="live-state"'):page.index('id="history"')]


def test_run_now_change_delay_and_delete_show_the_new_live_state(admin_client):
    send("orders", "m1", 600_000)
    change, act = message_page(admin_client, "m1")
    assert 'id="run-now"' in page_of(admin_client.get(change))

    ran = page_of(admin_client.post(act, {"action": "run_now"}, follow=True))
    assert "Due now: ready" in ran and "catch up" in ran and "2 (ready)" in live_box(ran)
    assert live("orders", "m1").status == Status.READY

    before = run_with_runtime(redis_millis)
    moved = page_of(admin_client.post(act, {"action": "reschedule", "delay_millis": "120000"}, follow=True))
    assert "Rescheduled: waiting" in moved and "1 (waiting)" in live_box(moved)
    trigger = live("orders", "m1").trigger_time
    assert before + 120_000 <= trigger <= run_with_runtime(redis_millis) + 120_000

    when = timezone.localtime() + timedelta(hours=2)
    text = when.strftime("%Y-%m-%d %H:%M:%S")
    page_of(admin_client.post(act, {"action": "reschedule", "trigger_time": text}, follow=True))
    expected = int(timezone.make_aware(datetime.strptime(text, "%Y-%m-%d %H:%M:%S")).timestamp() * 1000)
    assert live("orders", "m1").trigger_time == expected

    both = page_of(admin_client.post(act, {"action": "reschedule", "delay_millis": "1", "trigger_time": text},
                                     follow=True))
    assert "not both" in both and live("orders", "m1").trigger_time == expected
    bad = page_of(admin_client.post(act, {"action": "reschedule", "delay_millis": "-3"}, follow=True))
    assert "delay millis: ensure this value is greater than or equal to 0" in bad.lower()

    question = page_of(admin_client.post(act, {"action": "delete"}))
    assert "Delete message m1 of topic orders?" in question
    assert live("orders", "m1").status == Status.WAITING  # not without the confirmation
    deleted = page_of(admin_client.post(act, {"action": "delete", "confirmed": "on"}, follow=True))
    assert "Deleted. The live state below is read from Redis" in deleted and "7 (deleted)" in live_box(deleted)
    assert 'id="run-now"' not in deleted  # an ended message offers no actions
    drain_history("orders")
    assert Message.objects.get(msg_id="m1").status == Status.DELETED


def test_change_delay_holds_a_trigger_time_to_the_apis_bound(admin_client):
    """A trigger time of 9999 went through (rescheduleMsg refuses one after 2100-01-01): its
    expireTime, past the year 9999, made the message's page answer 500 from then on."""
    send("orders", "m1", 600_000)
    change, act = message_page(admin_client, "m1")
    before = live("orders", "m1").trigger_time
    far = page_of(admin_client.post(act, {"action": "reschedule", "trigger_time": "9999-12-31 23:00:00"},
                                    follow=True))
    assert "2100-01-01" in far and live("orders", "m1").trigger_time == before
    epoch = page_of(admin_client.post(act, {"action": "reschedule", "trigger_time": str(before + 1000)}, follow=True))
    assert "Rescheduled: waiting" in epoch and live("orders", "m1").trigger_time == before + 1000
    drain_history("orders")
    assert admin_client.get(change).status_code == 200

def test_a_consuming_message_is_not_rescheduled_and_says_why(admin_client):
    send("orders", "busy", 0)
    run_with_runtime(pull_messages, topic="orders")
    change, act = message_page(admin_client, "busy")
    page = page_of(admin_client.post(act, {"action": "run_now"}, follow=True))
    assert "is being consumed" in page and "3 (consuming)" in live_box(page)


def test_message_actions_need_staff_and_the_change_permission(client, clerk_client):
    send("orders", "keep", 60_000)
    change, act = message_page(clerk_client, "keep")
    assert 'id="run-now"' not in page_of(clerk_client.get(change))
    for action in ("run_now", "delete"):
        assert clerk_client.post(act, {"action": action, "confirmed": "on"}).status_code == 403
    clerk_client.logout()
    User.objects.create_user("outsider", password="pw", is_staff=False)
    client.login(username="outsider", password="pw")
    refused = client.post(act, {"action": "delete", "confirmed": "on"})
    assert refused.status_code == 302 and refused["Location"].startswith("/admin/login/")
    assert live("orders", "keep").status == Status.WAITING


def test_message_actions_are_posts(admin_client):
    send("orders", "m1", 60_000)
    _change, act = message_page(admin_client, "m1")
    assert admin_client.get(act, {"action": "delete", "confirmed": "on"}).status_code == 403
    assert live("orders", "m1").status == Status.WAITING


# --- dead letters


def dead_ids(page: str) -> list[str]:
    return re.findall(r'<tr class="dead-letter" data-msg-id="([^"]+)">', page)


def run_redrives_until_done(task_id: int) -> None:
    """A scanner's redrive runner, in this process, until the task is done."""

    async def run(rt):
        runner = Redriver(rt, "ui-test")
        stopping = asyncio.Event()
        running = asyncio.create_task(runner.run(stopping))
        try:
            for _ in range(200):
                if wire.redrive_progress(await redrive_state(rt, task_id=task_id))["state"] == "done":
                    return
                await asyncio.sleep(0.05)
            raise AssertionError(f"redrive {task_id} not done within 10 s")
        finally:
            stopping.set()
            await running

    run_with_runtime(run)


def test_dead_letters_are_paged_redriven_with_progress_and_purged(admin_client):
    async_to_sync(fill_dead)("orders", 60)
    url = topic_url("deadletters", "default", "orders")
    first = page_of(admin_client.get(url))
    assert "60 dead letters of topic orders" in first
    assert dead_ids(first) == [f"d{i}" for i in range(1, 51)] and "retries_exhausted" in first
    next_url = re.search(r'href="([^"]+)" id="next-page"', first)[1].replace("&amp;", "&")
    assert dead_ids(page_of(admin_client.get(next_url))) == [f"d{i}" for i in range(51, 61)]

    target = {"namespace": "default", "topic": "orders"}
    redrive = admin_client.post(url, {**target, "action": "redrive", "scope": "selected", "msg_id": ["d1", "d2"],
                                      "rate": "100"})
    assert redrive.status_code == 302
    progress_url = redrive["Location"]
    running = page_of(admin_client.get(progress_url))
    assert re.search(r'id="state">running<', running) and re.search(r'id="left">2<', running)
    assert 'http-equiv="refresh"' in running  # the page follows the task
    dashboard = page_of(admin_client.get("/admin/dashboard/"))
    assert re.search(r'<td class="moved">0</td><td class="left">2</td>', dashboard)
    task_id = int(re.search(r"/redrive/(\d+)/", progress_url)[1])
    run_redrives_until_done(task_id)
    done = page_of(admin_client.get(progress_url))
    assert re.search(r'id="state">done<', done) and re.search(r'id="moved">2<', done)
    assert 'http-equiv="refresh"' not in done
    assert live("orders", "d1").status == Status.READY and live("orders", "d2").status == Status.READY

    question = page_of(admin_client.post(url, {**target, "action": "purge", "scope": "selected",
                                               "msg_id": ["d3", "d4"]}))
    assert "Remove 2 selected dead letter(s) of topic orders" in question
    assert 'value="d3"' in question and 'value="d4"' in question  # the confirmation carries the selection
    purged = page_of(admin_client.post(url, {**target, "action": "purge", "scope": "selected",
                                             "msg_id": ["d3", "d4"], "confirmed": "on"}, follow=True))
    assert "Purged 2 dead letter(s)." in purged and "56 dead letters" in purged
    # Ended as deleted: what they went through stays in the hours' figures until their retention.
    assert sorted(Message.objects.filter(msg_id__in=["d3", "d4"]).values_list("status", flat=True)) == [
        Status.DELETED, Status.DELETED]

    slow = page_of(admin_client.post(url, {**target, "action": "redrive", "scope": "all", "rate": "0"},
                                     follow=True))
    assert "rate: ensure this value is greater than or equal to 1" in slow.lower()
    every = admin_client.post(url, {**target, "action": "redrive", "scope": "all", "rate": "1000"}, follow=True)
    assert re.search(r'id="left">56<', page_of(every))

    everything = page_of(admin_client.post(url, {**target, "action": "purge", "scope": "all"}))
    assert "Remove every dead letter of topic orders" in everything
    gone = page_of(admin_client.post(url, {**target, "action": "purge", "scope": "all", "confirmed": "on"},
                                     follow=True))
    assert "Purged 56 dead letter(s)." in gone and "0 dead letters" in gone


def test_dead_letter_actions_refuse_bad_input(admin_client):
    async_to_sync(fill_dead)("orders", 3)
    url = topic_url("deadletters", "default", "orders")
    target = {"namespace": "default", "topic": "orders"}
    nothing = page_of(admin_client.post(url, {**target, "action": "redrive", "scope": "selected"}, follow=True))
    assert "Select dead letters first" in nothing
    unknown = page_of(admin_client.post(url, {**target, "action": "redrive", "scope": "selected",
                                              "msg_id": ["nope"]}, follow=True))
    assert "No such dead letter" in unknown
    bad = page_of(admin_client.post(url, {**target, "action": "explode"}, follow=True))
    assert "action: must be redrive or purge" in bad.lower()
    cursor = page_of(admin_client.get(url + "&cursor=x.y"))
    assert "not a cursor" in cursor and dead_ids(cursor) == ["d1", "d2", "d3"]


# --- dashboard and /metrics


def test_the_dead_letter_view_shows_the_consumers_reason_escaped(admin_client):
    async_to_sync(fill_dead)("why", 1, reason="dead_lettered", detail="ValueError: <b>bad</b>")
    shown = page_of(admin_client.get(topic_url("deadletters", "default", "why")))
    assert '<span class="detail">ValueError: &lt;b&gt;bad&lt;/b&gt;</span>' in shown


def test_dashboard_shows_dead_letters_and_paused_topics(admin_client):
    async_to_sync(fill_dead)("orders", 4)
    send("orders", "o1", 60_000)
    send("calm", "c1", 60_000)
    run_with_runtime(pause_topic, topic="calm")
    page = page_of(admin_client.get("/admin/dashboard/"))
    rows = dict(re.findall(r'<tr class="row-\w+" data-topic="([^"]+)">(.*?)</tr>', page, re.S))
    assert re.search(r'<td class="dead"><a [^>]+>4</a>', rows["orders"])
    assert re.search(r'<td class="dead"><a [^>]+>0</a>', rows["calm"])
    assert "dq-paused" in rows["calm"] and "dq-paused" not in rows["orders"]
    assert 'id="paused-count">1 paused' in page
    assert topic_url("topic", "default", "orders").replace("&", "&amp;") in rows["orders"]


async def test_metrics_export_dead_letters_pauses_and_redrive_progress(api, single_rt):
    await send_message(single_rt, request=SendRequest(topic="orders", msg="x", delay_millis=0))
    await send_message(single_rt, request=SendRequest(topic="calm", msg="y", delay_millis=0))
    await fill_dead("orders", 5)
    await fill_dead("retired", 2)  # dead letters of a topic no longer registered
    await pause_topic(single_rt, topic="calm")
    task_id = await create_redrive(single_rt, topic="orders", msg_ids=None, max_per_second=10)
    samples = await scrape(api)
    assert sample(samples, "delayqueue_dead_letters", topic="orders") == 5
    assert sample(samples, "delayqueue_dead_letters", topic="calm") == 0
    assert sample(samples, "delayqueue_dead_letters", topic="retired") == 2
    assert sample(samples, "delayqueue_topic_paused", topic="calm") == 1
    assert sample(samples, "delayqueue_topic_paused", topic="orders") == 0
    assert sample(samples, "delayqueue_redrive_left", topic="orders", task=str(task_id)) == 5
    assert sample(samples, "delayqueue_redrive_moved", topic="orders", task=str(task_id)) == 0
