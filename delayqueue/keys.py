"""Redis key and channel names.

Every key of a topic carries the hash tag {namespace:topic}, so one topic lives in one
Redis Cluster slot and each Lua script (which gets all its keys in KEYS) runs on one node.
"""
import re
from dataclasses import dataclass
from functools import lru_cache

NAME_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass(frozen=True)
class TopicKeys:
    topic: str
    waiting: str  # ZSET msgId -> triggerTime
    ready: str  # LIST of msgIds, LPUSH in, RPOP out
    inflight: str  # ZSET msgId -> ack deadline
    msgs: str  # HASH msgId -> message json
    expiry: str  # ZSET msgId -> expireTime, live messages only
    ended: str  # ZSET msgId -> when the ended body may be purged
    meta: str  # HASH registered, last_active
    stats: str  # HASH "<interval>:<counter>" -> value
    lock: str  # STRING scanner lock token
    events: str  # STREAM lifecycle events waiting for the log writer


@dataclass(frozen=True)
class NamespaceKeys:
    namespace: str
    topics: str  # ZSET topic -> registration time
    ready_channel: str  # pub/sub: a topic's ready list became non-empty
    schedule_channel: str  # pub/sub: a topic has work earlier than its scanner expects
    scanners: str  # HASH scanner token -> "<event-loop lag ms>:<reported at ms>"
    health: str  # HASH "<host>:offline" -> 1, "<host>:last_use" -> ms (camellia's health endpoints)
    marker: str  # STRING ms it was set: there for as long as Redis keeps its data
    data_lost: str  # STRING ms a scanner found Redis had lost its data; a full restore deletes it

    def topic(self, topic: str) -> TopicKeys:
        return topic_keys(self.namespace, topic)


@lru_cache(maxsize=65_536)
def topic_keys(namespace: str, topic: str) -> TopicKeys:
    tag = f"dq:{{{namespace}:{topic}}}:"
    return TopicKeys(
        topic=topic,
        **{name: tag + name for name in ("waiting", "ready", "inflight", "msgs", "expiry", "ended", "meta", "stats", "lock", "events")},
    )


@lru_cache(maxsize=64)
def namespace_keys(namespace: str) -> NamespaceKeys:
    base = f"dq:ns:{namespace}:"
    return NamespaceKeys(
        namespace=namespace,
        topics=base + "topics",
        ready_channel=base + "ready",
        schedule_channel=base + "schedule",
        scanners=base + "scanners",
        health=base + "health",
        marker=base + "marker",
        data_lost=base + "data_lost",
    )
