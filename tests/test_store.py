"""The script layer: calls made together share one round trip, and one bad call fails alone."""
import asyncio

from delayqueue import store
from delayqueue.services import NewMessage, _prepare, _send_call

from .conftest import make_runtime


def send_call(runtime, topic):
    return _send_call(runtime, _prepare(runtime, NewMessage(topic=topic, msg="ok", delay_millis=0), 1_000))


async def test_concurrent_calls_share_a_round_trip_and_fail_alone(rt):
    good = send_call(rt, "t")
    bad = ("send", good[1], ["id", "x", "not-a-number", 1000, 1, "t", "c1", "c2", 1000, 1_000, ""])
    results = await asyncio.gather(
        rt.call(*good), rt.call(*bad), rt.call(*send_call(rt, "u")),
        return_exceptions=True,
    )
    assert results[0][0] == 1 and results[2][0] == 1
    assert isinstance(results[1], Exception)  # the Lua error reaches its own caller only


async def test_a_lost_connection_fails_every_waiting_caller():
    runtime = make_runtime("redis://127.0.0.1:1/0")  # nothing listens there
    call = send_call(runtime, "t")
    results = await asyncio.gather(*[runtime.call(*call) for _ in range(3)], return_exceptions=True)
    assert all(isinstance(r, Exception) for r in results)
    await runtime.close()


async def test_script_sources_inline_their_includes():
    for script in store.SCRIPTS.values():
        assert not store._INCLUDE.search(script.source), script.name
    assert "local function end_message" in store.SCRIPTS["pull"].source
