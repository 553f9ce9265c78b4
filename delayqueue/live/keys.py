"""Redis key and channel names.

Every key of a topic carries the hash tag {namespace:topic}, so one topic lives in one
Redis Cluster slot and each Lua script (which gets all its keys in KEYS) runs on one node.
A sharded topic has a key set per shard besides (Shard), each under a hash tag of its own.
The topic goes into its keys encoded (key_text), and comes back out of a key or channel name
through topic_of_key_text; everything else (the registry, the scripts' ARGV, the message log)
holds the topic's real text.
"""
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from itertools import count as counting
from typing import NamedTuple

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

# A topic's keys are "<TOPIC_PREFIX>{<namespace>:<key_text(topic)>}:<name>"; its history channel
# is its events key with the last part swapped (the scripts derive it so, from this module's names).
TOPIC_PREFIX = "dq:"
EVENTS_SUFFIX = "events"
HISTORY_SUFFIX = "history"
READY_SUFFIX = "ready"  # the ready list, whose name the namespace's ready channel carries


# Percent-encoded inside key names: "{" and "}", so that a topic's hash tag is always the whole
# "namespace:topic" (Redis Cluster hashes from the first "{" to the next "}": a "}" in a topic
# would cut the tag short, and every topic sharing the text before it would share one slot) and
# the first "}" of a key ends its topic; the glob metacharacters "*?[]\\", so that a topic's key
# and channel names stand for themselves in a pattern (PSUBSCRIBE, SCAN MATCH); and "%", which
# keeps the encoding reversible. Every character the old rule allowed ([A-Za-z0-9._:-]) stays as
# it is, so existing topics keep their keys.
_KEY_UNSAFE = re.compile(r"[%{}*?\[\]\\]")
_PERCENT_ESCAPE = re.compile(r"%([0-9A-F]{2})")


def key_text(topic: str) -> str:
    """The topic as it stands inside its key names."""
    return _KEY_UNSAFE.sub(lambda m: f"%{ord(m[0]):02X}", topic)


def topic_of_key_text(text: str) -> str:
    """key_text's inverse."""
    return _PERCENT_ESCAPE.sub(lambda m: chr(int(m[1], 16)), text)


class Shard(NamedTuple):
    """One key set of a topic: shard `index` of the `count` its messages are spread over
    (live/shards.py). Shard(topic), the only one of count 1, is the topic's own keys."""

    topic: str
    count: int = 1
    index: int = 0

    def __str__(self) -> str:
        return self.topic if self.count == 1 else f"{self.topic} (shard {self.index + 1} of {self.count})"


# Inside a shard's hash tag, between the topic and "<count>.<index>.<salt>": key_text writes every
# "%" as "%25", so "%s" never stands in an encoded topic, and ends it unambiguously.
SHARD_MARK = "%s"
_SHARD_TAG = re.compile(re.escape(SHARD_MARK) + r"\d+\.\d+\.\d+$")


# (namespace, topic, shard count) -> the slot range [low, high) of each shard, where the count
# was placed over a cluster's masters (live/shards.spread): what the topic settings say, as the
# settings a process reads register them (stores/topic_settings.placed). A count without one
# takes equal runs (shard_tag).
_PLACEMENTS: dict[tuple[str, str, int], tuple[tuple[int, int], ...]] = {}


def place_shards(namespace: str, topic: str, count: int, ranges: Sequence[Sequence[int]]) -> None:
    """Registers where a count's shards were placed: their keys' tags land in those slot ranges."""
    placed = tuple((int(low), int(high)) for low, high in ranges)
    if len(placed) == count and _PLACEMENTS.get((namespace, topic, count)) != placed:
        _PLACEMENTS[(namespace, topic, count)] = placed
        shard_tag.cache_clear()
        topic_keys.cache_clear()


@lru_cache(maxsize=65_536)
def shard_tag(namespace: str, shard: Shard) -> str:
    """The hash tag of a shard's keys: the first salt that puts its slot in the range its count's
    placement gives it (place_shards), else in the middle half of the i-th of n equal runs of
    slots, where masters that own equal runs (as `redis-cli --cluster create` leaves them) have
    one each, rather than over slots that may all sit on one master."""
    base = f"{namespace}:{key_text(shard.topic)}"
    if shard.count == 1:
        return base
    base += f"{SHARD_MARK}{shard.count}.{shard.index}."
    placement = _PLACEMENTS.get((namespace, shard.topic, shard.count))
    if placement is not None:
        low, high = placement[shard.index]
    else:
        low = shard.index * REDIS_CLUSTER_HASH_SLOTS // shard.count
        high = (shard.index + 1) * REDIS_CLUSTER_HASH_SLOTS // shard.count
        margin = (high - low) // 4
        low, high = low + margin, high - margin
    return next(base + str(salt) for salt in counting() if low <= key_slot((base + str(salt)).encode()) < high)


class Meta(StrEnum):
    """The fields of a topic's meta hash (the scripts get them as the prelude's META table)."""

    REGISTERED = "registered"  # 1 while the topic is in its namespace's registry, 0 from its first send until
    # the sender has registered it (send.lua)
    LAST_ACTIVE = "last_active"  # ms of its last send or pull (topic retirement)
    LIVE_SHARE = "live_share"  # its share of the namespace's live-message cap (services/admission.py)
    # The copy of its settings the scripts act on (stores/topic_settings.MIRROR_FIELDS).
    RETRY_BACKOFF = "retry_backoff"
    RETRY_BACKOFF_MAX = "retry_backoff_max"
    DEAD_LETTER = "dead_letter"
    PAUSED = "paused"
    PUSH = "push"
    PUSH_URL = "push_url"
    PUSH_SECRET_ID = "push_secret_id"
    # The cold tier (workers/loader.py), only while DELAYQUEUE_HOT_WINDOW_MILLIS is or was on:
    HOT_UNTIL = "hot_until"  # ms: Redis holds every live message due by then (sends compare with it)
    # "<triggerTime ms>:<log row id>[:<fence>]": Redis holds every live row up to there (in the
    # waiting set or a queue): the API's paths take a message after it Redis does not hold as cold
    # (a purge adds the fence, purge_cold.lua)
    LOADED_TO = "loaded_to"
    # The same kind of position, at or after loaded_to: the loader has read every row up to there,
    # and a row between the two that Redis does not hold is in a packed list (includes/packed.lua).
    # None: the same as loaded_to.
    FETCHED_TO = "fetched_to"
    PACKED = "packed"  # entries in its packed lists (counted in COLD too)
    # "1" in the shards of a shard count the topic gave up (TopicSettings.draining_shards), "0" in
    # the current count's (services/topics.write_mirrors): a draining shard packs nothing and
    # moves its packed lists into its waiting set at once (load_cold.lua, unpack_due.lua), where
    # a lookup by msgId finds them; only the current count's lists are looked for in the log. A
    # process that finds "1" in a shard of the count it takes for current has a reshard to read
    # (services/messages.newer_counts).
    DRAINING = "draining"
    # Messages in the log only: each script that moves one in or out counts it; dropped once the
    # loader finds none left beyond hot_until (a topic is not retired while it is there).
    COLD = "cold"
    # "1" in every shard of a sharded topic (raise_hot.lua): its COLD is a signed part of the topic's
    # count; absent, COLD is the topic's own, which no script takes below 0 (includes/cold_count.lua).
    SIGNED = "signed"
    # A retired shard count's part of COLD (and its cold_hours) while the scanner hands it on:
    # [id, count, hour, count, ...] (hand_cold.lua); in the current count's shards, "handed:<that id>"
    # marks a part received (receive_cold.lua).
    HANDING = "handing"
    HANDED = "handed"


END_OF_MILLI = 2**63 - 1  # a row id after every row: "<ms>:<this>" is past every row due at that ms


def position(trigger_time: int, row_id: int = END_OF_MILLI) -> str:
    """A loaded_to: after the row (triggerTime, id), or after every row due by triggerTime."""
    return f"{trigger_time}:{row_id}"


def released_life(msg_id: str, produce_time: int) -> str:
    """A member of TopicKeys.released: one life of the msgId (the scripts build it as id .. ':' .. produced)."""
    return f"{msg_id}:{produce_time}"


def least_position(positions: Iterable[str | None]) -> str | None:
    """The first of loaded_to positions in the log's order (None: none), None when all are."""
    return min((at for at in positions if at is not None), key=parse_position, default=None)


def parse_position(text: str) -> tuple[int, int]:
    """The (triggerTime, row id) of a loaded_to; a fence number after them (purge_cold.lua's) is
    only there to be different."""
    trigger_time, row_id, *_fence = text.split(":")
    return int(trigger_time), int(row_id)


class Bucket(StrEnum):
    """The kinds of rate-limit token bucket in a `buckets` hash (the prelude's BUCKET table)."""

    PRODUCE = "produce"
    CONSUME = "consume"


@dataclass(frozen=True)
class TopicKeys:
    topic: str
    waiting: str  # ZSET msgId -> triggerTime
    ready: str  # LIST of msgIds of priority 0, LPUSH in, RPOP out
    prioritised: str  # ZSET ready msgIds of priority 1-9 -> band + arrival (includes/ready_queue.lua), only while any
    inflight: str  # ZSET msgId -> ack deadline
    msgs: str  # HASH msgId -> the message's stored record (includes/stored.lua, core/messages.stored)
    expiry: str  # ZSET msgId -> expireTime, live messages that can expire before due (includes/expiring.lua)
    ended: str  # ZSET msgId -> when the ended body may be purged
    meta: str  # HASH Meta's fields
    stats: str  # HASH "<interval>:<counter>" -> value
    lock: str  # STRING scanner lock token
    events: str  # STREAM lifecycle events waiting for the log writer (EVENTS_SUFFIX)
    history: str  # pub/sub channel: the events stream got its first entry (HISTORY_SUFFIX)
    buckets: str  # HASH the topic's rate-limit token buckets (includes/token_bucket.lua), only while in use
    # HASH hour (triggerTime // COLD_HOUR_MILLIS) -> the topic's cold messages due in it, alongside Meta.COLD
    cold_hours: str
    # ZSET second -> its first ms: the seconds of due time with a LIST "<packed>:<second>" of packed
    # waiting messages (includes/packed.lua)
    packed: str
    # ZSET "<msgId>:<produceTime>" -> when it may go: the lives deleteMsg released the bodies of, for the ended
    # retention (the key expires with it), which a restore does not bring back (lua/delete.lua, lua/restore.lua)
    released: str
    # ZSET msgId -> produceTime: the sends of about the last IN_FLIGHT_MILLIS that went to the log
    # only, counted in Meta.COLD (send.lua), for load_cold.lua; expires when none went so lately
    cold_sent: str


@dataclass(frozen=True)
class NamespaceKeys:
    namespace: str
    topics: str  # ZSET topic -> registration time
    ready_channel: str  # pub/sub: a topic's ready list became non-empty (its name: shard_of_ready)
    schedule_channel: str  # pub/sub: a topic has work earlier than its scanner expects (its name)
    schedule_shards: str  # pub/sub pattern: the channels of its shards' own such wakes (wake_channel)
    scanners: str  # HASH scanner token -> "<event-loop lag ms>:<reported at ms>"
    health: str  # HASH "<host>:offline" -> 1, "<host>:last_use" -> ms (camellia's health endpoints)
    marker: str  # STRING ms it was set: there for as long as Redis keeps its data
    data_lost: str  # STRING ms a scanner found Redis had lost its data; a full restore deletes it
    history_pattern: str  # pub/sub pattern matching every topic's history channel
    buckets: str  # HASH the namespace's rate-limit token buckets, only while in use
    live_pool: str  # HASH the room of its live-message cap no topic holds (lua/borrow_live.lua)
    throttled: str  # HASH "<limit>\t<topic>" -> messages its limits refused or held (services/admission.py)
    pushes: str  # HASH push attempts' outcomes and lateness per topic (live/push_counts.py)

    def topic(self, topic: str | Shard) -> TopicKeys:
        """A topic's own keys, or a shard's."""
        return topic_keys(self.namespace, *(topic if isinstance(topic, Shard) else (topic,)))

    def scanner_alive(self, token: str) -> str:
        """STRING set with a short TTL while the scanner with this lock token runs (its heartbeat)."""
        return f"dq:ns:{self.namespace}:alive:{token}"

    def long_polls(self, holder: str) -> str:
        """ZSET hold id -> ms its hold ends: the long polls one API token (its sha256) holds (services/caps.py)."""
        return f"dq:ns:{self.namespace}:long_polls:{holder}"

    def wake_channel(self, topic: str | Shard) -> str:
        """The channel a script of the topic's keys publishes the topic on when it has work earlier
        than the scanner expects: the schedule channel, a shard's its own beside it, so that the
        scanner wakes its worker of that shard alone (shard_of_wake)."""
        if isinstance(topic, Shard) and topic.count > 1:
            return f"{self.schedule_channel}:{topic.count}.{topic.index}"
        return self.schedule_channel

    def shard_of_wake(self, channel: str, topic: str) -> Shard | None:
        """The shard a wake of the topic on this channel is for; None: every key set of the topic (a
        wake on the schedule channel, which shards' scripts of versions before wake_channel used too)."""
        count, dot, index = channel.removeprefix(f"{self.schedule_channel}:").partition(".")
        return Shard(topic, int(count), int(index)) if dot and count.isdigit() and index.isdigit() else None

    def shard_of_history(self, channel: str) -> Shard | None:
        """The topic or shard whose history channel this is, None for another namespace's."""
        return self._shard_of(channel, HISTORY_SUFFIX)

    def shard_of_ready(self, key: str) -> Shard | None:
        """The topic or shard whose ready list this is (what the ready channel carries), None for
        another namespace's."""
        return self._shard_of(key, READY_SUFFIX)

    def _shard_of(self, name: str, suffix: str) -> Shard | None:
        """The topic or shard of one of its key names, None for another namespace's."""
        prefix, suffix = f"{TOPIC_PREFIX}{{{self.namespace}:", f"}}:{suffix}"
        if not (name.startswith(prefix) and name.endswith(suffix)):
            return None
        text = name[len(prefix):-len(suffix)]
        if (mark := _SHARD_TAG.search(text)) is None:
            return Shard(topic_of_key_text(text))
        shard_count, index, _salt = mark[0][len(SHARD_MARK):].split(".")
        return Shard(topic_of_key_text(text[:mark.start()]), int(shard_count), int(index))


@lru_cache(maxsize=65_536)
def topic_keys(namespace: str, topic: str, count: int = 1, index: int = 0) -> TopicKeys:
    """The keys of a topic, or of its shard `index` of `count`."""
    tag = f"{TOPIC_PREFIX}{{{shard_tag(namespace, Shard(topic, count, index))}}}:"
    return TopicKeys(topic=topic, **{name: tag + name for name in TopicKeys.__dataclass_fields__ if name != "topic"})


@lru_cache(maxsize=64)
def namespace_keys(namespace: str) -> NamespaceKeys:
    base = f"dq:ns:{namespace}:"
    return NamespaceKeys(
        namespace=namespace,
        topics=base + "topics",
        ready_channel=base + "ready",
        schedule_channel=base + "schedule",
        schedule_shards=_glob_escape(base) + "schedule:*",
        scanners=base + "scanners",
        health=base + "health",
        marker=base + "marker",
        data_lost=base + "data_lost",
        history_pattern=f"{TOPIC_PREFIX}{{{_glob_escape(namespace)}:*}}:{HISTORY_SUFFIX}",
        buckets=base + "buckets",
        live_pool=base + "live_pool",
        throttled=base + "throttled",
        pushes=base + "pushes",
    )


def _glob_escape(text: str) -> str:
    """Literal text inside a Redis PSUBSCRIBE pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
