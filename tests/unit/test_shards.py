"""Which shard holds a message, and where a shard's keys live (live/shards.py, live/keys.py)."""
import fnmatch
from collections import Counter

import pytest
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from delayqueue.live import stats
from delayqueue.live.keys import Shard, namespace_keys
from delayqueue.live.shards import counts_shares, deal_hours, message_shards, shard_of, topic_shards


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
    from delayqueue.live.keys import least_position
    from delayqueue.workers.loader import loading_topics

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
    assert least_position(["5:9", None, "5:10", "4:99:2"]) == "4:99:2" and least_position([None]) is None


# A 3-master cluster after `redis-cli --cluster rebalance` gave a fourth master slots from each.
REBALANCED = [(0, 1364, "d"), (1365, 5460, "a"), (5461, 6826, "d"), (6827, 10922, "b"), (10923, 12287, "d"),
              (12288, 16383, "c")]


def owner(slot: int) -> str:
    return next(master for first, last, master in REBALANCED if first <= slot <= last)


@pytest.mark.parametrize("count", [2, 4, 6, 8, 256])
def test_a_placement_spreads_the_shards_over_every_master_whatever_slots_each_owns(count):
    from delayqueue.live.shards import spread

    ranges = spread(count, REBALANCED)
    assert len(ranges) == count and all(low < high for low, high in ranges)
    masters = [owner(low) for low, _high in ranges]
    assert all(owner(high - 1) == master for (_low, high), master in zip(ranges, masters))  # each in one master's
    per_master = Counter(masters)
    assert len(per_master) == min(count, 4) and max(per_master.values()) - min(per_master.values()) <= 1
    # Equal runs (the shards' slots without a placement) put 4 shards on 3 of these 4 masters.
    assert len({owner(shard_slot(Shard("t", 4, i))) for i in range(4)}) == 3


def shard_slot(shard: Shard) -> int:
    return key_slot(namespace_keys("default").topic(shard).msgs.encode())


def test_a_placed_shards_keys_land_in_its_range():
    from delayqueue.live.keys import place_shards
    from delayqueue.live.shards import spread

    ranges = spread(4, REBALANCED)
    place_shards("default", "placed", 4, ranges)
    for i, (low, high) in enumerate(ranges):
        assert low <= shard_slot(Shard("placed", 4, i)) < high
    assert {owner(shard_slot(Shard("placed", 4, i))) for i in range(4)} == {"a", "b", "c", "d"}
    assert spread(5, [(0, 16383, "m")]) == [(i * 16384 // 5, (i + 1) * 16384 // 5) for i in range(5)]
    assert len(set(spread(3, [(0, 1, "a"), (2, 16383, "b")]))) == 3  # a master of 2 slots takes 2 shards in them


def test_a_shards_wake_channel_names_it_and_the_schedule_channel_every_shard():
    ns = namespace_keys("ns")
    assert ns.wake_channel("t") == ns.wake_channel(Shard("t")) == ns.schedule_channel
    assert ns.shard_of_wake(ns.schedule_channel, "t") is None  # every key set of the topic
    channel = ns.wake_channel(Shard("t", 12, 7))
    assert fnmatch.fnmatchcase(channel, ns.schedule_shards) and not fnmatch.fnmatchcase(ns.schedule_channel,
                                                                                          ns.schedule_shards)
    assert ns.shard_of_wake(channel, "t") == Shard("t", 12, 7)


def test_a_bound_is_shared_over_the_shards_of_every_count_the_given_up_ones_kept():
    def shares(bound: int, counts: tuple[int, ...]) -> list[int]:
        return list(counts_shares(bound, "t", counts).values())

    assert shares(4, (3,)) == [2, 1, 1] and shares(1, (3,)) == [1, 1, 1]  # one count: each kept
    assert sum(shares(6, (4, 3))) == 6 and sum(shares(20, (4, 3))) == 20
    # Under a bound below the shards of both, the given-up count's come first, each kept.
    by_shard = counts_shares(2, "t", (4, 3))
    assert [by_shard[Shard("t", 3, i)] for i in range(3)] == [1, 1, 1]
    assert [by_shard[Shard("t", 4, i)] for i in range(4)] == [0, 0, 0, 0]
    assert set(counts_shares(0, "t", (4, 3)).values()) == {0}  # no bound


def test_a_cold_count_is_dealt_over_the_shards_in_turn_hour_by_hour():
    """Nine hours of one message each go one to a shard in turn (dealt per hour alone, the first
    shard took all nine), and a signed hour below 0 is dealt with the others, adding up the same."""
    assert deal_hours({hour: 1 for hour in range(9)}, 3) == [{0: 1, 3: 1, 6: 1}, {1: 1, 4: 1, 7: 1}, {2: 1, 5: 1, 8: 1}]
    assert deal_hours({5: 7}, 3) == [{5: 3}, {5: 2}, {5: 2}]
    assert deal_hours({5: 7}, 3, first=4) == [{5: 2}, {5: 3}, {5: 2}]  # a part of its own to start from
    dealt = deal_hours({1: -4, 2: 5, 3: 1}, 3)
    assert [sum(part.values()) for part in dealt] == [1, 1, 0]
    assert {hour: sum(part.get(hour, 0) for part in dealt) for hour in (1, 2, 3)} == {1: -4, 2: 5, 3: 1}
    assert deal_hours({7: 2}, 1) == [{7: 2}]
