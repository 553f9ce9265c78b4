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


def bound_share(bound: int, parts: int, index: int, kept: bool = True) -> int:
    """Part `index`'s share of a bound `parts` parts hold together (a live cap, a push concurrency; 0:
    none): the shares add up to it (shares rounded up passed it: 3 parts of 4 took 6), yet one at
    least if `kept`, as a part with none could never take anything."""
    share, extra = divmod(bound, parts)
    return max(share + (index < extra), min(bound, 1) if kept else 0)


def counts_shares(bound: int, topic: str, counts: Sequence[int]) -> dict[Shard, int]:
    """Each shard's share of a bound the shards of all the topic's counts hold together (a push
    topic's concurrency), bound_share's over them all: the shares add up to it. While counts given
    up drain, their shards come first and are kept (one at least, so that they empty and retire):
    under a bound below the shards of every count, the current count's last have none until then."""
    shards = topic_shards(topic, counts)
    current = counts[0] if len(counts) > 1 else 0  # the current count's shards, put last
    order = shards[current:] + shards[:current]
    return {shard: bound_share(bound, len(order), n, kept=n < len(order) - current) for n, shard in enumerate(order)}


def deal_hours(hours: dict[int, int], parts: int, first: int = 0) -> list[dict[int, int]]:
    """`hours` (hour -> cold messages) dealt over a count's `parts` shards in turn, hour by hour, from
    part `first` on (a retired count's shards, each dealing its own, start each at another): each
    part's hours add up to its count, and the counts differ by one at most (a signed hour below 0 is
    dealt so too). Each shard holds its share of the live cap against its part of the cold count,
    which cannot follow the msgIds (a restore counts them in PostgreSQL, which cannot compute crc32; a
    retired count's part is a number): the parts are signed and only add up together, and the loader
    corrects each as it brings its messages in."""
    dealt: list[dict[int, int]] = [{} for _ in range(parts)]
    first %= parts  # the part the hour's first message goes to
    for hour, n in sorted(hours.items()):
        share, extra = divmod(n, parts)
        for index, part in enumerate(dealt):
            if got := share + ((index - first) % parts < extra):
                part[hour] = got
        first = (first + n) % parts
    return dealt


def topic_shards(topic: str, counts: Sequence[int]) -> list[Shard]:
    """Every key set of the counts, those of the first count first."""
    return [Shard(topic, count, index) for count in counts for index in range(count)]


def spread(count: int, owners: Sequence[tuple[int, int, str]]) -> list[tuple[int, int]]:
    """Slot ranges [low, high) for the `count` shards of a topic, over a cluster whose masters own
    the slots `owners` ((first, last, master), CLUSTER SLOTS' runs): the masters take the shards
    in turn, in the order of their first slots, and a master's shards split its longest run of
    slots between them. The shards so sit on as many masters as there are, whatever runs each
    owns (after `redis-cli --cluster rebalance` added one, a master's slots are in pieces)."""
    runs: dict[str, list[tuple[int, int]]] = {}
    for first, last, master in sorted(owners):
        runs.setdefault(master, []).append((first, last + 1))
    masters = list(runs)
    mine: dict[str, list[int]] = {}
    for index in range(count):
        mine.setdefault(masters[index % len(masters)], []).append(index)
    ranges: list[tuple[int, int]] = [(0, 0)] * count
    for master, indexes in mine.items():
        low, high = max(runs[master], key=lambda run: run[1] - run[0])
        parts = min(len(indexes), high - low)  # more shards than slots in the run: some share a range
        for n, index in enumerate(indexes):
            part = n % parts
            ranges[index] = (low + part * (high - low) // parts, low + (part + 1) * (high - low) // parts)
    return ranges
