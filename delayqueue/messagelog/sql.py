"""Every SQL statement of the message log, for the app and the Spark jobs alike, built once at
import. A statement that varies with its caller's options is built by one function here.

Statuses come from core/constants.py, as parameters; only where a partial index's predicate
must be matched by the planner are they rendered into the text (a parameter would defeat the
index under a generic plan), from tables.py's conditions. Times cross the SQL boundary as epoch
milliseconds, through from_millis / to_millis (their Python pair is core/clock.py). Rows travel
as one JSON document, orjson's dump of dataclasses: `record` declares each statement's columns
from the dataclass itself, so the keys cannot drift from the fields.
"""
import types
import typing
from dataclasses import dataclass

from psycopg import sql

from delayqueue.core.constants import COLD_HOUR_MILLIS, LIVE_STATUSES, Status
from delayqueue.core.messages import Message
from delayqueue.core.schedules import FIELDS as SCHEDULE_FIELDS
from delayqueue.live.history import Event
from delayqueue.messagelog import tables


def from_millis(millis: str) -> str:
    """SQL for epoch milliseconds as a timestamptz. Float division: the same value as numeric
    division (both round to the nearest double, to_timestamp to the microsecond), for less."""
    return f"to_timestamp({millis} / 1000.0::float8)"


def to_millis(moment: str) -> str:
    """SQL for a timestamptz as epoch milliseconds, the inverse of from_millis: extract gives an
    exact numeric and the cast rounds it to the nearest ms, so a time written in ms reads back
    as the same integer."""
    return f"(extract(epoch FROM {moment}) * 1000)::int8"


# A log row is the life `u` names (same produceTime), compared in ms on the row's side so no
# index on produce_time can lead the join: a batch of sends shares one produceTime, and a plan
# through message_topic_produced (picked on stats of distinct times) visited the whole batch
# per event, seconds per thousand.
SAME_LIFE = f"{to_millis('m.produce_time')} = u.produce_time"


def probe_each(table: str, msg_id: str, key: str, *, columns: str = "p.id", alias: str = "found") -> str:
    """A FROM item after the rows of a batch: the rows of `table` (as `p`) whose msgId is
    `msg_id` and that `key` names, for each batch row, as `alias`. A join on the key is planned
    on the namespace's statistics, and a namespace the last ANALYZE did not see looks one row
    big: the join then scanned the table once per batch row (a 10,000-event drain took 30 s).
    LATERAL with OFFSET 0 is not flattened into a join, so it runs once per batch row; and it
    probes by msgId alone, which only the unique key's index leads (without statistics an index
    led by topic looks as good, and walks the whole topic each time)."""
    return (f"CROSS JOIN LATERAL (SELECT {columns} FROM (SELECT * FROM {table} WHERE msg_id = {msg_id} OFFSET 0) p"
            f" WHERE {key} OFFSET 0) {alias}")


# The log row each batch row `u` names.
_KEY_OF_U = "p.namespace = %(namespace)s AND p.topic = u.topic"
_MESSAGE_OF_U = probe_each(tables.MESSAGE, "u.msg_id", _KEY_OF_U)

_SQL_TYPES = {str: "text", int: "int8"}


def record(cls: type, *names: str) -> str:
    """The column list of `json_to_recordset(...) AS u(<this>)` over orjson's dump of `cls`
    instances (dataclasses): the fields named, or every field, typed from their annotations."""
    hints = typing.get_type_hints(cls)
    columns = []
    for name in names or hints:
        hint = hints[name]
        if isinstance(hint, types.UnionType):  # `int | None`
            [hint] = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        columns.append(f"{name} {_SQL_TYPES[hint]}")
    return ", ".join(columns)


# The predicates of the partial indexes message_live, message_ended and message_dead: the
# planner uses such an index only when it can see the query implies them.
LIVE = tables.LIVE.sql()
ENDED = tables.ENDED.sql()
DEAD = tables.DEAD.sql()
WAITING = tables.WAITING.sql()
# A row `m` that ended dead (DEAD: expired undelivered, 5, or exhausted, 6) is a dead letter while
# its topic keeps dead letters. Judged by the topic's setting now (TopicConfig.dead_letter; no row:
# on): switched off, its dead rows leave the lists, redrives and purges, and prune_log removes them
# at the ordinary retention.
def keeps_dead(row: str) -> str:
    """KEEPS_DEAD of the message row named `row` (a statement without the alias m: the Spark jobs' reads)."""
    return (f"NOT EXISTS (SELECT 1 FROM {tables.TOPIC_CONFIG} c"
            f" WHERE c.namespace = {row}.namespace AND c.topic = {row}.topic AND NOT c.dead_letter)")


KEEPS_DEAD = keeps_dead("m")

# --- The send path (group_commit.MessageLog): performance-critical, one statement per group.

_COLUMNS = ("namespace, topic, msg_id, payload, produce_time, trigger_time, expire_time, max_retry, retry, status, "
            "priority, updated_at")
# Rows travel as one JSON document, %(rows)s, of Messages (the namespace, %(namespace)s, is the
# same for all): psycopg dumps array parameters element by element in Python, which cost more
# than the statement itself; PostgreSQL unpacks JSON in C.
_ROWS = f"json_to_recordset(%(rows)s::json) AS u({record(Message)})"
_SELECT_ROWS = f"""SELECT %(namespace)s, topic, msg_id, payload, {from_millis("produce_time")},
       {from_millis("trigger_time")}, {from_millis("expire_time")}, max_retry, retry, status, priority,
       {from_millis("produce_time")}
FROM {_ROWS}"""
_ON_KEY_REPLACE = """ON CONFLICT (namespace, topic, msg_id) DO UPDATE SET
    payload = EXCLUDED.payload, produce_time = EXCLUDED.produce_time, trigger_time = EXCLUDED.trigger_time,
    expire_time = EXCLUDED.expire_time, max_retry = EXCLUDED.max_retry, retry = EXCLUDED.retry,
    status = EXCLUDED.status, priority = EXCLUDED.priority, updated_at = EXCLUDED.updated_at,
    started_us = EXCLUDED.started_us"""
_UPSERT = f"""
INSERT INTO {tables.MESSAGE} AS m ({_COLUMNS})
{_SELECT_ROWS}
{_ON_KEY_REPLACE}
"""


# The 'sent' history row goes in the same statement as the message row: the send path knows
# everything it says, and writing it here spares a stream entry in Redis and the writer's
# round trip for most of the history. Its event id, 'sent-<produceTime ms>', tells lives apart.
def _sent_id(produce_millis: str) -> str:
    return f"'sent-' || {produce_millis}"


_INSERT_SENT = f"""INSERT INTO {tables.EVENT} (namespace, topic, msg_id, event_id, at, from_status, to_status, retry,
                                            reason, process, host)"""
# The 'sent' rows of the messages in `u`.
_DELETE_SENT = f"""DELETE FROM {tables.EVENT} e USING u {probe_each(
    tables.EVENT, "u.msg_id", f"{_KEY_OF_U} AND p.event_id = {_sent_id('u.produce_time')}")}
    WHERE e.id = found.id"""
_KEYS_JSON = (f"SELECT * FROM json_to_recordset(%(unsent)s::json)"
              f" AS u({record(Message, 'topic', 'msg_id', 'produce_time')})")

# Messages whose msgIds the log does not hold, with their 'sent' rows: plain INSERTs, so one
# msgId the log holds fails the whole statement on the unique key, and MessageLog sends the
# rows again through RECORD, which decides row by row. ON CONFLICT costs every row a
# speculative insertion, a seventh of the statement (docs/benchmarks.md), for the rare resend.
INSERT_NEW = f"""
WITH u AS MATERIALIZED (
    SELECT *, {from_millis("produce_time")} AS produced FROM {_ROWS}
), messages AS (
    INSERT INTO {tables.MESSAGE} ({_COLUMNS})
    SELECT %(namespace)s, topic, msg_id, payload, produced, {from_millis("trigger_time")}, {from_millis("expire_time")},
           max_retry, retry, status, priority, produced FROM u
)
{_INSERT_SENT}
SELECT %(namespace)s, topic, msg_id, {_sent_id("produce_time")}, produced, 0, status, 0, 'sent', %(process)s,
       %(host)s FROM u
"""
# A send replaces a logged message only when that one ended more than %(dedupe_window)s ms ago
# and is not a dead letter; a live one (past its TTL too: it is ending, as a dead letter) is a
# duplicate that Redis answers (or, out of Redis in the cold tier, this answer). A row equal to the
# one sent, to its produceTime, is this very send, written by a try whose answer was lost
# (MessageLog retries): it counts as written, and its 'sent' row is not written twice. The rows it
# keeps are answered from here, in the statement's snapshot (so a twin that replaced one meanwhile
# still finds it ended): each row answered is (topic, msg_id, written, replaced: written over a row the
# statement's snapshot held, then, where kept, the message as Message takes it). The first ended status is
# a parameter: this conflict path scans no index on status.
_SAME_SEND = ("produce_time", "payload", "trigger_time", "expire_time", "max_retry", "retry", "status", "priority")
_IS_SAME_SEND = f"({', '.join(f'm.{c}' for c in _SAME_SEND)}) = ({', '.join(f'EXCLUDED.{c}' for c in _SAME_SEND)})"
RECORD = f"""
WITH written AS (
    {_UPSERT} WHERE (m.status >= %(ended)s AND NOT (m.{DEAD} AND {KEEPS_DEAD})
                     AND m.updated_at <= EXCLUDED.updated_at - %(dedupe_window)s * interval '1 millisecond')
                 OR {_IS_SAME_SEND}
    RETURNING namespace, topic, msg_id, produce_time, status
), sent AS (
    {_INSERT_SENT}
    SELECT namespace, topic, msg_id, {_sent_id(to_millis("produce_time"))},
           produce_time, 0, status, 0, 'sent', %(process)s, %(host)s
    FROM written
    ON CONFLICT (namespace, topic, msg_id, event_id) DO NOTHING
)
SELECT w.topic, w.msg_id, TRUE,
       EXISTS (SELECT FROM (SELECT * FROM {tables.MESSAGE} WHERE msg_id = w.msg_id OFFSET 0) p
               WHERE p.topic = w.topic AND p.namespace = %(namespace)s),
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM written w
UNION ALL
SELECT m.topic, m.msg_id, FALSE, FALSE, m.payload, {to_millis("m.produce_time")}, {to_millis("m.trigger_time")},
       {to_millis("m.expire_time")}, m.max_retry, m.retry, m.status, m.priority
FROM json_to_recordset(%(rows)s::json) AS u({record(Message, "topic", "msg_id")})
  {probe_each(tables.MESSAGE, "u.msg_id", _KEY_OF_U, columns="p.*", alias="m")}
WHERE NOT EXISTS (SELECT FROM written w WHERE w.topic = m.topic AND w.msg_id = m.msg_id)
"""


def _topic_locks(lock: str, topics: str) -> str:
    """A statement taking `lock` (a transaction-level advisory lock function) on the topics of the
    FROM item `topics` (column topic), as one of 64 locks a namespace, in key order."""
    return (f"SELECT {lock}(k) FROM (SELECT DISTINCT hashtextextended('delayqueue log moves ' || %(namespace)s"
            f" || ' ' || (hashtext(topic) & 63), 0) AS k FROM {topics} ORDER BY k OFFSET 0) locks")


# A send's correction that moves rows to new lives (OVERWRITE) and the log writer's transactions
# exclude each other per topic, the writer's from their start (shared: writers do not wait on each
# other). Else a correction could miss a writer's uncommitted events of the new life, and that
# writer's row moves, their snapshot taken before the correction committed, find the row still the
# old life's and skip them: the row kept the send's state. A handful of locks, however many topics;
# both take theirs before any row's, so they cannot deadlock.
LOCK_TOPICS_WRITTEN = _topic_locks("pg_advisory_xact_lock_shared", "unnest(%(topics)s::text[]) AS t(topic)")
LOCK_TOPICS_MOVED = _topic_locks("pg_advisory_xact_lock", f"""(
    SELECT u.topic FROM {_ROWS} {_MESSAGE_OF_U} JOIN {tables.MESSAGE} m ON m.id = found.id WHERE NOT {SAME_LIFE}) t""")
# Makes the log hold exactly the rows given (what Redis answered a send with), except a row of the
# same life the log writer has moved since its send (updated_at no longer its produceTime): the
# events it holds came after Redis' answer, and going back to the answer would undo them.
# A row moved to another life (one only Redis knew had begun: its last life had ended there, not
# yet in the log) takes the state of that life's latest history row, and the latest times one of
# them moved (a nack's delay, a reschedule): the writer recorded the new life's events but moved no
# row, the row being another life's, ended or live yet (its end in another stream, a shard count's
# the topic gave up, not read yet). The writer's rows name their life (its produceTime), which tells
# them apart: by time it could not, the row's own being a web process' clock (its produceTime) when
# only its send wrote it, and Redis making many changes in one ms.
# Lives are ordered by when Redis began them, its clock (%(started)s: Started, for the lives whose
# beginning the send learnt: those Redis created), which the row keeps (started_us): a correction moves
# a row to its life only from one that began earlier, or whose beginning is not known (a row only its
# send wrote, before Redis answered; one of the version before the column). Else a late correction
# took the row back from a life that began after its own ended, answered sent and never corrected.
# A send whose record replaced another row therefore corrects it too, once Redis took it: an earlier
# life's late correction may have moved the row meanwhile, and, the row's start known, no later one can.
@dataclass(frozen=True, slots=True)
class Started:
    """When Redis began a message's life (OVERWRITE and STAMP_STARTED take orjson's dump of these)."""

    topic: str
    msg_id: str
    produce_time: int  # the life's
    started_us: int  # Redis' clock, µs


_STARTED = f"json_to_recordset(%(started)s::json) AS s({record(Started)})"
_EVENTS_OF_U = f"""{tables.EVENT} e
        WHERE e.msg_id = u.msg_id AND e.topic = u.topic AND e.namespace = %(namespace)s
          AND {to_millis("e.produce_time")} = u.produce_time"""
OVERWRITE = f"""
WITH u AS MATERIALIZED (
    SELECT u.*, s.started_us FROM {_ROWS}
    LEFT JOIN {_STARTED} ON s.topic = u.topic AND s.msg_id = u.msg_id AND s.produce_time = u.produce_time),
caught_up AS (
    SELECT u.topic, u.msg_id, last.*, times.* FROM u {_MESSAGE_OF_U} JOIN {tables.MESSAGE} m ON m.id = found.id
    CROSS JOIN LATERAL (
        SELECT e.to_status, e.retry, e.at FROM {_EVENTS_OF_U} ORDER BY e.at DESC, e.id DESC LIMIT 1) last
    LEFT JOIN LATERAL (
        SELECT e.trigger_time, e.expire_time FROM {_EVENTS_OF_U} AND e.trigger_time IS NOT NULL
        ORDER BY e.at DESC, e.id DESC LIMIT 1) times ON TRUE
    WHERE NOT {SAME_LIFE}
)
INSERT INTO {tables.MESSAGE} AS m ({_COLUMNS}, started_us)
SELECT %(namespace)s, u.topic, u.msg_id, payload, {from_millis("produce_time")},
       coalesce(c.trigger_time, {from_millis("u.trigger_time")}),
       coalesce(c.expire_time, {from_millis("u.expire_time")}),
       max_retry, coalesce(c.retry, u.retry), coalesce(c.to_status, u.status), priority,
       coalesce(c.at, {from_millis("produce_time")}), u.started_us
FROM u LEFT JOIN caught_up c ON c.topic = u.topic AND c.msg_id = u.msg_id
{_ON_KEY_REPLACE} WHERE CASE WHEN m.produce_time = EXCLUDED.produce_time THEN m.updated_at = m.produce_time
                        ELSE m.started_us IS NULL OR m.started_us < EXCLUDED.started_us END
RETURNING topic, msg_id"""
# The row of each life in %(started)s, as Started, keeps when it began, also where OVERWRITE left the row
# alone (the log writer moved it since): run after it, in its transaction.
STAMP_STARTED = f"""
WITH u AS MATERIALIZED (SELECT found.id, u.* FROM json_to_recordset(%(started)s::json) AS u({record(Started)})
                        {_MESSAGE_OF_U})
UPDATE {tables.MESSAGE} m SET started_us = u.started_us FROM u
WHERE m.id = u.id AND {SAME_LIFE} AND m.started_us IS DISTINCT FROM u.started_us"""
# Removes rows, and their 'sent' history, of sends Redis did not take: only the life this
# process wrote (same produceTime), never a later one. Found first, as in UPDATE_MESSAGES.
FORGET = f"""
WITH u AS ({_KEYS_JSON}), unsent AS ({_DELETE_SENT}),
found AS MATERIALIZED (SELECT found.id, u.produce_time FROM u {_MESSAGE_OF_U})
DELETE FROM {tables.MESSAGE} m USING found u
WHERE m.id = u.id AND {SAME_LIFE}
"""
# Where Redis decided otherwise than the log expected: 'sent' rows of sends Redis answered with
# an older live message go; sends Redis took get theirs, with the status Redis gave them.
CORRECT_SENT = f"""
WITH u AS ({_KEYS_JSON}), unsent AS ({_DELETE_SENT})
{_INSERT_SENT}
SELECT %(namespace)s, topic, msg_id, {_sent_id("produce_time")}, {from_millis("produce_time")}, 0, status, 0, 'sent',
       %(process)s, %(host)s
FROM json_to_recordset(%(rows)s::json) AS n({record(Message, 'topic', 'msg_id', 'produce_time', 'status')})
ON CONFLICT (namespace, topic, msg_id, event_id) DO UPDATE SET to_status = EXCLUDED.to_status
"""

# --- The history writer (workers/log_writer.py): Events from the topics' streams.

# Stream entries as history rows, one JSON document per drain. A plain INSERT, which fails on the
# unique key when a row is already written (the entry read again after a crash between commit and
# XDEL, or by a second writer while a topic changes hands); the writer then runs RECORD_EVENTS,
# which skips such rows. ON CONFLICT for every drain would cost each row a speculative insertion.
INSERT_EVENTS = f"""
INSERT INTO {tables.EVENT} (namespace, topic, msg_id, event_id, at, from_status, to_status, retry, reason, process,
  host, detail, produce_time, trigger_time, expire_time)
SELECT %(namespace)s, topic, msg_id, entry_id, {from_millis("at")}, from_status, to_status, retry, reason, process,
       host, detail, {from_millis("produce_time")}, {from_millis("trigger_time")}, {from_millis("expire_time")}
FROM json_to_recordset(%(events)s::json) AS u({record(
    Event, "topic", "msg_id", "entry_id", "at", "from_status", "to_status", "retry", "reason", "process", "host",
    "detail", "produce_time", "trigger_time", "expire_time")})
"""
RECORD_EVENTS = INSERT_EVENTS + "ON CONFLICT (namespace, topic, msg_id, event_id) DO NOTHING\n"
# Only the life of the message the row describes (same produceTime) moves its status, never
# backwards in time (two writers may briefly overlap while a topic changes hands), and a row
# already in that state is not rewritten. A row its send wrote (updated_at = produceTime, the web
# process' clock) takes any event: Redis' clock may be behind that one, the change is not before the send.
# A change that moved the message's times (tt, et: reschedule, nack with a delay) sets them too.
# The rows are found first (MATERIALIZED): else the planner may pair rows and events by
# produceTime, which a batch of sends shares, before it probes.
UPDATE_MESSAGES = f"""
WITH u AS MATERIALIZED (
    SELECT found.id, u.* FROM json_to_recordset(%(events)s::json) AS u({record(
        Event, "topic", "msg_id", "to_status", "retry", "at", "produce_time", "trigger_time", "expire_time")})
    {_MESSAGE_OF_U}
)
UPDATE {tables.MESSAGE} m SET status = u.to_status, retry = u.retry, updated_at = {from_millis("u.at")},
  trigger_time = COALESCE({from_millis("u.trigger_time")}, m.trigger_time),
  expire_time = COALESCE({from_millis("u.expire_time")}, m.expire_time)
FROM u
WHERE m.id = u.id AND {SAME_LIFE} AND (m.updated_at <= {from_millis("u.at")} OR m.updated_at = m.produce_time)
  AND (m.status <> u.to_status OR m.retry <> u.retry OR u.trigger_time IS NOT NULL)
"""
# Whether a namespace has a live message in the log: one probe of message_live.
HOLDS_LIVE = f"SELECT EXISTS (SELECT 1 FROM {tables.MESSAGE} WHERE namespace = %s AND {LIVE})"

# --- The cold tier (workers/loader.py, services/messages.py): waiting messages out of Redis.

# The loader's reads walk message_waiting in its order. Run after this in their transaction, so
# that no plan sorts: statistics taken before a topic's rows came make it look a row big, and a
# plan through another index then read every waiting row of the topic for each page.
IN_INDEX_ORDER = "SET LOCAL enable_sort = off; SET LOCAL enable_incremental_sort = off"
# A topic's waiting rows after a loader position (%(after_time)s ms, row id %(after_id)s), on
# message_waiting: the cold tier's reads (the loader's pages, its room, a purge's pages).
_WAITING_AFTER = f"""namespace = %(namespace)s AND topic = %(topic)s AND {WAITING}
  AND (trigger_time, id) > ({from_millis("%(after_time)s::int8")}, %(after_id)s::int8)"""
# A page of a topic's waiting rows after the loader's position (%(after_time)s ms, row id
# %(after_id)s) and due by %(hot_until)s, in that order: each row's id, then the message's fields
# as core.messages.stored takes them (PostgreSQL's json_build_object took twice as long as
# raw columns do, and the loader waits on these reads).
COLD_PAGE = f"""
SELECT id, msg_id, payload, {to_millis("produce_time")}, {to_millis("trigger_time")}, {to_millis("expire_time")},
       max_retry, retry, status, priority
FROM {tables.MESSAGE}
WHERE {_WAITING_AFTER}
  AND trigger_time <= {from_millis("%(hot_until)s::int8")}
ORDER BY trigger_time, id LIMIT %(limit)s
"""
# The triggerTime (ms) of the topic's waiting row %(skip)s rows after the loader's position
# (%(after_time)s ms, row id %(after_id)s), if one is due by %(hot_until)s: the loader's window
# ends before it when Redis has room for only %(skip)s more (DELAYQUEUE_HOT_MAX_MESSAGES).
COLD_BEYOND_ROOM = f"""
SELECT {to_millis("trigger_time")}
FROM {tables.MESSAGE}
WHERE {_WAITING_AFTER}
  AND trigger_time <= {from_millis("%(hot_until)s::int8")}
ORDER BY trigger_time, id OFFSET %(skip)s LIMIT 1
"""
# Whether the topic has a waiting row due after %(hot_until)s: its last one, from the index's end.
COLD_LEFT = f"""
SELECT COALESCE((SELECT trigger_time FROM {tables.MESSAGE} WHERE namespace = %(namespace)s AND topic = %(topic)s
                 AND {WAITING} ORDER BY trigger_time DESC, id DESC LIMIT 1)
                > {from_millis("%(hot_until)s::int8")}, FALSE)
"""
# Whether the topic has a waiting row at all (a sharded topic is retired while idle only without
# one: workers/scanner.py).
HOLDS_WAITING = f"""
SELECT EXISTS (SELECT 1 FROM {tables.MESSAGE} WHERE namespace = %(namespace)s AND topic = %(topic)s AND {WAITING})
"""
# A log row's columns as Message takes them.
_AS_MESSAGE = (f"topic, msg_id, payload, {to_millis('produce_time')}, {to_millis('trigger_time')}, "
               f"{to_millis('expire_time')}, max_retry, retry, status, priority")
# A cold message by msgId: waiting, after the loader's position (getMsg of a message Redis does
# not hold; a row before the position is Redis' to answer for, whatever the log writer has caught up).
COLD_MESSAGE = f"""
SELECT {_AS_MESSAGE}
FROM {tables.MESSAGE} WHERE {_WAITING_AFTER} AND msg_id = %(msg_id)s
"""


def _history_of(changed: str, kind: str, from_status: str) -> str:
    """The statement of a CTE writing a history row (event id `<kind>-<ms>`, from `from_status`,
    %(reason)s and the actor) for each row the CTE `changed` returns (topic, msg_id, status,
    retry, updated_at): the cold tier's changes, made in the log, not through Redis' stream."""
    return f"""{_INSERT_SENT}
    SELECT %(namespace)s, topic, msg_id, '{kind}-' || {to_millis("updated_at")}, updated_at, {from_status}, status,
           retry, %(reason)s, %(process)s, %(host)s
    FROM {changed}
    ON CONFLICT (namespace, topic, msg_id, event_id) DO NOTHING"""


# Deletes a waiting message Redis does not hold (deleteMsg in the cold tier): the row is deleted,
# with its history row, and answers the message as Message takes it. Stamped %(now)s, Redis' clock:
# the log writer takes only Redis' events from after the stamp, and PostgreSQL's clock ahead of Redis'
# would have it drop the next ones (of a message a loader brought in meanwhile, then acked).
DELETE_COLD = f"""
WITH deleted AS (
    UPDATE {tables.MESSAGE} SET status = %(deleted)s, updated_at = {from_millis("%(now)s::int8")}
    WHERE {_WAITING_AFTER} AND msg_id = %(msg_id)s
    RETURNING topic, msg_id, payload, produce_time, trigger_time, expire_time, max_retry, retry, status, priority,
              updated_at
), history AS (
    {_history_of("deleted", "deleted", "%(waiting)s")}
)
SELECT {_AS_MESSAGE} FROM deleted
"""
# A live message by msgId, whatever its status and position (deleteMsg of one Redis holds nothing
# of and that is not cold: Redis lost its data, or its send died between the log and Redis).
LIVE_MESSAGE = f"""
SELECT {_AS_MESSAGE}
FROM {tables.MESSAGE} WHERE namespace = %(namespace)s AND topic = %(topic)s AND msg_id = %(msg_id)s AND {LIVE}
"""
# The msgId's row if it ended deleted, its id and when it ended (ms, Redis' clock as the cold tier's
# deletes and purges stamp it): getMsg answers a deleted message whose body Redis does not keep from here.
DELETED_MESSAGE = f"""
SELECT {_AS_MESSAGE}, id, {to_millis("updated_at")}
FROM {tables.MESSAGE} WHERE namespace = %(namespace)s AND topic = %(topic)s AND msg_id = %(msg_id)s
  AND status = %(deleted)s
"""
# Deletes that message's life (%(produce_time)s ms), still live, with its history row from the
# status it had, before Redis keeps it as deleted: a restore would bring the row back. Stamped %(now)s
# as DELETE_COLD is.
DELETE_LOST = f"""
WITH old AS (
    SELECT id, status FROM {tables.MESSAGE}
    WHERE namespace = %(namespace)s AND topic = %(topic)s AND msg_id = %(msg_id)s AND {LIVE}
      AND {to_millis("produce_time")} = %(produce_time)s
    FOR UPDATE
), deleted AS (
    UPDATE {tables.MESSAGE} m SET status = %(deleted)s, updated_at = {from_millis("%(now)s::int8")}
    FROM old WHERE m.id = old.id
    RETURNING m.topic, m.msg_id, m.retry, m.status, m.updated_at, old.status AS old_status
)
{_history_of("deleted", "deleted", "old_status")}
"""
# Ends as deleted, without a history row (the log writer adds the delete's, from Redis' stream),
# the waiting row after the loader's position of a message Redis deleted with its body released
# (deleteMsg with release in the cold tier): until the writer caught up, such a row was taken for
# a cold message's, which Redis does not hold either. Stamped %(now)s as DELETE_COLD is.
END_RELEASED = f"""
UPDATE {tables.MESSAGE} SET status = %(deleted)s, updated_at = {from_millis("%(now)s::int8")}
WHERE {_WAITING_AFTER} AND msg_id = %(msg_id)s
"""
# Gives a waiting message Redis does not hold a new trigger time, %(trigger)s ms (rescheduleMsg in
# the cold tier): its expireTime moves as much (one before its triggerTime stays, as in reschedule.lua), and a
# history row records it with its times, stamped %(now)s as DELETE_COLD is.
# Answers the message as rescheduled, then its triggerTime before.
RESCHEDULE_COLD = f"""
WITH old AS (
    SELECT id, trigger_time FROM {tables.MESSAGE}
    WHERE {_WAITING_AFTER} AND msg_id = %(msg_id)s
    FOR UPDATE
), moved AS (
    UPDATE {tables.MESSAGE} m SET trigger_time = {from_millis("%(trigger)s::int8")},
        expire_time = CASE WHEN m.expire_time < m.trigger_time THEN m.expire_time
                           ELSE m.expire_time + ({from_millis("%(trigger)s::int8")} - m.trigger_time) END,
        updated_at = {from_millis("%(now)s::int8")}
    FROM old WHERE m.id = old.id
    RETURNING m.topic, m.msg_id, m.payload, m.produce_time, m.trigger_time, m.expire_time, m.max_retry, m.retry,
              m.status, m.priority, m.updated_at, old.trigger_time AS old_trigger_time
), history AS (
    {_history_of("moved", "rescheduled", "status")}
)
SELECT {_AS_MESSAGE}, {to_millis("old_trigger_time")} FROM moved
"""

# purgeTopic in the cold tier: a page of the topic's waiting rows after the loader's position
# (%(after_time)s ms, row id %(after_id)s), in that order, each as (id, msgId, produceTime ms,
# triggerTime ms).
COLD_AFTER = f"""
SELECT id, msg_id, {to_millis("produce_time")}, {to_millis("trigger_time")}
FROM {tables.MESSAGE}
WHERE {_WAITING_AFTER}
ORDER BY trigger_time, id LIMIT %(limit)s
"""
# Ends the rows %(ids)s still waiting as deleted, each with its history row (reason purged), stamped
# %(now)s as DELETE_COLD is; answers how many.
PURGE_COLD = f"""
WITH purged AS (
    UPDATE {tables.MESSAGE} SET status = %(deleted)s, updated_at = {from_millis("%(now)s::int8")}
    WHERE id = ANY(%(ids)s::int8[]) AND {WAITING}
    RETURNING topic, msg_id, retry, status, updated_at, trigger_time
), history AS (
    {_history_of("purged", "purged", "%(waiting)s")}
)
SELECT {to_millis("trigger_time")} / {COLD_HOUR_MILLIS}, count(*) FROM purged GROUP BY 1
"""

# --- Retention (retention.prune_log): small batches, each its own short transaction.

# The retention's now: PostgreSQL's clock, as the archive's cutoff (sql.CUTOFF), not that of the
# host prune_log runs on, which may run days ahead and take dead letters before their retention.
NOW = "SELECT now()"

# A batch of ended messages last changed before the cutoff and not before %(since)s (where the
# previous batch stopped: rows it left behind are not read again), oldest first, from
# message_ended; either dead letters (DEAD rows of a topic that keeps them, kept for their own
# retention) or the other ended rows. Rows another transaction holds are left for the next run.
DELETE_ENDED_MESSAGES = f"""
WITH doomed AS (
    SELECT id FROM {tables.MESSAGE} m
    WHERE {ENDED} AND updated_at < %(before)s AND updated_at >= %(since)s
      AND (m.{DEAD} AND {KEEPS_DEAD}) = %(dead_letters)s
    ORDER BY updated_at LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {tables.MESSAGE} m USING doomed WHERE m.id = doomed.id
RETURNING m.namespace, m.topic, m.msg_id, m.updated_at
"""
# History of a deleted message (its earlier lives too): the row is gone, and a later life of
# the same msgId would have kept the row alive.
DELETE_HISTORY = f"""
DELETE FROM {tables.EVENT} e USING unnest(%(namespaces)s::text[], %(topics)s::text[], %(msg_ids)s::text[]) AS d(ns, t, i)
  {probe_each(tables.EVENT, "d.i", "p.namespace = d.ns AND p.topic = d.t AND p.at < %(before)s")}
WHERE e.id = found.id
"""
# How far back a namespace's history is deleted by age (prune_log, the archive), in the transaction that deletes it:
# the stats job leaves the hours before it alone. In namespace order, so concurrent prunes lock rows in one order.
RECORD_PRUNED = f"""
INSERT INTO {tables.HISTORY_PRUNED} AS p (namespace, before)
SELECT DISTINCT unnest(%(namespaces)s::text[]), %(before)s::timestamptz ORDER BY 1
ON CONFLICT (namespace) DO UPDATE SET before = greatest(p.before, EXCLUDED.before)
"""
PRUNED_BEFORE = f"SELECT namespace, {to_millis('before')} FROM {tables.HISTORY_PRUNED}"

# --- Dead letters (messagelog/dead_letters.py, services/dead_letters.py, workers/redriver.py): DEAD rows of a topic
# on message_dead, in the order they died (updated_at, id). A keyset position is updated_at in epoch microseconds (exact
# both ways, as interval arithmetic is) and the row id.

def _at_micros(micros: str) -> str:
    return f"('epoch'::timestamptz + {micros} * interval '1 microsecond')"


_MICROS = "(extract(epoch FROM m.updated_at) * 1000000)::int8"
_DEAD_IN = (f"m.namespace = %(namespace)s AND m.topic = %(topic)s AND m.{DEAD} AND {KEEPS_DEAD}"
            " AND (%(msg_ids)s::text[] IS NULL OR m.msg_id = ANY(%(msg_ids)s::text[]))")

# A page after position (%(after)s µs, %(after_id)s; the first page: NULL, 0), with why each died: the reason and
# detail (a consumer's nack reason) of the history row that ended its life (the newest one into its status).
DEAD_PAGE = f"""
SELECT m.id, {_MICROS}, m.topic, m.msg_id, m.payload, {to_millis("m.produce_time")}, {to_millis("m.trigger_time")},
       {to_millis("m.expire_time")}, m.max_retry, m.retry, m.status, m.priority, {to_millis("m.updated_at")}, r.reason,
       r.detail
FROM {tables.MESSAGE} m
LEFT JOIN LATERAL (
    SELECT e.reason, e.detail FROM {tables.EVENT} e
    WHERE e.msg_id = m.msg_id AND e.topic = m.topic AND e.namespace = m.namespace AND e.to_status = m.status
    ORDER BY e.at DESC, e.id DESC LIMIT 1
) r ON TRUE
WHERE {_DEAD_IN} AND (m.updated_at, m.id) > (coalesce({_at_micros("%(after)s::int8")}, '-infinity'), %(after_id)s)
ORDER BY m.updated_at, m.id LIMIT %(limit)s
"""
# Ends a batch of dead letters as deleted, each with its history row (reason purged), as a purge of
# a topic ends its cold messages; answers how many. Their history stays, for the retention to take
# with the row: what they went through still counts in the hours' figures (spark.stats). Stamped
# %(now)s, Redis' clock, as DELETE_COLD is: a death's entry the writer reads again (a topic changing
# hands) is then never later than the stamp, nor undoes the purge with PostgreSQL's clock behind.
PURGE_DEAD = f"""
WITH doomed AS (
    SELECT m.id, m.status FROM {tables.MESSAGE} m WHERE {_DEAD_IN}
    ORDER BY m.updated_at, m.id LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), purged AS (
    UPDATE {tables.MESSAGE} m SET status = %(deleted)s, updated_at = {from_millis("%(now)s::int8")}
    FROM doomed WHERE m.id = doomed.id
    RETURNING m.topic, m.msg_id, m.retry, m.status, m.updated_at, doomed.status AS dead_status
), history AS (
    {_history_of("purged", "purged", "dead_status")}
)
SELECT count(*) FROM purged
"""
# A redrive task over the dead letters in scope, bounded by the newest of them (and %(now)s, Redis'
# clock, which their deaths are stamped with): a message redriven and dead again later is not taken
# twice (PostgreSQL's clock ahead of Redis' let the task take it again). None when the scope holds
# no dead letter.
CREATE_REDRIVE = f"""
INSERT INTO {tables.REDRIVE} (namespace, topic, msg_ids, max_per_second, created_at, after_id, moved, lease_owner)
SELECT %(namespace)s::text, %(topic)s::text, %(msg_ids_json)s::jsonb, %(rate)s::int4,
       greatest({from_millis("%(now)s::int8")}, max(m.updated_at)), 0, 0, ''
FROM {tables.MESSAGE} m WHERE {_DEAD_IN}
HAVING count(*) > 0
RETURNING id
"""
_TASK = """id, topic, msg_ids, max_per_second, created_at, after_time, after_id, moved, sending,
            done_at IS NOT NULL"""
# A scanner takes the oldest unfinished task of its namespace that nobody holds a lease on.
CLAIM_REDRIVE = f"""
UPDATE {tables.REDRIVE} SET lease_owner = %(owner)s, lease_until = now() + %(lease_millis)s * interval '1 millisecond'
WHERE id = (
    SELECT id FROM {tables.REDRIVE}
    WHERE namespace = %(namespace)s AND done_at IS NULL AND (lease_until IS NULL OR lease_until < now())
    ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED
)
RETURNING {_TASK}
"""
# The task, locked, if this scanner still holds its lease (and the lease renewed): every batch
# starts with it, so two scanners never move the same batch.
HOLD_REDRIVE = f"""
UPDATE {tables.REDRIVE} SET lease_until = now() + %(lease_millis)s * interval '1 millisecond'
WHERE id = %(id)s AND lease_owner = %(owner)s AND done_at IS NULL
RETURNING {_TASK}
"""
def ttl_as_sent(row: str) -> str:
    """SQL for the TTL (ms) the life of the message row named `row` was sent with, counted from when
    it was first ready (its earliest history row into READY, %(ready)s, at or after its produceTime),
    as a retry's wait (a nack's delay, a backoff) moved its triggerTime and not its expireTime: after
    one past its TTL, expireTime - triggerTime is negative."""
    first_ready = f"""(SELECT min(e.at) FROM {tables.EVENT} e
    WHERE e.msg_id = {row}.msg_id AND e.topic = {row}.topic AND e.namespace = {row}.namespace
      AND e.to_status = %(ready)s AND e.at >= {row}.produce_time)"""
    return f"{to_millis(f'{row}.expire_time')} - {to_millis(f'least({row}.trigger_time, {first_ready})')}"


# The task's next dead letters, locked, with what a new life needs: its TTL as sent.
_NEXT_DEAD = f"""
SELECT m.id, m.updated_at, m.msg_id, m.payload, m.max_retry, {ttl_as_sent("m")} AS ttl, m.priority, m.status
FROM {tables.MESSAGE} m
WHERE {_DEAD_IN} AND m.updated_at <= %(created_at)s
  AND (m.updated_at, m.id) > (coalesce(%(after_time)s::timestamptz, '-infinity'), %(after_id)s)
ORDER BY m.updated_at, m.id LIMIT %(limit)s
"""
NEXT_DEAD = _NEXT_DEAD + "FOR UPDATE"
# How many dead letters a task has still to move.
REDRIVE_LEFT = f"SELECT count(*) FROM ({_NEXT_DEAD}) AS left_over"
# The batch's new lives: ready now, retry 0, their TTL from now, begun in Redis when not yet known;
# history reason 'redriven' (the first row of the life, keyed by its produceTime as a send's 'sent' row is).
@dataclass(frozen=True, slots=True)
class NewLife:
    """A redriven dead letter's new life, as REDRIVE_ROWS takes it (orjson's dump of these)."""

    id: int  # the log row's
    produce_time: int  # epoch ms: now, which is its trigger time too
    expire_time: int
    dead_status: int  # the status it died with (DEAD), the history row's from_status


REDRIVE_ROWS = f"""
WITH u AS (SELECT * FROM json_to_recordset(%(rows)s::json) AS u({record(NewLife)})),
moved AS (
    UPDATE {tables.MESSAGE} m SET produce_time = {from_millis("u.produce_time")},
        trigger_time = {from_millis("u.produce_time")}, expire_time = {from_millis("u.expire_time")}, retry = 0,
        status = %(ready)s, updated_at = {from_millis("u.produce_time")}, started_us = NULL
    FROM u WHERE m.id = u.id AND m.{DEAD}
    RETURNING m.namespace, m.topic, m.msg_id, u.produce_time, u.dead_status
)
{_INSERT_SENT}
SELECT namespace, topic, msg_id, 'redriven-' || produce_time, {from_millis("produce_time")}, dead_status, %(ready)s, 0,
       'redriven', %(process)s, %(host)s
FROM moved
"""
# The batch's progress, committed with its rows: where the walk is, how many moved, and the
# batch Redis is still to get.
REDRIVE_PROGRESS = f"""
UPDATE {tables.REDRIVE} SET after_time = %(after_time)s, after_id = %(after_id)s, moved = moved + %(moved)s,
    sending = %(sending)s::jsonb
WHERE id = %(id)s
"""
# Only by the lease's holder: a scanner whose send outlasted its lease must not clear the batch its successor recorded.
REDRIVE_SENT = f"UPDATE {tables.REDRIVE} SET sending = NULL WHERE id = %(id)s AND lease_owner = %(owner)s"
REDRIVE_DONE = f"UPDATE {tables.REDRIVE} SET done_at = now(), sending = NULL, lease_until = NULL WHERE id = %(id)s"
REDRIVE_STATE = f"SELECT {_TASK} FROM {tables.REDRIVE} WHERE id = %(id)s AND namespace = %(namespace)s"

# --- Operators' figures (ops/figures.py: dashboard, /metrics, the admin's topic pages).

# Dead letters per topic of the namespaces given (one topic's when %(topic)s is not NULL): one
# statement per scrape, counted on the partial index message_dead.
DEAD_COUNTS = f"""
SELECT m.namespace, m.topic, count(*) FROM {tables.MESSAGE} m
WHERE m.namespace = ANY(%(namespaces)s::text[]) AND (%(topic)s::text IS NULL OR m.topic = %(topic)s) AND m.{DEAD}
  AND {KEEPS_DEAD}
GROUP BY m.namespace, m.topic
"""
# Unfinished redrive tasks of the namespaces given (of one topic, when given), each as REDRIVE_STATE answers it with its
# namespace first (how many it has still to move: REDRIVE_LEFT, per task).
RUNNING_REDRIVES = f"""
SELECT namespace, {_TASK} FROM {tables.REDRIVE}
WHERE namespace = ANY(%(namespaces)s::text[]) AND done_at IS NULL
  AND (%(topic)s::text IS NULL OR topic = %(topic)s)
ORDER BY id
"""

# --- Restore (recovery, spark/restore.py, spark/reconcile.py --fix).

# A log row as restore_rows takes it: the table's RESTORE_COLUMNS, times in epoch ms, then its
# `ttl`, RESTORE_TTL: the TTL it was sent with, which a restore with expired messages gives them anew
# (parameters of restore_scope). Only a delivered message (retry > 0) can have had a retry's wait,
# and only such a restore needs the TTL: no other row's history is looked at.
RESTORE_COLUMNS = ("id", "namespace", "topic", "msg_id", "payload", "produce_time", "trigger_time", "expire_time",
                   "max_retry", "retry", "status", "priority")
RESTORE_TTL = (f"CASE WHEN %(include_expired)s AND retry > 0 THEN {ttl_as_sent(tables.MESSAGE)}"
               f" ELSE {to_millis('expire_time')} - {to_millis('trigger_time')} END")
_RESTORE_SELECT = ", ".join([*(f"{to_millis(c)} AS {c}" if c.endswith("_time") else c for c in RESTORE_COLUMNS),
                             f"{RESTORE_TTL} AS ttl"])


def restore_scope(namespace: str, topic: str | None, msg_id: str | None,
                  include_expired: bool, ids: list[int] | None = None) -> tuple[sql.Composed, sql.Composed, dict]:
    """The log rows a restore considers, as conditions (the scope: namespace, optional topic,
    msgId and row ids; and among them the candidates it may bring back) and their parameters. Live
    candidates are message_live's predicate; with expired ones too no partial index applies,
    so the statuses are a parameter."""
    conditions = [sql.SQL("namespace = %(namespace)s")]
    params = {"namespace": namespace, "include_expired": include_expired, "ready": Status.READY}
    if topic is not None:
        conditions.append(sql.SQL("topic = %(topic)s"))
        params["topic"] = topic
    if msg_id is not None:
        conditions.append(sql.SQL("msg_id = %(msg_id)s"))
        params["msg_id"] = msg_id
    if ids is not None:
        conditions.append(sql.SQL("id = ANY(%(ids)s::int8[])"))
        params["ids"] = ids
    if include_expired:
        candidates = sql.SQL("status = ANY(%(restorable)s)")
        params["restorable"] = [int(s) for s in (*LIVE_STATUSES, Status.EXPIRED)]
    else:
        candidates = sql.SQL(LIVE)
    return sql.SQL(" AND ").join(conditions), candidates, params


# The cold tier's part of a restore: a waiting row after its topic's loader position, in
# %(cold_after)s (a JSON list of {cold_topic, after_time ms, after_id}), is left to the loader.
# The positions are joined in (one hash lookup a row), not looked up in a subquery per row.
_WITH_POSITIONS = sql.SQL(
    f"{tables.MESSAGE} LEFT JOIN json_to_recordset(%(cold_after)s::json)"
    " AS b(cold_topic text, after_time int8, after_id int8) ON b.cold_topic = topic")


def _after_position(after_time: str, after_id: str) -> str:
    return f"COALESCE({WAITING} AND (trigger_time, id) > ({from_millis(after_time)}, {after_id}), FALSE)"


_AFTER_POSITION = sql.SQL(_after_position("b.after_time", "b.after_id"))
# The Spark restore's read of one topic: its rows not left cold, by its loader position
# (%(after_time)s ms, %(after_id)s; NULL for a topic that has none: none are left).
NOT_COLD_IN_TOPIC = sql.SQL("NOT " + _after_position("%(after_time)s::int8", "%(after_id)s::int8"))


def _restore_source(cold: bool) -> tuple[sql.Composable, sql.Composable]:
    """What a restore reads from, and which of its rows are left cold (the cold tier)."""
    if cold:
        return _WITH_POSITIONS, _AFTER_POSITION
    return sql.Identifier(tables.MESSAGE), sql.SQL("FALSE")


def restore_counts(scope: sql.Composed, candidates: sql.Composed, cold: bool = False) -> sql.Composed:
    """One scan that counts, per topic and cold hour, the candidates, the rest (skipped as ended
    or expired) and, in the cold tier, the candidates left to the loader: rows (topic, hour,
    candidates, rest, left), the hour (triggerTime // COLD_HOUR_MILLIS) that of the rows left cold,
    NULL for the others."""
    source, left = _restore_source(cold)
    hour = sql.SQL(f"CASE WHEN {{c}} AND {{left}} THEN {to_millis('trigger_time')} / {COLD_HOUR_MILLIS} END"
                   ).format(c=candidates, left=left)
    counts = sql.SQL("count(*) FILTER (WHERE {c} AND NOT {left}), count(*) FILTER (WHERE NOT ({c})), "
                     "count(*) FILTER (WHERE {c} AND {left})").format(c=candidates, left=left)
    return sql.SQL("SELECT topic, {}, {} FROM {} WHERE {} GROUP BY 1, 2").format(hour, counts, source, scope)


def restore_young_cold(scope: sql.Composed, candidates: sql.Composed) -> sql.Composed:
    """The candidates left to the loader (the cold tier) produced after %(young_after)s ms: rows
    (topic, msgId, produceTime ms), a send's whose script may not have run yet."""
    source, left = _restore_source(True)
    young = from_millis("%(young_after)s::int8")
    return sql.SQL(f"SELECT topic, msg_id, {to_millis('produce_time')} FROM {{}} WHERE {{}} AND {{}} AND {{}}"
                   f" AND produce_time > {young}").format(source, scope, candidates, left)


def restore_page(scope: sql.Composed, candidates: sql.Composed, cold: bool = False) -> sql.Composed:
    """A page of candidates (not left cold), after id %(after)s, %(limit)s rows in id order:
    keyset paging on message_live (namespace, id) reads each row once however far the restore
    has got."""
    source, left = _restore_source(cold)
    return sql.SQL("SELECT {} FROM {} WHERE {} AND {} AND NOT {} AND id > %(after)s ORDER BY id LIMIT %(limit)s"
                   ).format(sql.SQL(_RESTORE_SELECT), source, scope, candidates, left)


# The topics of a namespace with waiting rows, one index probe each (a loose scan of
# message_waiting), not one look at each row.
WAITING_TOPICS = f"""
WITH RECURSIVE found AS (
    (SELECT topic FROM {tables.MESSAGE} WHERE namespace = %(namespace)s AND {WAITING} ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT topic FROM {tables.MESSAGE} WHERE namespace = %(namespace)s AND {WAITING} AND topic > found.topic
            ORDER BY topic LIMIT 1)
    FROM found WHERE found.topic IS NOT NULL
)
SELECT topic FROM found WHERE topic IS NOT NULL
"""


def scoped_waiting_topics(scope: sql.Composed) -> sql.Composed:
    """The topics with a waiting row in a restore's scope (restore_scope) that names its rows (a msgId,
    row ids): a restore of those alone."""
    return sql.SQL(f"SELECT DISTINCT topic FROM {tables.MESSAGE} WHERE {{}} AND {WAITING}").format(scope)


# --- The Spark jobs' reads (spark/pgread.py): times leave PostgreSQL as epoch ms (bigint).

def spark_column(name: str, pg_type: str) -> str:
    """The SQL that sends a column of this type to Spark: times as epoch ms, smallints
    (statuses) widened like the int4 columns."""
    if pg_type == "timestamptz":
        return to_millis(name)
    return f"{name}::int4" if pg_type == "int2" else name


def _copy(table: str, expressions: list[str], where: sql.Composable, rest: str) -> sql.Composed:
    """A binary COPY of a SELECT: psycopg loads the rows in C, with the types Spark expects."""
    return sql.SQL("COPY (SELECT {} FROM {} WHERE ({}){}) TO STDOUT (FORMAT BINARY)").format(
        sql.SQL(", ").join(sql.SQL(e) for e in expressions), sql.Identifier(table), where, sql.SQL(rest))


def id_bounds(table: str, where: sql.Composable) -> sql.Composed:
    """The id range of the rows a partitioned read covers, cut into ranges on the driver."""
    return sql.SQL("SELECT min(id), max(id) FROM {} WHERE ({})").format(sql.Identifier(table), where)


def copy_id_range(table: str, expressions: list[str], where: sql.Composable) -> sql.Composed:
    """One Spark task's rows: those matching `where` with %(low)s <= id < %(high)s, on the
    primary key, so the ranges split the work without overlap."""
    return _copy(table, expressions, where, " AND id >= %(low)s AND id < %(high)s")


def copy_in_id_order(table: str, expressions: list[str], where: sql.Composable) -> sql.Composed:
    """The rows matching `where`, in id order: a restore keeps each topic's order of sending."""
    return _copy(table, expressions, where, " ORDER BY id")


# Conditions of the jobs' reads, with named parameters.
ALL = sql.SQL("TRUE")
IN_NAMESPACE = sql.SQL("namespace = %(namespace)s")
EVENTS_SINCE = sql.SQL("at >= %(since)s")
# Messages with an event since %(since)s: the stats only join messages to those events.
MESSAGES_WITH_EVENTS_SINCE = sql.SQL(
    "EXISTS (SELECT FROM {e} e WHERE e.namespace = {m}.namespace AND e.topic = {m}.topic"
    " AND e.msg_id = {m}.msg_id AND e.at >= %(since)s)").format(
    e=sql.Identifier(tables.EVENT), m=sql.Identifier(tables.MESSAGE))
IN_TOPIC = sql.SQL("topic = %(topic)s")
# Live rows by id, for reconcile --fix: a row that ended meanwhile is left out.
LIVE_BY_ID = sql.SQL(f"id = ANY(%(ids)s::int8[]) AND {LIVE}")
# The archive's messages: ended before %(before)s, on message_ended; a dead letter only once it
# died before %(dead_before)s, as prune_log keeps it (the log lists and redrives it until then).
ARCHIVABLE_MESSAGES = sql.SQL(
    f"namespace = %(namespace)s AND {ENDED} AND updated_at < %(before)s"
    f" AND (updated_at < %(dead_before)s OR NOT ({DEAD} AND {keeps_dead(tables.MESSAGE)}))")
# Their history can only be older than the cutoff (updated_at is set from the events).
ARCHIVABLE_EVENTS = sql.SQL("namespace = %(namespace)s AND at < %(before)s")


def both(first: sql.Composable, second: sql.Composable) -> sql.Composed:
    return sql.SQL("({}) AND ({})").format(first, second)


# --- The Spark jobs' writes and small queries.

# Whether a table exists (None if not), checked before a job starts.
TABLE_EXISTS = "SELECT to_regclass(%s)"
# The archive's cutoff by PostgreSQL's clock, the one updated_at was written with.
CUTOFF = "SELECT now() - make_interval(days => %s)"
# Archived message rows go only if still the ended life that was archived (a reused msgId
# updates the row); by id, so the ended status is a parameter.
ARCHIVE_DELETE_MESSAGES = f"""
DELETE FROM {tables.MESSAGE} m USING unnest(%(ids)s::int8[], %(ended)s::int8[]) AS a(id, ended)
WHERE m.id = a.id AND m.status >= %(first_ended)s AND {to_millis("m.updated_at")} = a.ended
"""
ARCHIVE_DELETE_EVENTS = f"DELETE FROM {tables.EVENT} WHERE id = ANY(%(ids)s::int8[])"


def stats_upsert(columns: tuple[str, ...]) -> str:
    """Writes a topic-hour row (namespace, topic, hour in epoch ms, then the figures), replacing
    the figures of one already there."""
    return f"""
INSERT INTO {tables.STATS} ({", ".join(columns)}, computed_at)
VALUES (%s, %s, {from_millis("%s")}, {", ".join(["%s"] * (len(columns) - 3))}, now())
ON CONFLICT (namespace, topic, hour) DO UPDATE SET
{", ".join(f"{c} = EXCLUDED.{c}" for c in columns[3:])}, computed_at = EXCLUDED.computed_at
"""


# --- The admin's counts (messagelog/selectors.py).

# The row count PostgreSQL keeps in pg_class (updated by ANALYZE / autovacuum).
TABLE_ESTIMATE = "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass"
# The planner's row estimate of a query, without running it.
EXPLAIN_JSON = "EXPLAIN (FORMAT JSON) "

# --- Operator settings every process holds (stores/refreshed.py): a namespace's limits, topic
# settings and push topics, read in full at first and now and then, and twice a second only the
# rows changed since the last read. Each row carries the id of the transaction that last wrote it
# (changed_xid, set by a trigger), and a deleted row (or one moved to another topic) leaves one in
# SETTINGS_DELETION (kept a day).
# A read asks first for its snapshot's xmin: every transaction below it had committed, so the next
# read asks for the rows written at or above it, and misses no commit however late it comes.

SNAPSHOT_XMIN = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"
SETTINGS_TABLES = (tables.LIMIT, tables.TOPIC_CONFIG)
SETTINGS_DELETION_DAYS = 1
SETTINGS_CHANGES = [
    f"CREATE TABLE {tables.SETTINGS_DELETION} (namespace varchar(128) NOT NULL, table_name text NOT NULL,"
    " topic varchar(255) NOT NULL, changed_xid xid8 NOT NULL, at timestamptz NOT NULL DEFAULT now())",
    f"CREATE INDEX settingsdeletion_changes ON {tables.SETTINGS_DELETION} (namespace, changed_xid)",
    "CREATE FUNCTION delayqueue_settings_written() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN NEW.changed_xid := pg_current_xact_id(); RETURN NEW; END $$",
    "CREATE FUNCTION delayqueue_settings_deleted() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
    f" INSERT INTO {tables.SETTINGS_DELETION} (namespace, table_name, topic, changed_xid)"
    " VALUES (OLD.namespace, TG_TABLE_NAME, OLD.topic, pg_current_xact_id());"
    f" DELETE FROM {tables.SETTINGS_DELETION} WHERE at < now() - interval '{SETTINGS_DELETION_DAYS} days';"
    " RETURN OLD; END $$",
] + [statement for table in SETTINGS_TABLES for statement in (
    f"ALTER TABLE {table} ADD COLUMN changed_xid xid8 NOT NULL DEFAULT pg_current_xact_id()",
    f"CREATE TRIGGER {table}_written BEFORE INSERT OR UPDATE ON {table} FOR EACH ROW"
    " EXECUTE FUNCTION delayqueue_settings_written()",
    f"CREATE TRIGGER {table}_deleted AFTER DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION delayqueue_settings_deleted()",
)]
SETTINGS_CHANGES_UNDONE = [statement for table in SETTINGS_TABLES for statement in (
    f"DROP TRIGGER {table}_written ON {table}", f"DROP TRIGGER {table}_deleted ON {table}",
    f"ALTER TABLE {table} DROP COLUMN changed_xid",
)] + ["DROP FUNCTION delayqueue_settings_written()", "DROP FUNCTION delayqueue_settings_deleted()",
      f"DROP TABLE {tables.SETTINGS_DELETION}"]
# A row given another namespace or topic (the admin's Limits change page edits the topic) leaves a
# mark for the one it had, as a deletion does: without it the old topic's row stays in force.
SETTINGS_MOVES = [f"CREATE TRIGGER {table}_moved AFTER UPDATE OF namespace, topic ON {table} FOR EACH ROW"
                  " WHEN (OLD.namespace IS DISTINCT FROM NEW.namespace OR OLD.topic IS DISTINCT FROM NEW.topic)"
                  " EXECUTE FUNCTION delayqueue_settings_deleted()" for table in SETTINGS_TABLES]
SETTINGS_MOVES_UNDONE = [f"DROP TRIGGER {table}_moved ON {table}" for table in SETTINGS_TABLES]


def settings_reads(table: str, columns: tuple[str, ...]) -> tuple[str, str]:
    """A refreshed table's two statements, each answering rows (deleted, topic, *columns): all of
    a namespace's rows (parameter `namespace`), and its rows deleted (first, their columns null)
    or written at or after a snapshot's xmin (parameters `namespace`, `since`)."""
    values = ", ".join(columns)
    rows = f"SELECT false, topic, {values} FROM {table} WHERE namespace = %(namespace)s"
    deleted = (f"SELECT true, topic, {', '.join(['NULL'] * len(columns))} FROM {tables.SETTINGS_DELETION}"
               f" WHERE namespace = %(namespace)s AND table_name = '{table}' AND changed_xid >= %(since)s::xid8")
    return rows, f"{deleted} UNION ALL {rows} AND changed_xid >= %(since)s::xid8 ORDER BY 1 DESC"


# Limits (stores/limits.py), in Limits' order.
LIMIT_READS = settings_reads(tables.LIMIT, ("coalesce(produce_rate, 0)", "coalesce(consume_rate, 0)",
                                            "coalesce(max_live, 0)"))
# Which push signing secret is the topic's now, for the processes that must not hold it (the
# settings' mirror, which pull.lua matches with a pusher's): 64 bits of its SHA-256, '' without one.
PUSH_SECRET_ID = ("CASE WHEN push_secret = '' THEN '' "
                  "ELSE left(encode(sha256(convert_to(push_secret, 'UTF8')), 'hex'), 16) END")
# Topic settings (stores/topic_settings.py), in TopicSettings' order.
TOPIC_CONFIG_COLUMNS = ("ttl_millis", "max_retry", "ack_timeout_millis", "retry_backoff_millis",
                        "retry_backoff_max_millis", "dead_letter", "paused", "push_url", "push_concurrency",
                        "push_timeout_millis", "push_rate", "push_previous_until", PUSH_SECRET_ID, "shards",
                        "draining_shards", "shards_changed_at", "shard_placement")
TOPIC_CONFIG_READS = settings_reads(tables.TOPIC_CONFIG, TOPIC_CONFIG_COLUMNS)
# The same table read in full by the Spark restore, which has no refreshed table: (topic, *columns).
TOPIC_CONFIGS = f"SELECT topic, {', '.join(TOPIC_CONFIG_COLUMNS)} FROM {tables.TOPIC_CONFIG} WHERE namespace = %s"
# The push topics with their signing secrets, for the pushers alone (stores/push_topics.py), in
# PushTopic's order; a row without a push URL is no push topic.
PUSH_TOPIC_READS = settings_reads(tables.TOPIC_CONFIG, (
    "push_url", "push_concurrency", "push_timeout_millis", "push_rate", "push_secret", "push_previous_secret",
    "push_previous_until", PUSH_SECRET_ID))

# --- API tokens (stores/tokens.py): the request path checks them without the ORM.

TOKENS_BY_HASH = (f"SELECT token_hash, namespace, scopes, revoked_at IS NOT NULL FROM {tables.TOKEN}"
                  " WHERE token_hash = ANY(%s)")
TOKEN_NAMESPACES = f"SELECT DISTINCT namespace FROM {tables.TOKEN} WHERE revoked_at IS NULL"

# --- Caps (services/caps.py).

# One restore per namespace at a time: a session lock, so a restore whose process or connection
# dies lets the next one in.
RESTORE_LOCK = "SELECT pg_try_advisory_lock(hashtextextended('delayqueue restore ' || %s, 0))"
# Released by the restore that ends: a closed connection's session ends a moment after the close
# returns, and a restore asked for meanwhile would be refused.
RESTORE_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended('delayqueue restore ' || %s, 0))"
# setTopicConfig's caps, checked in the transaction that writes the row, under a lock per
# namespace so that concurrent changes cannot each pass: its rows, and its push topics' concurrency.
TOPIC_CONFIG_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('delayqueue topic config ' || %s, 0))"


# ---- Schedules (the Schedule and ScheduleGap models; core/schedules.py reads a row) ----------

# core.schedules.FIELDS, the times as epoch ms.
_SCHEDULE = ", ".join(to_millis(f"s.{name}") if name in ("created_at", "updated_at") else f"s.{name}"
                      for name in SCHEDULE_FIELDS)
# A namespace's schedules are created one at a time (a transaction lock per namespace), so the
# count checked against DELAYQUEUE_MAX_SCHEDULES stays true until the insert commits.
LOCK_SCHEDULE_CREATION = "SELECT pg_advisory_xact_lock(hashtextextended('delayqueue schedules ' || %(namespace)s, 0))"
SCHEDULE_COUNT = f"SELECT count(*) FROM {tables.SCHEDULE} WHERE namespace = %(namespace)s"
INSERT_SCHEDULE = f"""
INSERT INTO {tables.SCHEDULE} AS s (namespace, schedule_id, topic, payload, cron, timezone, every_millis, start_time,
    end_time, catch_up, priority, ttl_millis, max_retry, paused, generation, planned_until, plan_at, created_at,
    updated_at)
VALUES (%(namespace)s, %(schedule_id)s, %(topic)s, %(payload)s, %(cron)s, %(timezone)s, %(every_millis)s,
    %(start_time)s, %(end_time)s, %(catch_up)s, %(priority)s, %(ttl_millis)s, %(max_retry)s, %(paused)s,
    %(generation)s, %(planned_until)s, %(plan_at)s, {from_millis("%(now)s")}, {from_millis("%(now)s")})
ON CONFLICT (namespace, schedule_id) DO NOTHING
RETURNING {_SCHEDULE}
"""
GET_SCHEDULE = f"SELECT {_SCHEDULE} FROM {tables.SCHEDULE} s WHERE namespace = %(namespace)s AND schedule_id = %(schedule_id)s"
# The row locked for a change: the planner holds it while it sends the schedule's ticks.
LOCK_SCHEDULE = GET_SCHEDULE + " FOR UPDATE"
# A page in scheduleId order (bytewise, whatever the database's collation) after the cursor (the
# last scheduleId of the page before).
LIST_SCHEDULES = f"""
SELECT {_SCHEDULE} FROM {tables.SCHEDULE} s
WHERE namespace = %(namespace)s AND schedule_id COLLATE "C" > %(after)s
    AND (%(topic)s::text IS NULL OR topic = %(topic)s)
ORDER BY schedule_id COLLATE "C" LIMIT %(limit)s
"""
UPDATE_SCHEDULE = f"""
UPDATE {tables.SCHEDULE} s SET topic = %(topic)s, payload = %(payload)s, cron = %(cron)s, timezone = %(timezone)s,
    every_millis = %(every_millis)s, start_time = %(start_time)s, end_time = %(end_time)s, catch_up = %(catch_up)s,
    priority = %(priority)s, ttl_millis = %(ttl_millis)s, max_retry = %(max_retry)s, paused = %(paused)s,
    generation = %(generation)s, planned_until = %(planned_until)s, plan_at = %(plan_at)s,
    updated_at = {from_millis("%(now)s")}
WHERE id = %(id)s
RETURNING {_SCHEDULE}
"""
# Its gaps go first: the foreign key is Django's, whose CASCADE is the ORM's, not the database's.
DELETE_SCHEDULE = f"""
WITH gaps AS (DELETE FROM {tables.SCHEDULE_GAP} WHERE schedule_id = %(id)s)
DELETE FROM {tables.SCHEDULE} WHERE id = %(id)s
"""
# Whether the topic has a message under any of these msgIds (a generation's first ticks, probed
# by msgId, which leads message_natural_key).
TICKS_TAKEN = f"""
SELECT 1 FROM {tables.MESSAGE}
WHERE msg_id = ANY(%(msg_ids)s::text[]) AND topic = %(topic)s AND namespace = %(namespace)s LIMIT 1
"""
# The planner's claim: schedules whose plan_at has come, locked, soonest first; another scanner
# skips them, and takes them once this one commits or dies.
CLAIM_SCHEDULES = f"""
SELECT {_SCHEDULE} FROM {tables.SCHEDULE} s
WHERE namespace = %(namespace)s AND plan_at IS NOT NULL AND plan_at <= %(now)s
ORDER BY plan_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
"""


@dataclass(frozen=True, slots=True)
class Planned:
    """A claimed schedule after a planning round (SAVE_PLANS takes orjson's dump of these)."""

    id: int
    planned_until: int
    plan_at: int | None


SAVE_PLANS = f"""
UPDATE {tables.SCHEDULE} s SET planned_until = u.planned_until, plan_at = u.plan_at
FROM json_to_recordset(%(rows)s::json) AS u({record(Planned)}) WHERE s.id = u.id
"""


@dataclass(frozen=True, slots=True)
class Gap:
    """Ticks a schedule missed and what its policy fired (INSERT_GAPS takes orjson's dump of these)."""

    schedule_id: int  # the row's id
    at: int
    first_tick: int
    last_tick: int
    missed: int
    fired: int
    policy: str


INSERT_GAPS = f"""
INSERT INTO {tables.SCHEDULE_GAP} (schedule_id, at, first_tick, last_tick, missed, fired, policy)
SELECT schedule_id, {from_millis("at")}, first_tick, last_tick, missed, fired, policy
FROM json_to_recordset(%(rows)s::json) AS u({record(Gap)})
"""


# ---- A schedule's recent ticks in the admin (ops/admin/schedules.py, through selectors.tick_messages) ----
# Self-contained: the ticks' msgIds are computed from the schedule's rule (core/schedules.py), and
# their rows probed by msgId, which leads message_natural_key and event_once. Each row comes with
# when its message first became ready (%(ready)s: its first history row into that status, 'sent'
# for a tick sent due, 'due' for one sent ahead), for the tick's lateness.
SCHEDULE_TICK_MESSAGES = f"""
SELECT m.id, m.msg_id, m.status, m.retry, m.max_retry, {to_millis("m.produce_time")}, {to_millis("m.updated_at")},
       (SELECT {to_millis("min(e.at)")} FROM {tables.EVENT} e
        WHERE e.msg_id = m.msg_id AND e.topic = m.topic AND e.namespace = m.namespace AND e.to_status = %(ready)s)
FROM {tables.MESSAGE} m
WHERE m.msg_id = ANY(%(msg_ids)s::text[]) AND m.topic = %(topic)s AND m.namespace = %(namespace)s
"""
