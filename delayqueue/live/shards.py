"""Sharded topics: which of a topic's key sets holds a message.

A topic of one shard keeps every message in its own keys (Shard(topic)). With `shards` n > 1
(setTopicConfig), a message lives in shard crc32(msgId) mod n of n key sets, each under a hash
tag of its own (keys.shard_tag), so a msgId finds its shard without a lookup table. A topic whose
shard count changed keeps the counts it gave up (TopicSettings.draining_shards) until their
shards are empty: a message is looked for in its shard of each count, the current one first."""
import zlib
from collections.abc import Sequence

from delayqueue.live.keys import Shard


def shard_of(topic: str, msg_id: str, count: int) -> Shard:
    """The shard of `count` a msgId belongs to."""
    return Shard(topic, count, zlib.crc32(msg_id.encode()) % count) if count > 1 else Shard(topic)


def message_shards(topic: str, msg_id: str, counts: Sequence[int]) -> list[Shard]:
    """Where a msgId may be: its shard of each count, in the counts' order."""
    return [shard_of(topic, msg_id, count) for count in counts]


def topic_shards(topic: str, counts: Sequence[int]) -> list[Shard]:
    """Every key set of the counts, those of the first count first."""
    return [Shard(topic, count, index) for count in counts for index in range(count)]
