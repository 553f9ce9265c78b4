"""Which shard holds a message, and where a shard's keys live (live/shards.py, live/keys.py)."""
from collections import Counter

import pytest
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from delayqueue.live import stats
from delayqueue.live.keys import Shard, namespace_keys
from delayqueue.live.shards import message_shards, shard_of, topic_shards


def test_a_msg_id_has_one_shard_per_count_and_keeps_it():
    assert shard_of("t", "abc", 1) == Shard("t")
    assert shard_of("t", "abc", 7) == shard_of("t", "abc", 7)
    assert all(0 <= shard_of("t", f"m{i}", 7).index < 7 for i in range(100))


def test_msg_ids_spread_evenly_over_the_shards():
    counts = Counter(shard_of("t", f"order-{i}", 6).index for i in range(60_000))
    assert set(counts) == set(range(6))
    assert max(counts.values()) < 1.05 * 10_000 and min(counts.values()) > 0.95 * 10_000


def test_a_message_is_looked_for_in_its_shard_of_each_count_the_current_first():
    assert message_shards("t", "abc", (4, 1, 2)) == [shard_of("t", "abc", 4), Shard("t"), shard_of("t", "abc", 2)]
    assert topic_shards("t", (2, 1)) == [Shard("t", 2, 0), Shard("t", 2, 1), Shard("t")]


def test_an_unsharded_topic_keeps_its_keys():
    ns = namespace_keys("default")
    assert ns.topic(Shard("orders")) == ns.topic("orders")
    assert ns.topic("orders").waiting == "dq:{default:orders}:waiting"


@pytest.mark.parametrize("count", [2, 3, 6, 256])
def test_shard_i_of_n_lands_in_the_middle_of_the_i_th_run_of_slots(count):
    ns = namespace_keys("default")
    width = REDIS_CLUSTER_HASH_SLOTS / count
    for index in range(count):
        keys = ns.topic(Shard("orders", count, index))
        slot = key_slot(keys.msgs.encode())
        assert index * width + width / 4 - 1 <= slot < (index + 1) * width - width / 4 + 1
        assert {key_slot(key.encode()) for key in (keys.waiting, keys.ready, keys.meta, keys.events)} == {slot}


def test_three_shards_sit_on_three_masters_of_equal_slot_runs():
    """The run of slots each master owns after `redis-cli --cluster create` of 3 masters."""
    owners = [(0, 5460), (5461, 10922), (10923, 16383)]
    ns = namespace_keys("default")
    for topic in ("a", "orders", "x" * 200):
        slots = [key_slot(ns.topic(Shard(topic, 3, i)).msgs.encode()) for i in range(3)]
        assert {next(n for n, (low, high) in enumerate(owners) if low <= slot <= high) for slot in slots} == {0, 1, 2}


def test_a_sharded_topics_stats_add_up_and_keep_the_greatest_max():
    one = {"12:sendMsg": "3", "12:pullGap:max": "40", "12:pullGap:sum": "60", "m5:lateness:max": "7"}
    two = {"12:sendMsg": "4", "12:pullGap:max": "25", "12:pullGap:sum": "30", "total:sendMsg": "9"}
    assert stats.added([one, two]) == {"12:sendMsg": 7, "12:pullGap:max": 40, "12:pullGap:sum": 90,
                                       "m5:lateness:max": 7, "total:sendMsg": 9}


def test_a_topic_is_loaded_by_the_holder_of_its_current_counts_first_shard_once_settled():
    from delayqueue.core.constants import SHARDS_SETTLE_MILLIS
    from delayqueue.stores.topic_settings import TopicSettings
    from delayqueue.workers.loader import least, loading_topics

    now = 1_000_000
    settled = now - SHARDS_SETTLE_MILLIS - 1
    settings = {"b": TopicSettings(shards=3, draining_shards=(1,), shards_changed_at=settled),
                "c": TopicSettings(shards=2, draining_shards=(1,), shards_changed_at=now - 10)}
    held = [Shard("a"), Shard("b"), Shard("b", 3, 1), Shard("c", 2, 0), Shard("d", 2, 0)]
    # "a" unsharded; "b" by its count of 3's first shard; "c" not yet: it was resharded 10 ms ago;
    # "d" has one shard (its settings unread say so), not the held one of 2.
    assert loading_topics(held, settings, now) == ["a"]
    assert loading_topics([*held, Shard("b", 3, 0)], settings, now) == ["a", "b"]
    assert loading_topics([Shard("c", 2, 0)], settings, now + SHARDS_SETTLE_MILLIS) == ["c"]
    assert least(["5:9", "5:10", "4:99:2"]) == "4:99:2" and least([]) is None
