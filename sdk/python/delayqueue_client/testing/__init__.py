"""Testing without a server: `FakeServer`, the server's message rules in memory on a clock the
test moves, under real `Client`s and `AsyncClient`s.

    from delayqueue_client.testing import FakeServer

    server = FakeServer()
    client = server.client()                      # a real Client; its transport is the fake
    client.send("orders", "cancel 42", delay_ms=30_000)
    assert client.pull("orders") == []
    server.clock.advance(30)                      # seconds (or a timedelta)
    [message] = client.pull("orders")

The fake plugs in below HTTP (`client._http`), so the SDK's retries, answer parsing, errors,
producer and Worker run as they do against a server. `server.async_client()` gives an
AsyncClient; pytest fixtures are in `delayqueue_client.testing.pytest_plugin`.

What it answers as the server does (the same envelopes, codes and `msg` texts): sendMsg and
sendMsgBatch (delayMillis or triggerTime, TTL, maxRetry, priority, msgId dedupe: a resend answers
the message holding the msgId while it is live, for the dedupe window after it ended, and while it
is a dead letter), pullMsg and longPollingMsg (highest priority first, oldest first within one),
ackMsg and ackMsgBatch (ack; nack at once, after delayMillis or after the topic's retry backoff;
deadLetter; a nack's `reason`, shown as the dead letter's deadDetail; `retry`/`retries` naming the
delivery settled), touchMsg, rescheduleMsg,
getMsg, deleteMsg, getTopicConfig and setTopicConfig, pauseTopic, resumeTopic, purgeTopic,
getTopicInfo and getTopicInfoList, getDeadMsgList, redriveDeadMsg, getRedriveTask and
purgeDeadMsg; createSchedule, getSchedule, listSchedules, updateSchedule, pauseSchedule,
resumeSchedule and deleteSchedule (the checks of a cron rule and its time zone included, 409 for
a taken scheduleId, 429 over `Settings.max_schedules`); the validation errors (code 400) of the
common bad inputs; an unknown endpoint as Django's HTTP 404 page. Time is `server.clock`: it stands still until `advance()`, which runs what
falls due, times out (ack deadline: redelivery, with the topic's backoff, until maxRetry) and
expires meanwhile in the order of its times; `FakeServer(real_time=True)` follows the wall clock.
An interval schedule's ticks become messages on that clock as the server's planner sends them:
up to 10 s ahead of each tick, msgId `<scheduleId>@<tick>` (`#<generation>` after a change), the
tick as triggerTime; a change withdraws those sent ahead and not yet due.

Where it differs from the server:
- No API tokens, scopes, namespaces, rate limits, live-message caps or topic caps: every call is
  allowed (as DELAYQUEUE_AUTH=open), and a resend's answer always carries the stored body.
  produceRatePerSecond, consumeRatePerSecond and maxLiveMessages are kept and answered, not enforced.
- No push delivery: setTopicConfig with pushUrl or rotatePushSecret answers code 400.
- Dead letters are listed at once (the server's log writer lags up to 100 ms) and a redrive is
  done when redriveDeadMsg answers (the server's scanners pace it at maxPerSecond); redriven
  messages get produceTime and triggerTime now.
- Ended messages are kept for the ended retention, five minutes, as the server keeps them
  (getMsg, touchMsg and rescheduleMsg find them until then); restore/restoreMsg have nothing to
  bring back (every live message counts as alreadyLive). getMonitorData answers empty lists.
- On a clock that stands still, a long poll with nothing ready waits at most `max_real_wait`
  (0.05 s) of real time for a send, an ack or an advance, then answers an empty list, so a Worker
  idles cheaply and stops soon; with `real_time=True` it waits its longPollingTimeoutMillis.
- purgeDeadMsg frees a msgId at once (the server's Redis answers a resend with the ended message
  for its ended retention, five minutes).
- Parameters come only as the SDK sends them, a JSON body; the DRF texts of exotic inputs
  (a number where a list belongs, say) may be worded differently, with the same code 400, and of
  two bad parameters the fake may name another first.
- The retry backoff's jitter comes from `FakeServer(seed=...)`; `jitter=False` waits the full backoff.
- Cron schedules are stored, checked and answered, but their ticks never fire and their
  nextFireTimes is empty: the fake has no cron engine (so of a cron schedule whose window holds
  no tick, it refuses only one whose endTime has passed; the server names any). Interval schedules fire every tick once,
  however far the clock jumps (its planner never stops), so catchUp is kept and answered but
  never applies.
- A schedule's msg over the message size limit is code 400 at createSchedule and updateSchedule
  (each of its ticks would be refused).

tests/integration/test_sdk_fake_parity.py runs one scenario on this fake and on the real server
and compares every answer, so that what is not listed here stays the same.
"""
from delayqueue_client.testing.clock import FakeClock
from delayqueue_client.testing.server import FakeServer, Settings
from delayqueue_client.testing.transport import AsyncFakeTransport, FakeTransport

__all__ = ["AsyncFakeTransport", "FakeClock", "FakeServer", "FakeTransport", "Settings"]
