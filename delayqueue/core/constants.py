"""The contract values shared by Python, the Lua scripts and the SQL: defined here once.

The scripts get them through a prelude generated from this module (live/scripts.py), the SQL
as statement parameters (messagelog/sql.py); neither spells a status or a bound itself."""
from django.db.models.enums import IntegerChoices, TextChoices


class Status(IntegerChoices):
    WAITING = 1, "waiting"
    READY = 2, "ready"
    CONSUMING = 3, "consuming"
    ACKED = 4, "acked"
    EXPIRED = 5, "expired"
    EXHAUSTED = 6, "retries or TTL exhausted"
    DELETED = 7, "deleted"


LIVE_STATUSES = (Status.WAITING, Status.READY, Status.CONSUMING)
ENDED_STATUSES = (Status.ACKED, Status.EXPIRED, Status.EXHAUSTED, Status.DELETED)
# The ends that make a dead letter in the message log (while its topic keeps them): a message that
# expired undelivered (5) as much as one whose deliveries or TTL ran out after a delivery (6).
DEAD_STATUSES = (Status.EXPIRED, Status.EXHAUSTED)


class Reason(TextChoices):
    """Why a message changed status: the lifecycle history's `reason`."""

    SENT = "sent"
    DUE = "due"
    PULLED = "pulled"
    ACKED = "acked"
    NACKED = "nacked"
    ACK_TIMEOUT = "ack_timeout", "ack timeout"
    EXPIRED = "expired"
    RETRIES_EXHAUSTED = "retries_exhausted", "retries exhausted"
    DELETED = "deleted"
    RESTORED = "restored"
    TOUCHED = "touched"  # a consumer extended its ack deadline
    RESCHEDULED = "rescheduled"  # given a new trigger time while waiting or ready
    DEAD_LETTERED = "dead_lettered", "dead-lettered"  # ended as a dead letter by its consumer
    REDRIVEN = "redriven"  # a dead letter sent back as a new life
    PURGED = "purged"  # ended by a purge of its topic, or of its topic's dead letters
    PUSHED = "pushed"  # delivered to its topic's push URL, which answered 2xx (the event's detail: the status)
    PUSH_FAILED = "push_failed", "push failed"  # a push attempt failed (detail: the status or the error)


# Fire lateness (promotion time - triggerTime) histogram bounds in ms: promote_due.lua counts each
# promoted message under the first bound it does not exceed ("inf" past the last).
LATENESS_BOUNDS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
# The per-minute lateness series behind the dashboard's chart: prune_stats.lua keeps this many minutes.
CHART_MINUTES = 60

# Upper bounds keep every time (ms) well inside what Redis' Lua numbers and JSON hold exactly.
MAX_DELAY_MILLIS = 10 * 365 * 86_400_000  # ten years
MAX_RETRY = 100_000
# A message's priority: 0 (the default) to MAX_PRIORITY; pulls take higher levels first, FIFO within
# a level. Level 0 is the ready list; levels above it share one sorted set (lua/includes/ready_queue.lua).
MAX_PRIORITY = 9
# The set's score of a priority p's ready message: (MAX_PRIORITY - p) * PRIORITY_BAND + its arrival in
# the band, so the highest priority scores lowest; 2^48 keeps every score an exact integer in a double.
PRIORITY_BAND = 2 ** 48
# A topic's longest retry backoff wait unless it sets its own (TopicConfig.retry_backoff_max_millis).
RETRY_BACKOFF_MAX_MILLIS = 3_600_000
# Jitter of a backoff wait: up to this share of it is taken off at random (lua/includes/backoff.lua).
RETRY_BACKOFF_JITTER = 0.2
# A topic name, as camellia accepts it: non-empty UTF-8 text without control characters, up to
# this many bytes (core/names.py checks it).
MAX_TOPIC_BYTES = 255
# Sharded topics (live/shards.py): most key sets a topic's messages spread over, and how long a
# shard count given up keeps its shards after they are empty: past the time every process has
# read the new count (stores/refreshed.REFRESH_SECONDS), so no send is still on its way to them.
MAX_SHARDS = 256
SHARDS_SETTLE_MILLIS = 10_000

# Failed admin logins (ops/login_limit.py): this many for one username from one client address,
# or (ADMIN_LOGIN_MAX_ADDRESS_FAILURES) from one address for any usernames, within the window
# lock that username at that address, or that address, out for the lock time. An address' limit
# is higher: colleagues behind one NAT each mistype a password now and then.
ADMIN_LOGIN_MAX_FAILURES = 5
ADMIN_LOGIN_MAX_ADDRESS_FAILURES = 20
ADMIN_LOGIN_WINDOW_SECONDS = 15 * 60
ADMIN_LOGIN_LOCK_SECONDS = 15 * 60

# The cold tier counts a topic's messages in the message log only per hour they fall due in (its
# cold_hours hash), so getTopicInfo's waiting buckets can take them without reading the log.
COLD_HOUR_MILLIS = 3_600_000
# A send's log row is committed a moment (a round trip or two) before its script runs; this long
# covers that and the web processes' clocks being apart. A row younger than this may be one whose
# send's script has not run yet (workers/loader.py, load_cold.lua).
IN_FLIGHT_MILLIS = 5_000

# Rate limits (services/admission.py): a token bucket holds at most this long's worth of its rate,
# so a burst is at most one second's worth. A bucket left alone this long is full again.
BURST_MILLIS = 1000
# The largest rate (messages/s) or live-message cap an operator can set.
MAX_LIMIT = 1_000_000_000


class Scope(TextChoices):
    """What an API token lets its holder do: each endpoint's view declares the one it needs
    (needs_scope), and README "API tokens" lists the endpoints of each."""

    PRODUCE = "produce"  # sends
    CONSUME = "consume"  # pulls, acks, touches, getMsg
    MANAGE = "manage"  # changes: deletes, reschedules, restores, topic settings, dead letters, schedules
    MONITOR = "monitor"  # figures and reads of settings, dead letters and schedules


# The longest age a retention setting or option takes: a hundred years. Far more overflows date
# arithmetic (Python's and PostgreSQL's) instead of being refused with a message.
MAX_AGE_DAYS = 36_500
# prune_log's largest --batch: a batch is one transaction and its keys are held in memory; more
# than PostgreSQL's bigint was refused by the database as "message log unavailable".
MAX_PRUNE_BATCH = 1_000_000
# Tokens start with this, so a leaked one is recognisable (secret scanners, logs).
TOKEN_PREFIX = "dq_"

# Dead letters (services/dead_letters.py): a getDeadMsgList page holds at most this many (and
# this many by default); a redrive sends at most this many per second unless told otherwise.
DEAD_LIST_MAX_LIMIT = 1000
DEAD_LIST_DEFAULT_LIMIT = 100
REDRIVE_DEFAULT_RATE = 500
REDRIVE_MAX_RATE = 100_000

# Push delivery (workers/pusher.py): a topic's settings' defaults and bounds.
PUSH_CONCURRENCY_DEFAULT = 8  # pushes of a topic in flight at once, across every pusher process
# Each push in flight holds a connection (a file descriptor) for up to its timeout: bounded so that
# one topic cannot hold a pusher's descriptors for long (a namespace's sum: DELAYQUEUE_MAX_PUSH_CONCURRENCY).
# Settings made under the earlier bounds (1000, 300 s) are pushed at these.
PUSH_MAX_CONCURRENCY = 200
PUSH_TIMEOUT_DEFAULT_MILLIS = 10_000  # one attempt, connecting to reading the answer
PUSH_MAX_TIMEOUT_MILLIS = 60_000
MAX_PUSH_URL_LENGTH = 2000
# A failed push waits this long before the next attempt, doubling per delivery, when its topic sets
# no retryBackoffMillis: a receiver down for a moment must not use up a message's tries at once.
PUSH_RETRY_BACKOFF_DEFAULT_MILLIS = 1000
# A history event's detail (a push attempt's status or error, a consumer's nack reason) is at most this many
# characters: a push's is cut to it, a longer nack reason is refused.
MAX_EVENT_DETAIL = 200

# Schedules (workers/scheduler.py): a tick's message is sent this far ahead of the tick, so it
# fires with the queue's precision (planned again at the schedule's phase, core/schedules.plan_time).
SCHEDULE_LEAD_MILLIS = 10_000
# A tick first planned more than this after its time was missed (the scanners were down): the
# schedule's catch-up policy decides whether it fires.
SCHEDULE_MISSED_AFTER_MILLIS = 5_000
# Most ticks one schedule sends in one planning round (a catch-up of more goes on in the next rounds).
SCHEDULE_MAX_TICKS_PER_ROUND = 1_000
MAX_SCHEDULE_ID_LENGTH = 128
SCHEDULE_LIST_MAX_LIMIT = 1000
SCHEDULE_LIST_DEFAULT_LIMIT = 100


class CatchUp(TextChoices):
    """What a schedule does with the ticks it missed while no scanner planned them."""

    LATEST = "latest"  # fire the latest missed tick once
    ALL = "all"  # fire each missed tick once
    SKIP = "skip"  # fire none of them
