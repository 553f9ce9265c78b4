"""The operator settings every process holds (stores/refreshed.py) are refreshed from the rows
changed since the last read (issue 29 item 4): a change another process makes is seen, a deleted
row is seen, and a refresh while nothing changed reads no row at all. Real PostgreSQL."""
import asyncio
import io
import subprocess
import sys

from asgiref.sync import sync_to_async
from django.core.management import call_command

from delayqueue.config.settings import DEFAULT_DATABASE
from delayqueue.live.keys import namespace_keys
from delayqueue.models import Limit, TopicConfig
from delayqueue.stores.limits import LimitCache, Limits
from delayqueue.stores.rows import save_topic_config
from delayqueue.stores.topic_settings import TopicConfigCache
from tests.helpers import ROOT, scanner_env, wait_until

NAMESPACE = "refreshed"


def set_limits(*argv: str) -> None:
    """`manage.py set_limits` in a process of its own."""
    subprocess.run([sys.executable, "manage.py", "set_limits", "--namespace", NAMESPACE, *argv], cwd=ROOT,
                   env=scanner_env(), check=True, capture_output=True)


@sync_to_async
def set_limits_here(*argv: str) -> None:
    """The same command in this process, on a connection of Django's (not the caches')."""
    call_command("set_limits", "--namespace", NAMESPACE, *argv, stdout=io.StringIO())


async def test_a_change_another_process_makes_is_seen_and_a_quiet_refresh_reads_no_row(clean_state):
    limits = LimitCache(namespace_keys(NAMESPACE), DEFAULT_DATABASE)
    try:
        await set_limits_here("--topic", "a", "--produce-rate", "5")
        await set_limits_here("--topic", "b", "--max-live", "7")
        assert await limits.table() == {"a": Limits(produce_rate=5), "b": Limits(max_live=7)}  # the first, whole read

        await asyncio.to_thread(set_limits, "--topic", "a", "--produce-rate", "9")

        async def seen():
            return (await limits.table()).get("a") == Limits(produce_rate=9)
        await wait_until(seen, what="the other process' change")  # by the refresher, on its own
        assert limits.current["b"] == Limits(max_live=7)  # the row that did not change stays

        async def quiet():
            await limits.fresh()
            return limits.rows_read == 0
        # Nothing changes: the refresh's statement answers no row (once no transaction that
        # could still commit a change is open, which the wait allows for).
        await wait_until(quiet, what="a refresh reading no row")
        assert limits.current == {"a": Limits(produce_rate=9), "b": Limits(max_live=7)}
        await limits.fresh()
        assert limits.rows_read == 0
    finally:
        await limits.close()


async def test_a_deleted_row_is_seen(clean_state):
    ns = namespace_keys(NAMESPACE)
    limits, settings = LimitCache(ns, DEFAULT_DATABASE), TopicConfigCache(ns, DEFAULT_DATABASE)
    try:
        await set_limits_here("--topic", "gone", "--produce-rate", "5")
        await sync_to_async(save_topic_config)(namespace=NAMESPACE, topic="gone", changes={"max_retry": 2}, limits={}, by_operator=True)
        await sync_to_async(save_topic_config)(namespace=NAMESPACE, topic="kept", changes={"max_retry": 3}, limits={}, by_operator=True)
        # Read by hand alone (no refresher): each read below is the first to see what changed.
        assert "gone" in await limits.fresh() and set(await settings.fresh()) == {"gone", "kept"}

        await set_limits_here("--topic", "gone", "--produce-rate", "0")  # its last limit: the row goes
        await sync_to_async(TopicConfig.objects.filter(namespace=NAMESPACE, topic="gone").delete)()
        assert await limits.fresh() == {}
        assert limits.rows_read >= 1  # the deletion, read as a change
        assert set(await settings.fresh()) == {"kept"}
        assert settings.current["kept"].max_retry == 3

        # Deleted and made again between two reads: there again.
        await sync_to_async(save_topic_config)(namespace=NAMESPACE, topic="gone", changes={"max_retry": 4}, limits={}, by_operator=True)
        await sync_to_async(TopicConfig.objects.filter(namespace=NAMESPACE, topic="kept").delete)()
        await sync_to_async(save_topic_config)(namespace=NAMESPACE, topic="kept", changes={"max_retry": 5}, limits={}, by_operator=True)
        table = await settings.fresh()
        assert (table["gone"].max_retry, table["kept"].max_retry) == (4, 5)
    finally:
        await limits.close()
        await settings.close()


async def test_a_change_committed_after_a_later_one_is_not_missed(clean_state):
    """A writer that took its transaction id first but commits after a refresh read a later
    writer's change: the next refresh still reads it (the snapshot's xmin, not the highest id seen)."""
    settings = TopicConfigCache(namespace_keys(NAMESPACE), DEFAULT_DATABASE)
    try:
        assert await settings.fresh() == {}
        slow_started, slow_may_commit = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()

        def slow_writer():
            from django.db import connection, transaction
            try:
                with transaction.atomic():
                    TopicConfig.objects.create(namespace=NAMESPACE, topic="slow", max_retry=1)
                    loop.call_soon_threadsafe(slow_started.set)
                    asyncio.run_coroutine_threadsafe(slow_may_commit.wait(), loop).result(30)
            finally:
                connection.close()

        slow = asyncio.ensure_future(asyncio.to_thread(slow_writer))
        await asyncio.wait_for(slow_started.wait(), 30)
        await sync_to_async(save_topic_config)(namespace=NAMESPACE, topic="quick", changes={"max_retry": 2}, limits={}, by_operator=True)
        assert set(await settings.fresh()) == {"quick"}
        slow_may_commit.set()
        await slow
        assert set(await settings.fresh()) == {"quick", "slow"}
    finally:
        await settings.close()


async def test_a_row_moved_to_another_topic_leaves_the_old_topic(clean_state):
    """The admin's Limits change page can give a row another topic (an UPDATE, no deletion): the
    old topic's limits are out of force at the next refresh, not at the next whole read."""
    limits = LimitCache(namespace_keys(NAMESPACE), DEFAULT_DATABASE)
    try:
        await set_limits_here("--topic", "old", "--produce-rate", "5")
        assert await limits.fresh() == {"old": Limits(produce_rate=5)}
        await sync_to_async(Limit.objects.filter(namespace=NAMESPACE, topic="old").update)(topic="new")
        assert await limits.fresh() == {"new": Limits(produce_rate=5)}
    finally:
        await limits.close()
