"""delayqueue_client.testing's FakeServer against the real server: one scenario (delays and dedupe,
priorities, pulls, acks, nacks with a delay and with the topic's backoff, ack timeouts and retries
to exhaustion into dead letters, TTL expiry, touch, reschedule, validation errors, an unknown
endpoint) runs through a real Client on each, and what each answered must be the same: statuses,
order, retry counts, dead letters, error codes and texts. The real server runs it on small real
delays (a uvicorn and a scanner process); the fake on its clock, where what a delay makes happen
must have happened at once. So the fake cannot drift from the server unnoticed."""
import time
from typing import Callable

import pytest
from delayqueue_client import Client, DelayQueueError, Message
from delayqueue_client._calls import Call
from delayqueue_client.testing import FakeServer, Settings

from tests.helpers import TEST_CONFIG, wait_for

pytestmark = pytest.mark.process

WAITING, READY, CONSUMING, ACKED, EXPIRED, EXHAUSTED = 1, 2, 3, 4, 5, 6


class Real:
    """The real server: time passes as it does, and what it makes happen is waited for."""

    def __init__(self, client: Client):
        self.client = client

    def elapse(self, seconds: float) -> None:
        time.sleep(seconds)  # time passing is the input here; the checks after it wait with wait_for

    def eventually(self, predicate: Callable[[], bool], what: str) -> None:
        wait_for(predicate, timeout=30, what=what)


class Fake:
    """The fake: time is its clock, and what a delay makes happen has happened once it is advanced."""

    def __init__(self, server: FakeServer):
        self.server, self.client = server, server.client()

    def elapse(self, seconds: float) -> None:
        self.server.clock.advance(seconds)

    def eventually(self, predicate: Callable[[], bool], what: str) -> None:
        assert predicate(), f"the fake has not made {what} happen at once"


def shown(message: Message | None) -> tuple | None:
    """What of a message does not depend on when the scenario ran (its TTL while its expireTime
    has not moved: a reschedule moves it)."""
    if message is None:
        return None
    return (message.msg_id, message.msg, message.status, message.retry, message.max_retry, message.priority,
            message.expire_time - message.produce_time)


def error_of(action: Callable[[], object]) -> tuple:
    try:
        action()
    except DelayQueueError as exc:
        return type(exc).__name__, exc.code, exc.msg
    raise AssertionError("no error")


def status(side, topic: str, msg_id: str) -> int | None:
    message = side.client.get(topic, msg_id)
    return None if message is None else message.status


def scenario(side) -> list:
    """The scenario's observations, in order."""
    c, seen = side.client, []
    # Delays, dedupe and priorities.
    a = c.send("p", "first a", msg_id="a", delay_ms=1500)
    seen.append(("sent", shown(a), a.trigger_time - a.produce_time))
    seen.append(("resent", shown(c.send("p", "second a", msg_id="a"))))
    for msg_id, priority in (("b", 5), ("c", 0), ("d", 9), ("e", 5)):
        seen.append(("sent", shown(c.send("p", msg_id, msg_id=msg_id, priority=priority))))
    seen.append(("pulled", [shown(m) for m in c.pull("p", batch=10)]))
    seen.append(("acks", c.ack("p", "b"), c.ack("p", "b"), c.ack("p", "never-sent")))
    seen.append(("nacked after 1 s", c.nack("p", "c", delay_ms=1000), shown(c.get("p", "c"))))
    seen.append(("nacked", c.nack("p", "d"), c.nack("p", "d")))
    seen.append(("dead-lettered", c.nack("p", "e", dead_letter=True)))
    side.elapse(1.5)
    side.eventually(lambda: {status(side, "p", m) for m in "acd"} == {READY}, "a and c due")
    # c fell due before a; d went back first: ready order within priority 0 and 9.
    seen.append(("pulled", [shown(m) for m in c.pull("p", batch=10)]))
    seen.append(("acks", c.ack_many("p", ["a", "c", "d"])))
    seen.append(("resent after ack", shown(c.send("p", "third a", msg_id="a"))))

    # Retries: the ack timeout and nacks give messages back until maxRetry, then they are dead letters.
    seen.append(("config", c.set_topic_config("r", max_retry=1)))
    for msg_id in ("r1", "r2", "r3"):
        c.send("r", msg_id, msg_id=msg_id)
    seen.append(("pulled", [shown(m) for m in c.pull("r", batch=1, ack_timeout_ms=300)]))
    side.elapse(0.3)
    side.eventually(lambda: status(side, "r", "r1") == READY, "r1's ack timeout")
    seen.append(("pulled", [shown(m) for m in c.pull("r", batch=10, ack_timeout_ms=1000)]))
    seen.append(("nacked", c.ack_many("r", ["r2"], ack=False), c.nack("r", "r3", dead_letter=True)))
    seen.append(("pulled", [shown(m) for m in c.pull("r", batch=10, ack_timeout_ms=60_000)]))
    seen.append(("nacked", c.nack("r", "r2")))
    side.elapse(1.0)
    side.eventually(lambda: status(side, "r", "r1") == EXHAUSTED, "r1's last ack timeout")
    side.eventually(lambda: len(c.dead_letters("r").messages) == 3, "three dead letters listed")
    dead = sorted(c.dead_letters("r").messages, key=lambda m: m.msg_id)
    seen.append(("dead", [(shown(m), m.dead_reason) for m in dead]))
    # Dead letters only while the topic keeps them; a redrive gives one a new life; a purge removes one.
    c.set_topic_config("r", dead_letter=False)
    seen.append(("not kept", c.dead_letters("r").messages, error_of(lambda: c.redrive("r"))))
    c.set_topic_config("r", dead_letter=True)
    task = c.redrive("r", ["r3"])
    side.eventually(lambda: c.redrive_task(task)["state"] == "done", "the redrive")
    seen.append(("redriven", c.redrive_task(task), shown(c.get("r", "r3"))))
    seen.append(("purged", c.purge_dead("r", ["r1"])))
    side.eventually(lambda: [m.msg_id for m in c.dead_letters("r").messages] == ["r2"], "r2 left alone")
    seen.append(("no such dead letter", error_of(lambda: c.redrive("r", ["r1"]))))

    # The topic's retry backoff: a nack waits it out.
    c.set_topic_config("b", retry_backoff_ms=300)
    c.send("b", "x", msg_id="b1")
    c.pull("b")
    seen.append(("backed off", c.nack("b", "b1"), shown(c.get("b", "b1"))))
    side.elapse(0.3)
    side.eventually(lambda: status(side, "b", "b1") == READY, "b1's backoff")
    seen.append(("pulled", [shown(m) for m in c.pull("b")]))

    # TTL: one never delivered expires (5), one delivered and never acked ends as 6.
    c.send("ttl", "never pulled", msg_id="t1", ttl_ms=1000)
    c.send("ttl", "pulled", msg_id="t2", ttl_ms=1000, priority=1)
    seen.append(("pulled", [shown(m) for m in c.pull("ttl", ack_timeout_ms=60_000)]))
    side.elapse(1.0)
    side.eventually(lambda: len(c.dead_letters("ttl").messages) == 2, "both TTLs ended")
    seen.append(("dead", sorted((shown(m), m.dead_reason) for m in c.dead_letters("ttl").messages)))

    # Touch and reschedule.
    c.send("tr", "x", msg_id="t")
    c.pull("tr", ack_timeout_ms=500)
    before = c.get("tr", "t")
    deadline = c.touch("tr", "t", ack_timeout_ms=60_000)
    seen.append(("touched", deadline > before.trigger_time))
    side.elapse(0.8)
    seen.append(("still consuming past the first deadline", status(side, "tr", "t")))
    c.ack("tr", "t")
    seen.append(("touch errors", error_of(lambda: c.touch("tr", "t", ack_timeout_ms=10)),
                 error_of(lambda: c.touch("tr", "nope", ack_timeout_ms=10))))
    sent = c.send("tr", "y", msg_id="s", delay_ms=60_000)
    moved = c.reschedule("tr", "s", delay_ms=120_000)
    seen.append(("rescheduled", shown(moved)[:-1], moved.expire_time - sent.expire_time >= 60_000))
    run_now = c.reschedule("tr", "s", trigger_time=0)
    seen.append(("run now", shown(run_now)[:-1], run_now.expire_time - run_now.trigger_time))
    c.pull("tr")
    seen.append(("reschedule errors", error_of(lambda: c.reschedule("tr", "s", delay_ms=1)),
                 c.ack("tr", "s"), error_of(lambda: c.reschedule("tr", "s", delay_ms=1)),
                 error_of(lambda: c.reschedule("tr", "nope", delay_ms=1))))
    seen.append(("info", {k: v for k, v in c.topic_info("tr").items()}))
    seen.append(("delete", c.delete("tr", "s"), c.get("tr", "nope")))
    # Past the ended retention, the ended messages are no longer held: unknown to touch and reschedule.
    side.elapse(TEST_CONFIG["ENDED_RETENTION_MILLIS"] / 1000)
    side.eventually(lambda: c.get("tr", "t") is None and c.get("tr", "s") is None, "the ended retention over")
    seen.append(("forgotten", error_of(lambda: c.touch("tr", "t", ack_timeout_ms=10)),
                 error_of(lambda: c.reschedule("tr", "s", delay_ms=1))))

    # A late settle names its delivery: the message delivered again since, that delivery is left alone.
    c.send("late", "x", msg_id="l")
    [first] = c.pull("late", ack_timeout_ms=300)
    side.elapse(0.3)
    side.eventually(lambda: status(side, "late", "l") == READY, "l's ack timeout")
    [second] = c.pull("late", ack_timeout_ms=60_000)
    seen.append(("late settles", first.retry, second.retry, c.ack("late", "l", retry=first.retry),
                 c.nack("late", "l", retry=first.retry), c.ack_many("late", ["l", "l"], retries=[first.retry, None]),
                 error_of(lambda: c.touch("late", "l", ack_timeout_ms=1000, retry=first.retry)),
                 c.touch("late", "l", ack_timeout_ms=60_000, retry=second.retry) > 0,
                 c.ack("late", "l", retry=second.retry), status(side, "late", "l")))

    # Queue sizes, pause, resume, purge, the topic list.
    c.send_many([{"topic": "info", "msg": "soon", "delay_ms": 30_000}, {"topic": "info", "msg": "later",
                 "delay_ms": 2 * 3_600_000}, {"topic": "info", "msg": "x", "msg_id": "twice"},
                 {"topic": "info", "msg": "y", "msg_id": "twice"}, {"topic": "info", "msg": "z"}])
    c.pull("info")
    seen.append(("info", c.topic_info("info")))
    c.pause("info")
    seen.append(("paused", c.pull("info", batch=5), c.topic_config("info")["paused"]))
    c.resume("info")
    seen.append(("resumed", len(c.pull("info", batch=5)), c.purge("info"), c.topic_info("info")))
    seen.append(("topics", [info["topic"] for info in c.topic_infos()]))

    # Bad input and an unknown endpoint.
    seen.append(("errors", [error_of(action) for action in (
        lambda: c.send("p", "x", priority=10),
        lambda: c.send("p", "x", delay_ms=1, trigger_time=1),
        lambda: c.send("", "x"),
        lambda: c.send("p", "x", msg_id="a\n"),
        lambda: c.send("p", "x", msg_id="  "),
        lambda: c.get("p", "\u3000"),
        lambda: c.pull("p", batch=1001),
        lambda: c.nack("p", "a", delay_ms=1, dead_letter=True),
        lambda: c.touch("p", "a", ack_timeout_ms=0),
        lambda: c.ack("p", "a", retry=-1),
        lambda: c.ack_many("p", ["a"], retries=[1, 2]),
        lambda: c.ack_many("p", ["a"], retries=[100_002]),
        lambda: c.reschedule("p", "a"),
        lambda: c.set_topic_config("p", retry_backoff_ms=-1),
        lambda: c.dead_letters("p", limit=1001),
        lambda: c.redrive("p", [f"m{i}" for i in range(1001)]),
        lambda: c.purge_dead("p", [f"m{i}" for i in range(1001)]),
        lambda: c.restore("never-used"),
        lambda: c.restore(""),
        lambda: c.restore_msg("p", "never-sent"),
        lambda: c._run(Call("noSuchEndpoint", {}, lambda answer: answer, idempotent=True)),
        lambda: c._run(Call("pullMsg", {"topic": "p", "batch": "1_0"}, lambda answer: answer, idempotent=True)),
        lambda: c._run(Call("pullMsg", {"topic": "p", "batch": " 1"}, lambda answer: answer, idempotent=True)),
    )]))
    seen.append(("batch", [shown(r) if isinstance(r, Message) else (r.code, r.msg) for r in c.send_many([
        {"topic": "p", "msg": "ok", "msg_id": "batch-ok"}, {"topic": "p", "msg": "x", "priority": 99},
        {"topic": "p", "msg": "spaced", "msg_id": " spaced "}])]))
    seen.append(("spaced", shown(c.get("p", " spaced ")), c.get("p", "spaced")))
    seen.append(("config", c.topic_config("r")))
    return seen


def test_the_fake_answers_the_scenario_as_the_real_server_does(sdk_server, scanner_process):
    scanner_process("sdk-fake-parity").wait_started()
    with Client(sdk_server) as client:
        real = scenario(Real(client))
    fake_side = Fake(FakeServer(settings=Settings(ended_retention_millis=TEST_CONFIG["ENDED_RETENTION_MILLIS"])))
    with fake_side.client:
        fake = scenario(fake_side)
    for step, (on_real, on_fake) in enumerate(zip(real, fake)):
        assert on_fake == on_real, f"step {step} differs"
    assert len(fake) == len(real)
    # And the scenario shows what it means to (not only that both agree).
    observed = dict((step[0], step[1:]) for step in real if step[0] in ("resent after ack", "touch errors"))
    assert observed["resent after ack"][0][2] == ACKED
    assert observed["touch errors"][0][:2] == ("Conflict", 409)
    dead_r = next(step[1] for step in real if step[0] == "dead" and step[1][0][0][0] == "r1")
    assert [(m[0], m[2], reason) for m, reason in dead_r] == [
        ("r1", EXHAUSTED, "retries_exhausted"), ("r2", EXHAUSTED, "retries_exhausted"),
        ("r3", EXHAUSTED, "dead_lettered")]


def schedule_shown(schedule, start_from: str | None = "create") -> tuple | None:
    """What of a schedule does not depend on when the scenario ran: its fields, its start after
    its creation or last update (`start_from`; None: as it is, a start given), and an interval
    schedule's next fire times after its start (a cron schedule's are left out: the fake
    computes no cron ticks)."""
    if schedule is None:
        return None
    start = schedule.start_time
    if start is not None and start_from is not None:
        start -= schedule.create_time if start_from == "create" else schedule.update_time
    fires = (tuple(t - schedule.start_time for t in schedule.next_fire_times) if schedule.every_ms is not None
             else None)
    return (schedule.schedule_id, schedule.topic, schedule.msg, schedule.cron, schedule.timezone, schedule.every_ms,
            start, schedule.end_time, schedule.catch_up, schedule.priority, schedule.ttl_ms, schedule.max_retry,
            schedule.paused, fires)


def schedule_scenario(client: Client) -> list:
    c, seen = client, []
    seen.append(("created", schedule_shown(c.create_schedule("p.every", "sched", "tick", every=3600, priority=2,
                                                             ttl=60, max_retry=3, catch_up="all"))))
    seen.append(("created", schedule_shown(c.create_schedule("p:cron", "sched", "{}", cron="15 3 * * mon-fri",
                                                             timezone="America/New_York", end=4_000_000_000_000))))
    seen.append(("paused", schedule_shown(c.create_schedule("p_paused", "other", "x", every=60, paused=True,
                                                            start=3_000_000_000_000), None)))
    seen.append(("got", schedule_shown(c.get_schedule("p.every")), c.get_schedule("nope")))
    seen.append(("listed", [schedule_shown(s, None if s.schedule_id == "p_paused" else "create")
                            for s in c.list_schedules().schedules]))
    first = c.list_schedules(limit=2)
    seen.append(("page", [s.schedule_id for s in first.schedules], first.next_cursor,
                 [s.schedule_id for s in c.list_schedules(limit=2, cursor=first.next_cursor).schedules]))
    seen.append(("topic", [s.schedule_id for s in c.list_schedules("other").schedules]))
    seen.append(("updated", schedule_shown(c.update_schedule("p.every", every=7200, priority=0, end=0))))
    seen.append(("to cron", schedule_shown(c.update_schedule("p.every", cron="0 0 1 1 *"))))
    seen.append(("to interval", schedule_shown(c.update_schedule("p:cron", every=60), "update")))
    paused = c.pause_schedule("p:cron")  # its start: one interval after the update before
    seen.append(("pause", (paused.paused, paused.next_fire_times, paused.every_ms, paused.cron),
                 schedule_shown(c.resume_schedule("p_paused"), None)))
    seen.append(("deleted", c.delete_schedule("p_paused"), c.delete_schedule("p_paused")))
    seen.append(("errors", [error_of(action) for action in (
        lambda: c.create_schedule("p.every", "sched", "again", every=60),
        lambda: c.create_schedule("has space", "sched", "x", every=60),
        lambda: c.create_schedule("x" * 129, "sched", "x", every=60),
        lambda: c.create_schedule("s", "", "x", every=60),
        lambda: c.create_schedule("s", "sched", "", every=60),
        lambda: c.create_schedule("s", "sched", "x"),
        lambda: c.create_schedule("s", "sched", "x", cron="* * * * *", every=60),
        lambda: c.create_schedule("s", "sched", "x", every=60, timezone="UTC"),
        lambda: c.update_schedule("p.every", every=60, timezone="UTC"),
        lambda: c.update_schedule("p:cron", timezone="Europe/Berlin"),  # an interval schedule since "to interval"
        lambda: c.create_schedule("s", "sched", "x", every=0.999),
        lambda: c.create_schedule("s", "sched", "x", every=0),
        lambda: c.create_schedule("s", "sched", "x", every=60, priority=10),
        lambda: c.create_schedule("s", "sched", "x", every=60, catch_up="never"),
        lambda: c.create_schedule("s", "sched", "x", every=60, max_retry=-2),
        lambda: c.create_schedule("s", "sched", "x", every=60, start=2_000_000_000_000, end=1_000_000_000_000),
        lambda: c.create_schedule("s", "sched", "x", every=60, end=1_000_000_000_000),
        lambda: c.create_schedule("s", "sched", "x", every=60, start=1_000_000_000_000, end=1_000_000_060_000),
        lambda: c.create_schedule("s", "sched", "x", cron="* * * * *", end=1_000_000_000_000),
        lambda: c.update_schedule("p.every", end=1_000_000_000_000),
        lambda: c.create_schedule("s", "sched", "x", cron="* * * * *", timezone="Nowhere/City"),
        lambda: c.create_schedule("s", "sched", "x", cron="*/5 * * *"),
        lambda: c.create_schedule("s", "sched", "x", cron="@hourly"),
        lambda: c.create_schedule("s", "sched", "x", cron="0 24 * * *"),
        lambda: c.create_schedule("s", "sched", "x", cron="0 0 * * fri-mon"),
        lambda: c.create_schedule("s", "sched", "x", cron="0 0 * smarch *"),
        lambda: c.create_schedule("s", "sched", "x", cron="*/0 * * * *"),
        lambda: c.create_schedule("s", "sched", "x", cron="0 0 31 4,6 *"),
        lambda: c.get_schedule("bad id"),
        lambda: c.update_schedule("p.every"),
        lambda: c.update_schedule("nope", priority=1),
        lambda: c.update_schedule("p.every", cron="1 2 3"),
        lambda: c.pause_schedule("nope"),
        lambda: c.resume_schedule("nope"),
        lambda: c.list_schedules(limit=0),
        lambda: c.list_schedules(cursor="not a cursor"),
    )]))
    seen.append(("left", [s.schedule_id for s in c.list_schedules().schedules]))
    return seen


def test_the_fake_answers_schedule_calls_as_the_real_server_does(sdk_server):
    with Client(sdk_server) as client:
        real = schedule_scenario(client)
    with FakeServer().client() as client:
        fake = schedule_scenario(client)
    for step, (on_real, on_fake) in enumerate(zip(real, fake)):
        if step == len(real) - 2:  # the errors, one by one
            for i, (real_error, fake_error) in enumerate(zip(on_real[1], on_fake[1])):
                assert fake_error == real_error, f"error {i}: the fake answered {fake_error}, the server {real_error}"
        assert on_fake == on_real, f"step {step} differs:\nfake {on_fake}\nreal {on_real}"
    assert len(fake) == len(real)
