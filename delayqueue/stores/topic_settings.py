"""A topic's own settings (the TopicConfig model) as the queue uses them.

PostgreSQL holds them (stores/rows.py writes them). Two copies serve the hot paths:

- Each Runtime reads its namespace's settings on first use and every refreshed.REFRESH_SECONDS
  after (TopicConfigCache, a RefreshedTable, as the limits are), so a send or a pull never waits
  on PostgreSQL or depends on Redis for its defaults, and a change is in force on every web
  process within a second (at once on the process that made it, which reads again).
- The topic's Redis meta hash mirrors the settings the scripts act on (MIRROR_FIELDS): the retry
  backoff (requeue_timed_out.lua, nack.lua), the pause and the push URL (pull.lua); the dead-letter switch,
  which no script reads (dead letters are judged in the message log, sql.KEEPS_DEAD); and
  whether it has a push URL, which the operators' views read beside its other figures. Written by
  every change (services/topics.write_mirrors), written again by the scanner holding the topic
  where a change could not write it (services/topic_control.mend_mirrors), and written back by
  restore (services/restore.py, spark/restore.py) after Redis lost its data; a topic retired by
  the scanner keeps them (retire_topic.lua only drops its registration).

A pull of a paused topic hands out nothing if either copy says paused: the mirror makes a pause
exact the moment it is answered, the cache keeps it while a Redis that lost its data waits for
its restore. Likewise a pull hands out nothing where the mirror's push URL is not its caller's
(a consumer's: none), nor its push signing secret (push_secret_id), so a new push URL, or none,
or a new secret, holds from its answer on, whatever a pusher's table of push topics
(push_topics.py) or a web process' settings still say. Reading fails open as
the limits do: the settings last read stay in force.
"""
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from delayqueue.core.constants import PUSH_CONCURRENCY_DEFAULT, PUSH_TIMEOUT_DEFAULT_MILLIS, RETRY_BACKOFF_MAX_MILLIS
from delayqueue.live.keys import Meta, place_shards
from delayqueue.messagelog import sql
from delayqueue.stores.refreshed import RefreshedTable


@dataclass(frozen=True)
class TopicSettings:
    ttl_millis: int | None = None  # None: the service's default (config/settings.py)
    max_retry: int | None = None
    ack_timeout_millis: int | None = None
    retry_backoff_millis: int = 0  # 0: ready again at once after an ack timeout
    retry_backoff_max_millis: int = RETRY_BACKOFF_MAX_MILLIS
    dead_letter: bool = True
    paused: bool = False
    push_url: str = ""  # "": consumers pull the topic; else its due messages are pushed there (workers/pusher.py)
    push_concurrency: int = PUSH_CONCURRENCY_DEFAULT
    push_timeout_millis: int = PUSH_TIMEOUT_DEFAULT_MILLIS
    push_rate: int = 0  # pushes started per second; 0: no limit
    # Epoch ms until which a rotated-out signing secret still signs. The secrets themselves are
    # read by the pushers alone (push_topics.py).
    push_previous_until: int = 0
    push_secret_id: str = ""  # which signing secret is current (sql.PUSH_SECRET_ID), not the secret; "": none
    shards: int = 1  # key sets its new messages spread over (live/shards.py)
    draining_shards: Sequence[int] = ()  # shard counts given up whose shards may still hold messages
    shards_changed_at: int = 0  # epoch ms of the last change of `shards`
    # Shard count (as text: JSON's keys) -> each shard's slot range [low, high), on a cluster (TopicConfig's)
    shard_placement: Mapping[str, Sequence[Sequence[int]]] = field(default_factory=dict)

    @property
    def sharded(self) -> bool:
        """Whether its messages may be in shards (live/shards.py), of this count or one it drains."""
        return self.shard_counts != (1,)

    @property
    def shard_counts(self) -> tuple[int, ...]:
        """Every shard count whose shards may hold its messages, the one new messages go to first."""
        return (self.shards, *self.draining_shards)


DEFAULT = TopicSettings()

# Meta hash field -> how a TopicSettings gives its value; the scripts read all but dead_letter and push.
MIRROR_FIELDS = {
    Meta.RETRY_BACKOFF: lambda s: s.retry_backoff_millis,
    Meta.RETRY_BACKOFF_MAX: lambda s: s.retry_backoff_max_millis,
    Meta.DEAD_LETTER: lambda s: int(s.dead_letter),
    Meta.PAUSED: lambda s: int(s.paused),
    Meta.PUSH: lambda s: int(bool(s.push_url)),  # read by the operators' views only (ops/figures.py)
    Meta.PUSH_URL: lambda s: s.push_url,  # who may take its messages: pull.lua matches its caller's
    Meta.PUSH_SECRET_ID: lambda s: s.push_secret_id,  # and its caller's signing secret
}


def settings_table(rows, namespace: str) -> dict[str, TopicSettings]:
    """Topic -> settings, from the rows of sql.TOPIC_CONFIGS of the namespace (placed)."""
    return placed(namespace, {topic: TopicSettings(*values) for topic, *values in rows})


def placed(namespace: str, table: dict[str, TopicSettings]) -> dict[str, TopicSettings]:
    """The table, its shard placements registered for the namespace's keys (keys.place_shards):
    a process that has read a topic's shard counts builds their keys where they were placed."""
    for topic, settings in table.items():
        for count, ranges in settings.shard_placement.items():
            place_shards(namespace, topic, int(count), ranges)
    return table


class TopicConfigCache(RefreshedTable):
    """One namespace's topic settings: topic -> its TopicSettings (a topic without a row: DEFAULT)."""

    what = "topic settings"
    reads = sql.TOPIC_CONFIG_READS
    unread = "the defaults are in force"

    def entry(self, values: tuple) -> TopicSettings:
        return TopicSettings(*values)

    async def fresh(self, after: float | None = None) -> dict:
        return placed(self._ns.namespace, await super().fresh(after))

    async def settings(self, topic: str) -> TopicSettings:
        """The topic's settings in force."""
        return (await self.table()).get(topic, DEFAULT)
