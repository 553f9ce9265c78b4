"""The script layer: calls made together share one round trip, and one bad call fails alone."""
import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from delayqueue.core.clock import now_millis
from delayqueue.core.messages import Message
from delayqueue.live import protocol as direct
from delayqueue.live import scripts
from delayqueue.services.send import MESSAGES_PER_CALL, SendRequest, prepared, run_sends
from tests.helpers import make_runtime, unsharded_calls


def _send_call(runtime, row):
    """The send script's call for one message (its reply: a list of one SendReply)."""
    [(call, _)] = unsharded_calls(runtime, [row])
    return call


def send_call(runtime, topic):
    return _send_call(runtime, prepared(runtime, SendRequest(topic=topic, msg="ok", delay_millis=0), 1_000, {}))


def evalsha(call):
    return direct.evalsha(call.script.sha, call.keys, call.args)


async def test_concurrent_calls_share_a_round_trip_and_fail_alone(rt):
    good = send_call(rt, "t")
    first = len(scripts.SEND.args)  # the message's msg_id, payload, trigger_time, ...
    bad = good._replace(args=[*good.args[:first], "another-id", good.args[first + 1], "not-a-number",
                              *good.args[first + 3:]])
    results = await asyncio.gather(
        rt.scripts.call(good), rt.scripts.call(bad), rt.scripts.call(send_call(rt, "u")),
        return_exceptions=True,
    )
    assert results[0][0].created and results[2][0].created
    assert isinstance(results[1], Exception)  # the Lua error reaches its own caller only


async def test_run_all_raises_the_first_error_and_sends_no_trip_after_the_one_that_failed(rt):
    good = send_call(rt, "t")
    first = len(scripts.SEND.args)
    bad = good._replace(args=[*good.args[:first], "bad-id", good.args[first + 1], "not-a-number",
                              *good.args[first + 3:]])
    with pytest.raises(Exception):
        await rt.scripts.run_all([send_call(rt, "a"), bad, send_call(rt, "b")], per_trip=2)
    assert await rt.redis.exists(rt.ns.topic("a").msgs) and not await rt.redis.exists(rt.ns.topic("b").msgs)
    replies = await rt.scripts.run_all([send_call(rt, "c"), send_call(rt, "d")], per_trip=1)
    assert [reply[0].created for reply in replies] == [True, True]


async def test_many_calls_in_flight_each_get_their_own_reply(single_rt):
    """The direct runner matches replies to calls by their order on the connection."""
    rt = single_rt
    now = now_millis()
    rows = [prepared(rt, SendRequest(topic="t", msg=f"payload {i}", delay_millis=60_000, msg_id=f"id{i}"), now, {})
            for i in range(200)]
    first = await asyncio.gather(*[rt.scripts.call(_send_call(rt, row)) for row in rows])
    assert all(r.created for [r] in first)
    # Sent again, each is a duplicate answered with the stored message: its own, by its msgId.
    again = await asyncio.gather(*[rt.scripts.call(_send_call(rt, row)) for row in reversed(rows)])
    stored = [r.stored for [r] in again]
    assert [(m.msg_id, m.payload) for m in stored] == [(row.msg_id, row.payload) for row in reversed(rows)]


async def test_a_lost_connection_fails_every_waiting_caller():
    runtime = make_runtime("redis://127.0.0.1:1/0", redis_timeout_millis=300)  # nothing listens there
    call = send_call(runtime, "t")
    results = await asyncio.gather(*[runtime.scripts.call(call) for _ in range(3)], return_exceptions=True)
    assert all(isinstance(r, Exception) for r in results)
    await runtime.close()


class WriteRecorder:
    """Stands in for the script connection's transport, keeping what each write carried."""

    def __init__(self, transport):
        self.transport, self.writes = transport, []

    def write(self, data):
        self.writes.append(data)
        self.transport.write(data)

    def __getattr__(self, name):
        return getattr(self.transport, name)


async def test_a_loop_turns_calls_share_writes_the_first_written_at_once(single_rt):
    """Each write wakes Redis: the first call of a turn is written at once (it waits for
    nothing), the others of that turn HELD_CALLS_MAX at a time and the rest when it ends, a
    pipeline at once with the calls held before it; every caller gets its own reply."""
    rt = single_rt
    await rt.scripts.call(send_call(rt, "warm-up"))  # connected
    protocol = rt.scripts._protocol
    recorder = protocol.transport = WriteRecorder(protocol.transport)
    lone = protocol.submit([evalsha(send_call(rt, "lone"))])
    assert len(recorder.writes) == 1  # before the loop had a turn
    assert (await lone)[0][2] == 1  # created (after newTopic and Redis' clock)
    recorder.writes.clear()
    now = now_millis()
    rows = [prepared(rt, SendRequest(topic="t", msg=f"m{i}", delay_millis=60_000, msg_id=f"turn{i}"), now, {})
            for i in range(10)]
    calls = [asyncio.ensure_future(rt.scripts.call(_send_call(rt, row))) for row in rows]  # all start in one turn
    assert all(r.created for [r] in await asyncio.gather(*calls))
    assert [data.count(b"EVALSHA") for data in recorder.writes] == [1, direct.HELD_CALLS_MAX, 9 - direct.HELD_CALLS_MAX]
    recorder.writes.clear()
    # Sent again, each is a duplicate answered with the stored message: its own, by its msgId.
    first, second = (protocol.submit([evalsha(_send_call(rt, row))]) for row in rows[:2])
    assert len(recorder.writes) == 1  # the second is held
    pipeline = protocol.submit([evalsha(_send_call(rt, row)) for row in rows[2:]])
    assert [data.count(b"EVALSHA") for data in recorder.writes] == [1, 1 + 8]  # at once, after the held one
    again = [*await first, *await second, *await pipeline]
    assert [Message.from_json(r[3]).msg_id for r in again] == [row.msg_id for row in rows]


async def test_a_call_on_a_lost_connection_fails_at_once(single_rt):
    rt = single_rt
    await rt.scripts.call(send_call(rt, "warm-up"))  # connected
    protocol = rt.scripts._protocol
    protocol.transport.close()
    await asyncio.sleep(0.05)  # connection_lost has run
    assert protocol.lost
    with pytest.raises(RedisConnectionError):
        await asyncio.wait_for(protocol.submit([evalsha(send_call(rt, "t"))]), 1)
    assert (await rt.scripts.call(send_call(rt, "t")))[0].created  # the runner connects again


def rows_of(rt, topic: str, delays: list[int], msg_ids: list[str] | None = None) -> list[Message]:
    now = now_millis()
    return [prepared(rt, SendRequest(topic=topic, msg=f"m{i}", delay_millis=delay,
                                     msg_id=msg_ids[i] if msg_ids else f"{topic}-{i}"), now, {})
            for i, delay in enumerate(delays)]


async def test_sends_of_one_topic_go_in_one_call_each_answered_as_its_own_call_would_be(rt):
    """A batch's messages of one topic share one call of the send script: a msgId the call already
    created answers as a live duplicate, and a cap reached within the call refuses the rest."""
    rows = [*rows_of(rt, "b", [0, 60_000, 0]), *rows_of(rt, "c", [0]),
            *rows_of(rt, "b", [0], ["b-1"])]
    calls = unsharded_calls(rt, rows)
    assert [positions for _, positions in calls] == [[0, 1, 2, 4], [3]]
    replies = [reply for call, _ in calls for reply in await rt.scripts.call(call)]
    assert [(r.created, r.status) for r in replies[:3]] == [(True, 2), (True, 1), (True, 2)]
    assert not replies[3].created and replies[3].stored.payload == "m1"  # b-1 again: the first one
    assert replies[4].created and replies[4].new_topic
    capped = rows_of(rt, "capped", [0] * 5)
    [(call, _)] = unsharded_calls(rt, capped, max_live=lambda topic: 3)
    replies = await rt.scripts.call(call)
    assert [r.created for r in replies] == [True, True, True, False, False]
    assert all(r.over_live_cap for r in replies[3:])
    assert await rt.redis.zcard(rt.ns.topic("capped").expiry) == 3
    # A topic's messages go MESSAGES_PER_CALL at a time: a call holds Redis for all of them.
    many = rows_of(rt, "many", [60_000] * (2 * MESSAGES_PER_CALL + 1))
    calls = unsharded_calls(rt, many)
    assert [len(positions) for _, positions in calls] == [MESSAGES_PER_CALL, MESSAGES_PER_CALL, 1]
    assert [i for _, positions in calls for i in positions] == list(range(len(many)))
    assert all(r.created for r in await run_sends(rt, calls))
    assert await rt.redis.zcard(rt.ns.topic("many").waiting) == len(many)


async def test_a_call_wakes_the_scanner_and_the_long_pollers_once(single_rt):
    """Its scanner is woken when any message of the call is due before what it sleeps towards,
    once; the long pollers once when the ready queue was empty."""
    rt = single_rt
    [(first, _)] = unsharded_calls(rt, rows_of(rt, "w", [60_000]))
    await rt.scripts.call(first)
    pubsub = rt.redis.pubsub()
    await pubsub.subscribe(rt.ns.schedule_channel, rt.ns.ready_channel)
    try:
        while await pubsub.get_message(timeout=0.2) is not None:
            pass  # the subscriptions' confirmations

        async def published() -> list[str]:
            seen = []
            while (message := await pubsub.get_message(timeout=0.2)) is not None:
                seen.append(message["channel"])
            return seen

        rounds = [([120_000, 90_000], []),  # later than the first: the scanner sleeps on
                  ([120_000, 30_000, 20_000], [rt.ns.schedule_channel]),
                  # ready, and expiring before every message so far
                  ([0, 0, 0], [rt.ns.ready_channel, rt.ns.schedule_channel])]
        for round_, (delays, expected) in enumerate(rounds):
            [(call, _)] = unsharded_calls(rt, rows_of(rt, "w", delays, [f"{round_}-{i}" for i in range(len(delays))]))
            assert all(r.created for r in await rt.scripts.call(call))
            assert await published() == expected, delays
    finally:
        await pubsub.aclose()
