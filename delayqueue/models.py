"""The PostgreSQL message log: every message as last known, and one history row per status change.

Redis holds the live queue; these tables are the independent record that `manage.py restore`
rebuilds Redis from. The send path writes `Message` and its 'sent' `MessageEvent` before Redis
sees the message (so a send answered 200 is committed); the scanners' log writer appends the
later `MessageEvent` rows from the per-topic Redis streams the Lua scripts write, and moves
`Message.status` along.
"""
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from delayqueue.core import messages
from delayqueue.core.clock import to_millis
from delayqueue.core.constants import (MAX_EVENT_DETAIL, MAX_LIMIT, MAX_PUSH_URL_LENGTH, MAX_SCHEDULE_ID_LENGTH, MAX_SHARDS,
                                       MAX_TOPIC_BYTES, PUSH_CONCURRENCY_DEFAULT, PUSH_MAX_CONCURRENCY,
                                       PUSH_MAX_TIMEOUT_MILLIS, PUSH_TIMEOUT_DEFAULT_MILLIS, RETRY_BACKOFF_MAX_MILLIS,
                                       CatchUp, Reason, Status)
from delayqueue.core.names import MAX_MSG_ID_CHARS
from delayqueue.messagelog import tables


class Message(models.Model):
    namespace = models.CharField(max_length=128)
    # varchar counts characters: a topic of MAX_TOPIC_BYTES bytes has at most as many.
    topic = models.CharField(max_length=MAX_TOPIC_BYTES)
    msg_id = models.CharField("msgId", max_length=MAX_MSG_ID_CHARS)
    payload = models.TextField()
    produce_time = models.DateTimeField()
    trigger_time = models.DateTimeField()
    expire_time = models.DateTimeField()
    max_retry = models.IntegerField()
    retry = models.IntegerField(default=0)
    status = models.SmallIntegerField(choices=Status.choices)
    # 0-9, higher pulled first; a database default too, for rows written by a process older than the column.
    priority = models.SmallIntegerField(default=0, db_default=0)
    updated_at = models.DateTimeField()
    # Redis' clock (µs) when the row's life began, once a send's correction learnt it (null until then): a
    # correction moves a row to its life only from an earlier or unknown one (sql.OVERWRITE).
    started_us = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = tables.MESSAGE
        constraints = [
            # msgId leads: it tells rows apart at the first column (namespace and topic are mostly
            # equal), which makes every insert cheaper, and the admin's msgId search uses it.
            models.UniqueConstraint(fields=["msg_id", "topic", "namespace"], name="message_natural_key"),
        ]
        indexes = [
            models.Index(fields=["topic", "status", "-produce_time"], name="message_topic_status"),
            models.Index(fields=["-produce_time"], name="message_produce_time"),
            models.Index(fields=["trigger_time"], name="message_trigger_time"),
            # The admin: the status / topic filters in produce-time order.
            models.Index(fields=["status", "-produce_time"], name="message_status_produced"),
            models.Index(fields=["topic", "-produce_time"], name="message_topic_produced"),
            # The restore scan: live messages only, walked in id order.
            models.Index(fields=["namespace", "id"], name="message_live",
                         condition=models.Q(**tables.LIVE.q_keywords())),
            # The cold tier's loader: a topic's waiting messages in due order.
            models.Index(fields=["namespace", "topic", "trigger_time", "id"], name="message_waiting",
                         condition=models.Q(**tables.WAITING.q_keywords())),
            # Retention: ended messages by age.
            models.Index(fields=["updated_at"], name="message_ended",
                         condition=models.Q(**tables.ENDED.q_keywords())),
            # Dead letters of a topic in the order they died: getDeadMsgList's keyset pages, a
            # redrive's walk and purgeDeadMsg.
            models.Index(fields=["namespace", "topic", "updated_at", "id"], name="message_dead",
                         condition=models.Q(**tables.DEAD.q_keywords())),
        ]

    def __str__(self):
        return f"{self.topic}/{self.msg_id}"

    def as_queue_message(self) -> messages.Message:
        return messages.Message(
            topic=self.topic, msg_id=self.msg_id, payload=self.payload, produce_time=to_millis(self.produce_time),
            trigger_time=to_millis(self.trigger_time), expire_time=to_millis(self.expire_time),
            max_retry=self.max_retry, retry=self.retry, status=self.status, priority=self.priority)


class MessageEvent(models.Model):
    """One status change of a message. `event_id` is the Redis stream entry id it came from,
    which makes the log writer's insert idempotent."""

    namespace = models.CharField(max_length=128)
    topic = models.CharField(max_length=MAX_TOPIC_BYTES)
    msg_id = models.CharField("msgId", max_length=MAX_MSG_ID_CHARS)
    event_id = models.CharField(max_length=40)
    at = models.DateTimeField()
    from_status = models.SmallIntegerField(choices=[(0, "none"), *Status.choices])
    to_status = models.SmallIntegerField(choices=Status.choices)
    retry = models.IntegerField()
    reason = models.CharField(max_length=24, choices=Reason.choices)
    process = models.CharField(max_length=200)
    host = models.CharField(max_length=200)
    # A push attempt's HTTP status or error ('' for other changes); a database default too, for
    # rows written by a process older than the column.
    detail = models.CharField(max_length=MAX_EVENT_DETAIL, blank=True, default="", db_default="")
    # The times a change in Redis moved (a reschedule, a nack with a delay, a retry's backoff), from its
    # stream entry, null for other rows: a send's correction that catches up on the change takes them.
    trigger_time = models.DateTimeField(null=True, blank=True)
    expire_time = models.DateTimeField(null=True, blank=True)
    # The life the change in Redis was of (its message's produceTime), from its stream entry; null on
    # the rows the log writes itself ('sent', the cold tier's): a send's correction catches up by it.
    produce_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = tables.EVENT
        constraints = [
            models.UniqueConstraint(fields=["msg_id", "event_id", "topic", "namespace"], name="event_once"),
        ]
        indexes = [
            # Time ranges (the Spark stats job's --since, the archive's cut-off). Rows arrive
            # in about time order, so a block range index serves them for a fraction of a
            # B-tree's upkeep per row and size (docs/benchmarks.md).
            BrinIndex(fields=["at"], name="event_at", autosummarize=True),
        ]

    def __str__(self):
        return f"{self.topic}/{self.msg_id} {self.from_status}->{self.to_status} {self.reason}"


class TopicHourStats(models.Model):
    """One topic's figures for one hour, computed from the log by the Spark stats job
    (`spark/stats.py`), which replaces the rows of every hour it computes whose history the
    log's retention has not reached (HistoryPruned).

    Counts are of history events in that hour. Fire lateness is when a message first became
    ready minus its triggerTime, end-to-end latency its ack minus its produceTime, both in
    milliseconds and bucketed by the hour of that ready or ack; null when the hour had none.
    """

    namespace = models.CharField(max_length=128)
    topic = models.CharField(max_length=MAX_TOPIC_BYTES)
    hour = models.DateTimeField()
    sent = models.BigIntegerField()
    delivered = models.BigIntegerField()
    acked = models.BigIntegerField()
    nacked = models.BigIntegerField()
    timed_out = models.BigIntegerField()
    expired = models.BigIntegerField()
    exhausted = models.BigIntegerField("retries exhausted")
    deleted = models.BigIntegerField()
    fire_lateness_p50 = models.FloatField(null=True)
    fire_lateness_p90 = models.FloatField(null=True)
    fire_lateness_p99 = models.FloatField(null=True)
    latency_p50 = models.FloatField("end-to-end latency p50", null=True)
    latency_p90 = models.FloatField("end-to-end latency p90", null=True)
    latency_p99 = models.FloatField("end-to-end latency p99", null=True)
    computed_at = models.DateTimeField()

    class Meta:
        db_table = tables.STATS
        constraints = [
            models.UniqueConstraint(fields=["namespace", "topic", "hour"], name="topic_hour_once"),
        ]
        indexes = [
            models.Index(fields=["-hour"], name="topic_hour_recent"),
        ]
        verbose_name_plural = "topic hour stats"

    def __str__(self):
        return f"{self.topic} {self.hour:%Y-%m-%d %H}:00"


class HistoryPruned(models.Model):
    """How far back a namespace's history has been deleted by age (prune_log, the Spark archive):
    every event before `before` may be gone, none after it. The stats job leaves the hours before
    it alone, whose figures it can no longer compute whole."""

    namespace = models.CharField(max_length=128, primary_key=True)
    before = models.DateTimeField()

    class Meta:
        db_table = tables.HISTORY_PRUNED
        verbose_name_plural = "history pruned"


def _limit_field(verbose_name: str, help_text: str) -> models.PositiveIntegerField:
    return models.PositiveIntegerField(verbose_name, null=True, blank=True, help_text=help_text,
                                       validators=[MinValueValidator(1), MaxValueValidator(MAX_LIMIT)])


class Limit(models.Model):
    """The limits of a namespace (`topic` empty) or of one of its topics; an empty limit is no
    limit. A topic's limits set by the operator are the operator's alone (stores/rows.set_limits);
    a tenant sets the others through setTopicConfig. Web processes read this table every half
    second (services/admission.py) and enforce it in Redis, so a change takes effect on every one
    of them within a second."""

    namespace = models.CharField(max_length=128)
    topic = models.CharField(max_length=255, blank=True, help_text="empty: the whole namespace")
    produce_rate = _limit_field("produce rate", "messages per second sent (sendMsg, each message of sendMsgBatch)")
    consume_rate = _limit_field("consume rate", "messages per second handed out (pullMsg, longPollingMsg)")
    max_live = _limit_field("live-message cap", "most messages waiting, ready or consuming at once")
    # Rows from before the column count as the operator's: the safe reading.
    set_by_operator = models.BooleanField(
        default=True, db_default=True,
        help_text="set through the admin or manage.py set_limits: setTopicConfig (a tenant's token) cannot change them")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = tables.LIMIT
        constraints = [
            models.UniqueConstraint(fields=["namespace", "topic"], name="limit_once"),
        ]

    def __str__(self):
        return f"{self.namespace}/{self.topic}" if self.topic else f"{self.namespace} (namespace)"


class ApiToken(models.Model):
    """A key to the queue API: which namespace its requests work in and which scopes it has.
    Only the token's sha256 is kept; the token itself is shown once, when created."""

    name = models.CharField(max_length=100, unique=True)
    namespace = models.CharField(max_length=64)
    scopes = models.CharField(max_length=100, help_text="comma-separated: produce, consume, manage, monitor")
    token_hash = models.CharField("token sha256", max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = tables.TOKEN
        verbose_name = "API token"

    def __str__(self):
        return self.name

    @property
    def scope_list(self) -> list[str]:
        return self.scopes.split(",") if self.scopes else []


class TopicConfig(models.Model):
    """A topic's own settings: defaults for its sends and pulls (null: the service's from
    config/settings.py), its retry backoff, whether its status-5 and 6 ends are kept as dead letters, whether
    it is paused, and its push delivery (a URL its due messages are POSTed to, docs/push.md). Web processes read this table every half second (stores/topic_settings.py);
    the scanner scripts read the copy kept in the topic's Redis meta hash, which restore writes
    back after Redis lost its data. Its rate limits and live cap are the Limit table's."""

    namespace = models.CharField(max_length=128)
    topic = models.CharField(max_length=MAX_TOPIC_BYTES)
    ttl_millis = models.BigIntegerField(null=True, blank=True, help_text="default TTL of its sends; empty: DELAYQUEUE_TTL_MILLIS")
    max_retry = models.IntegerField(null=True, blank=True, help_text="default maxRetry of its sends; empty: DELAYQUEUE_MAX_RETRY")
    ack_timeout_millis = models.BigIntegerField(
        null=True, blank=True, help_text="default ack timeout of its pulls; empty: DELAYQUEUE_ACK_TIMEOUT_MILLIS")
    retry_backoff_millis = models.BigIntegerField(default=0, help_text="wait before the first redelivery after an "
                                                                       "ack timeout, doubling per delivery; 0: none")
    retry_backoff_max_millis = models.BigIntegerField(default=RETRY_BACKOFF_MAX_MILLIS,
                                                      help_text="longest backoff wait")
    dead_letter = models.BooleanField(default=True, help_text="keep messages ended as 6 as dead letters")
    paused = models.BooleanField(default=False, help_text="pulls hand out nothing; messages still fall due")
    # The columns added after the table came have database defaults too (db_default): an upgrade
    # migrates while the previous version serves, and its inserts name none of them.
    push_url = models.CharField(max_length=MAX_PUSH_URL_LENGTH, blank=True, default="", db_default="",
                                help_text="due messages are POSTed here (docs/push.md); empty: consumers pull them")
    push_concurrency = models.PositiveIntegerField(
        default=PUSH_CONCURRENCY_DEFAULT, db_default=PUSH_CONCURRENCY_DEFAULT,
        validators=[MinValueValidator(1), MaxValueValidator(PUSH_MAX_CONCURRENCY)],
        help_text="pushes in flight at once, across every pusher")
    push_timeout_millis = models.PositiveIntegerField(
        default=PUSH_TIMEOUT_DEFAULT_MILLIS, db_default=PUSH_TIMEOUT_DEFAULT_MILLIS,
        validators=[MinValueValidator(1), MaxValueValidator(PUSH_MAX_TIMEOUT_MILLIS)],
        help_text="an attempt not answered within this long fails")
    push_rate = models.PositiveIntegerField("push rate", default=0, db_default=0,
                                            validators=[MaxValueValidator(MAX_LIMIT)],
                                            help_text="most pushes started per second; 0: no limit")
    # The signing secrets: HMAC keys the pushers need in the clear. The previous one signs too
    # until push_previous_until (epoch ms), the grace period of a rotation.
    push_secret = models.CharField(max_length=100, blank=True, default="", db_default="", editable=False)
    push_previous_secret = models.CharField(max_length=100, blank=True, default="", db_default="", editable=False)
    push_previous_until = models.BigIntegerField(default=0, db_default=0, editable=False)
    shards = models.PositiveSmallIntegerField(
        default=1, db_default=1, validators=[MinValueValidator(1), MaxValueValidator(MAX_SHARDS)],
        help_text="Redis key sets its messages spread over, each in a slot of its own (docs/scaling.md)")
    # Shard counts given up whose shards may still hold messages: read and scanned until the
    # scanners find them empty SHARDS_SETTLE_MILLIS after shards_changed_at (epoch ms).
    draining_shards = ArrayField(models.PositiveSmallIntegerField(), default=list, db_default=[], blank=True,
                                 editable=False)
    shards_changed_at = models.BigIntegerField(default=0, db_default=0, editable=False)
    # Shard count -> a Cluster slot range [low, high) per shard, chosen over the masters that owned
    # the slots when the count was taken up (live/shards.spread); a count without one uses
    # live/keys.shard_tag's equal runs.
    shard_placement = models.JSONField(default=dict, db_default={}, blank=True, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = tables.TOPIC_CONFIG
        constraints = [
            models.UniqueConstraint(fields=["namespace", "topic"], name="topic_config_once"),
        ]

    def __str__(self):
        return f"{self.namespace}/{self.topic}"


class RedriveTask(models.Model):
    """A redrive of a topic's dead letters (all, or those in `msg_ids`) that died before
    `created_at`, run by whichever scanner holds its lease. Progress is committed with each
    batch's log rows, so a task taken over after its scanner died goes on where it stopped:
    `after_time`/`after_id` is the last dead letter sent, `sending` the batch the log holds as
    redriven that Redis may not have got yet."""

    namespace = models.CharField(max_length=128)
    topic = models.CharField(max_length=MAX_TOPIC_BYTES)
    msg_ids = models.JSONField(null=True, blank=True, help_text="only these msgIds; null: every dead letter")
    max_per_second = models.PositiveIntegerField()
    created_at = models.DateTimeField()
    after_time = models.DateTimeField(null=True, blank=True)
    after_id = models.BigIntegerField(default=0)
    moved = models.BigIntegerField(default=0)
    sending = models.JSONField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = tables.REDRIVE
        indexes = [
            # The scanners' claim: unfinished tasks only.
            models.Index(fields=["namespace", "id"], name="redrive_running", condition=models.Q(done_at__isnull=True)),
        ]

    def __str__(self):
        return f"redrive {self.id} of {self.topic}"


class Schedule(models.Model):
    """A recurring message: each tick of its rule (a cron expression in a time zone, or a fixed
    interval from `start_time`) becomes one ordinary message of `topic`, sent ahead of the tick
    by the scanners' planner (workers/scheduler.py). Times are epoch ms, as the API gives them."""

    namespace = models.CharField(max_length=128)
    schedule_id = models.CharField("scheduleId", max_length=MAX_SCHEDULE_ID_LENGTH)
    topic = models.CharField(max_length=MAX_TOPIC_BYTES)
    payload = models.TextField("msg")
    cron = models.CharField(max_length=200, blank=True, default="")  # '': an interval schedule
    timezone = models.CharField(max_length=64, default="UTC")
    every_millis = models.BigIntegerField(null=True, blank=True)  # None: a cron schedule
    start_time = models.BigIntegerField(null=True, blank=True)
    end_time = models.BigIntegerField(null=True, blank=True)
    catch_up = models.CharField(max_length=8, choices=CatchUp.choices, default=CatchUp.LATEST)
    priority = models.SmallIntegerField(default=0)
    ttl_millis = models.BigIntegerField(default=0)  # 0: the topic's default
    max_retry = models.IntegerField(default=-1)  # below 0: the topic's default
    paused = models.BooleanField(default=False)
    # Counts the changes that replanned the schedule; a tick's msgId carries it, so a tick a
    # change deleted can be sent again under the new rule.
    generation = models.IntegerField(default=0)
    # Every tick up to here has been sent (or, missed, skipped); the planner goes on after it.
    planned_until = models.BigIntegerField()
    # When the planner next looks at the schedule; None while paused or after its last tick.
    plan_at = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = tables.SCHEDULE
        constraints = [models.UniqueConstraint(fields=["namespace", "schedule_id"], name="schedule_id_once")]
        indexes = [
            # The planner's claim: schedules due to be planned, soonest first.
            models.Index(fields=["namespace", "plan_at"], name="schedule_plan_at",
                         condition=models.Q(plan_at__isnull=False)),
            models.Index(fields=["namespace", "topic", "schedule_id"], name="schedule_topic"),
        ]

    def __str__(self):
        return f"{self.namespace}/{self.schedule_id}"


class ScheduleGap(models.Model):
    """Ticks a schedule missed (no scanner planned them in time), and what its catch-up policy
    did with them: `fired` of the `missed` ticks were sent (all of them, the latest, or none)."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="gaps")
    at = models.DateTimeField()
    first_tick = models.BigIntegerField()
    last_tick = models.BigIntegerField()
    missed = models.BigIntegerField()
    fired = models.BigIntegerField()
    policy = models.CharField(max_length=8, choices=CatchUp.choices)

    class Meta:
        db_table = tables.SCHEDULE_GAP
        indexes = [models.Index(fields=["schedule", "-at"], name="schedule_gap_recent")]
