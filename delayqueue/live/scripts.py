"""The Lua scripts, each with one Python owner.

A script's header names its KEYS and ARGV in order (one `-- KEYS[n] name` / `-- ARGV[n] name`
line each); its `Script` reads them from there and reads its reply into a typed value. The
builder per script below is the only way the rest of the code builds a call, so no other module
knows an order or an index (tests/unit/test_script_headers.py holds each builder to its header).
A builder takes the runtime's ScriptContext (the channels, intervals, batch size and actor every
call shares), the topic, and keyword-only the values that vary per call.

Scripts are loaded with a prelude generated from Python: statuses, reasons and bounds
(core/constants.py), key suffixes and the meta hash's fields (keys.py), the event stream's
fields (history.py) and the stats hash's counters and field names (stats.py) are defined there
once and never spelled in Lua. Redis runs a script's prelude on every call, so each script gets
only the locals it names, and the name tables' fields are written into it as literals.
"""
import hashlib
import random
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from delayqueue.core.constants import (BURST_MILLIS, CHART_MINUTES, COLD_HOUR_MILLIS, IN_FLIGHT_MILLIS,
                                       LATENESS_BOUNDS_MS, MAX_PRIORITY, PRIORITY_BAND, RETRY_BACKOFF_JITTER,
                                       RETRY_BACKOFF_MAX_MILLIS, Reason, Status)
from delayqueue.core.messages import Message
from delayqueue.live import stats
from delayqueue.live.history import EVENT_FIELDS
from delayqueue.live.keys import (END_OF_MILLI, EVENTS_SUFFIX, HISTORY_SUFFIX, Bucket, Meta, NamespaceKeys, Shard,
                                  TopicKeys)

LUA_DIR = Path(__file__).with_name("lua")
_INCLUDE = re.compile(r"^-- @include (\w+)\s*$", re.MULTILINE)
_HEADER = re.compile(r"^-- (KEYS|ARGV)\[(\d+)\] (\w+)", re.MULTILINE)
_REPEATED = re.compile(r"^-- ARGV\[\d+\.\.\.\] per (\w+): ([\w, ]+)$", re.MULTILINE)


def _lua_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _lua_table(items) -> str:
    return "{" + ", ".join(items) + "}"


def _lua_field_function(name: str, template: str) -> str:
    """stats.FIELDS' template as a Lua function of its placeholders, in order."""
    params, parts = [], []
    for literal, placeholder, _spec, _conversion in string.Formatter().parse(template):
        if literal:
            parts.append(_lua_string(literal))
        if placeholder:
            params.append(placeholder)
            parts.append(placeholder)
    return f"local function stats_field_{name}({', '.join(params)}) return {' .. '.join(parts)} end"


def lua_prefix_pattern(template: str) -> str:
    """A Lua pattern matching a field of the template by what precedes its first placeholder, that
    placeholder as a number (captured), and the text after it up to the next placeholder."""
    (before, _first, *_), (after, *_) = list(string.Formatter().parse(template))[:2]
    escape = lambda text: re.sub(r"([\^$()%.\[\]*+\-?])", r"%\1", text)  # noqa: E731
    return f"^{escape(before)}(%d+){escape(after)}"


# The names a prelude line declares: `local A, B = ...` or `local function a(...)`.
_DECLARED = re.compile(r"^local (?:function )?(\w+(?:, \w+)*)")
_TABLE_FIELD = re.compile(r"\b([A-Z]+)\.([A-Za-z_]\w*)\b")
_COMMENT = re.compile(r"--.*$", re.MULTILINE)


def prelude(*, uses: str | None = None) -> str:
    """The values the scripts share, as Lua locals; with `uses` (a script's body), only those it
    names: Redis builds them on every call, and a send should not pay for the scanner's tables."""
    words = None if uses is None else names_used(uses)
    return "\n".join(line for line in _prelude_lines()
                     if words is None or not (m := _DECLARED.match(line)) or words & set(m.group(1).split(", ")))


def names_used(body: str) -> set[str]:
    """The words a script's code (its comments left out) names."""
    return set(re.findall(r"\w+", _COMMENT.sub("", body)))


def with_literals(body: str) -> str:
    """The script with each field of the prelude's name tables (STATUS.READY, META.PAUSED...)
    written as its value, so that no call builds the tables. A field no table has is an error
    when the scripts load, not a nil when one runs."""
    tables = _name_tables()

    def literal(match: re.Match) -> str:
        table, name = match.groups()
        if table not in tables:
            return match.group(0)
        if name not in tables[table]:
            raise ValueError(f"{match.group(0)}: {table} has no field {name}")
        return tables[table][name]

    return _TABLE_FIELD.sub(literal, body)


def _name_tables() -> dict[str, dict[str, str]]:
    """The prelude's tables of names, as Lua literals."""
    return {"STATUS": {s.name: str(s.value) for s in Status},
            "REASON": {r.name: _lua_string(r.value) for r in Reason},
            "META": {m.name: _lua_string(m.value) for m in Meta},
            "BUCKET": {b.name: _lua_string(b.value) for b in Bucket},
            "EVENT": {name: _lua_string(value) for name, value in EVENT_FIELDS.items()},
            "COUNTER": {c.name: _lua_string(c.value) for c in stats.Counter},
            "GAP": {g.name: _lua_string(g.value) for g in stats.Gap},
            "PART": {part.name: _lua_string(part.value) for part in stats.Part}}


def _prelude_lines() -> list[str]:
    return ([
        "-- Generated by delayqueue/live/scripts.py from delayqueue.core.constants and delayqueue.live.",
        # Written into the scripts as literals (with_literals); a table is built only for a script
        # that uses it otherwise.
        *(f"local {name} = " + _lua_table(f"{key} = {value}" for key, value in fields.items())
          for name, fields in _name_tables().items()),
        "local LATENESS_BOUNDS = " + _lua_table(str(bound) for bound in LATENESS_BOUNDS_MS),
        f"local CHART_MINUTES = {CHART_MINUTES}",
        f"local BURST_MILLIS = {BURST_MILLIS}",
        f"local COLD_HOUR_MILLIS = {COLD_HOUR_MILLIS}",
        f"local IN_FLIGHT_MILLIS = {IN_FLIGHT_MILLIS}",
        f"local MAX_PRIORITY, PRIORITY_BAND = {MAX_PRIORITY}, {PRIORITY_BAND}",
        f"local RETRY_BACKOFF_MAX_MILLIS, RETRY_BACKOFF_JITTER = {RETRY_BACKOFF_MAX_MILLIS}, {RETRY_BACKOFF_JITTER}",
        f"local EVENTS_SUFFIX, HISTORY_SUFFIX = '{EVENTS_SUFFIX}', '{HISTORY_SUFFIX}'",
        f"local END_OF_MILLI = '{END_OF_MILLI}'",
        "local LATENESS_OVERFLOW = " + _lua_string(stats.LATENESS_OVERFLOW),
        *(_lua_field_function(name, template) for name, template in stats.FIELDS.items()),
        "local STATS_INTERVAL_PATTERN = " + _lua_string(lua_prefix_pattern(stats.FIELDS[stats.INTERVAL_FIELDS[0]])),
        "local STATS_MINUTE_PATTERN = " + _lua_string(lua_prefix_pattern(stats.FIELDS[stats.MINUTE_FIELDS[0]])),
        "",
    ])


def _inline(source: str, included: set[str]) -> str:
    """Replaces each `-- @include name` with includes/<name>.lua (itself inlined), once per script."""

    def include(match: re.Match) -> str:
        name = match.group(1)
        if name in included:
            return ""
        included.add(name)
        return _inline((LUA_DIR / "includes" / f"{name}.lua").read_text(), included)

    return _INCLUDE.sub(include, source)


def header_names(text: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], str]:
    """A script's KEYS, ARGV and per-item ARGV names, and what an item is called in the plural
    (`-- ARGV[n...] per message: ...`: "messages", its builder's keyword), from its header;
    ValueError when the numbering skips or repeats."""
    names = {"KEYS": [], "ARGV": []}
    for kind, index, name in _HEADER.findall(text):
        if int(index) != len(names[kind]) + 1:
            raise ValueError(f"{kind}[{index}] out of order")
        names[kind].append(name)
    repeated = _REPEATED.search(text)
    if repeated is None:
        return tuple(names["KEYS"]), tuple(names["ARGV"]), (), ""
    return tuple(names["KEYS"]), tuple(names["ARGV"]), tuple(repeated.group(2).split(", ")), repeated.group(1) + "s"


class ScriptCall(NamedTuple):
    script: "Script"
    keys: list[str]
    args: list


@dataclass(frozen=True)
class Script:
    name: str
    reply: Callable[[Any], Any]  # the raw reply -> its typed value
    text: str = field(init=False, repr=False)  # lua/<name>.lua as written
    body: str = field(init=False, repr=False)  # the script, includes inlined and names as literals
    source: str = field(init=False, repr=False)  # what Redis runs: the prelude's locals it uses, then body
    sha: str = field(init=False)
    keys: tuple[str, ...] = field(init=False)  # KEYS in header order: names of TopicKeys fields
    args: tuple[str, ...] = field(init=False)  # ARGV in header order
    repeated: tuple[str, ...] = field(init=False)  # ARGV after `args`, once per item
    items: str = field(init=False)  # the builder's keyword for the items ("" when none)

    def __post_init__(self):
        text = (LUA_DIR / f"{self.name}.lua").read_text()
        body = with_literals(_inline(text, set()))
        source = prelude(uses=body) + body
        keys, args, repeated, items = header_names(text)
        for name, value in dict(text=text, body=body, source=source, sha=hashlib.sha1(source.encode()).hexdigest(), keys=keys,
                                args=args, repeated=repeated, items=items).items():
            object.__setattr__(self, name, value)


class SendReply(NamedTuple):
    created: bool  # False: the msgId's message is live or ended within the dedupe window (`stored`), or over a cap
    status: int  # the created message's status (ready if it was due when Redis took it)
    stored: Message | None  # the duplicate: live, or ended within the dedupe window
    new_topic: bool  # its caller must register the topic (first send, after retirement, or unconfirmed)
    over_live_cap: bool = False  # refused: the topic held its max_live live messages already
    over_namespace_cap: bool = False  # refused: the topic held its share of the namespace's live cap
    cold: bool = False  # created in the message log only: due after the topic's hot window
    logged_live: bool = False  # not created: the duplicate of the cold message the log holds out of Redis
    started_us: int | None = None  # created: Redis' clock (µs) when this life began, the order of a msgId's lives


class PullReply(NamedTuple):
    remaining: int  # messages left ready (every priority)
    messages: list[Message]  # the pulled messages, highest priority first, then oldest first
    retry_after_millis: int  # > 0: the topic's consume rate allowed no message, for this long
    paused: bool = False  # the topic is paused: nothing handed out
    next_due_us: int = -1  # µs until the topic's next waiting message is due (-1: none; 0: not looked at)
    server_now_us: int = 0  # Redis' clock (epoch µs) when it said so (core.clock.wait_seconds)
    due_shard: Shard | None = None  # a sharded topic's pull: the shard of that next due message


class Grant(NamedTuple):
    granted: int  # tokens taken (take_tokens) or messages admitted (admit_send)
    within_cap: int  # admit_send: messages under the topic's live-message cap (take_tokens: as asked)
    retry_after_millis: int  # until the bucket holds what it refused; 0 if it refused nothing


class HotWindow(NamedTuple):
    hot_until: int  # ms: Redis holds every live message of the topic due by then
    # the loader's position in the log (its fetched_to, else its loaded_to): "<triggerTime ms>:<row id>[:<fence>]"
    loaded_to: str
    cold: int | None  # messages in the log only (Meta.COLD); None: the topic has no count


class LoadReply(NamedTuple):
    loaded: int  # into the waiting set or ready; -1: another loader had moved on, and nothing was loaded
    held: int  # msgIds Redis already held (live, or in the same life)
    packed: int  # into packed lists (still counted cold)
    counted_out: int  # of those loaded, those counted out of the cold count (a send still on its way counted none)


class RetireReply(NamedTuple):
    retired: bool  # or, in a dry run, would be
    live_share: int  # the retired topic's share of its namespace's live cap, to give back
    cold: str = ""  # its meta's count of cold messages as it stood ("" for none)


class ColdPart(NamedTuple):
    cold: int  # a shard's part of its topic's count of cold messages (Meta.COLD; 0 for none)
    hours: list[tuple[int, int]]  # its cold_hours: (hour, count)


class HandedPart(NamedTuple):
    id: str  # what the current count's shards receive it under
    cold: int  # a retired count's shard's part of its topic's count of cold messages
    hours: list[tuple[int, int]]  # its cold_hours: (hour, count)


class ScanReply(NamedTuple):
    count: int  # messages the scanner script handled
    next_due_us: int  # µs until it has work again: 0 now, -1 nothing scheduled
    server_now_us: int  # Redis' clock (epoch µs) when it said so (core.clock.wait_seconds)


class PromoteReply(NamedTuple):
    """promote_due's ScanReply, and more."""

    count: int
    next_due_us: int
    server_now_us: int
    # µs until the earliest TTL of what it moved (-1: nothing), which the scanner's TTL timer must
    # not sleep past (waiting messages enter the expiry index as they become ready)
    expires_in_us: int
    stats: dict[str, int]  # what it counted: field -> what to add (a max part: at least this), for fold_stats


class PurgeReply(NamedTuple):
    purged: int  # live messages this call ended
    more: bool  # live messages remain: call again


class AckReply(NamedTuple):
    done: bool  # the message was consuming, and this call acked (or gave back, or dead-lettered) it
    status: int  # its status after the call (0: unknown)


class TouchReply(NamedTuple):
    touched: bool  # False: it was not consuming, or under another delivery than the one given
    ack_deadline: int  # the new ack deadline (epoch ms), when touched
    status: int  # when not touched: its status (0: unknown)
    retry: int  # when not touched: its retry (the delivery it is in, when consuming)


class RescheduleReply(NamedTuple):
    stored: Message | None  # the rescheduled message; None when not rescheduled
    status: int  # its status (0: unknown; waiting or ready when rescheduled)


class RestoreReply(NamedTuple):
    restored: int
    already_held: int  # Redis held the msgId already (in any status)


def _send_replies(raw) -> list[SendReply]:
    new_topic, now_us = raw[0] == 1, int(raw[1])
    return [_send_reply(code, value, new_topic, now_us) for code, value in zip(raw[2::2], raw[3::2])]


def _send_reply(code: int, value, new_topic: bool, now_us: int) -> SendReply:
    if code in (2, 3):
        return SendReply(False, 0, None, new_topic, over_live_cap=code == 2, over_namespace_cap=code == 3)
    if code == 4:
        return SendReply(True, Status.WAITING, None, new_topic, cold=True, started_us=now_us)
    if code == 5:
        return SendReply(False, 0, None, new_topic, logged_live=True)
    if code == 1:
        return SendReply(True, value, None, new_topic, started_us=now_us)
    return SendReply(False, 0, Message.from_json(value), new_topic)


def _hour_counts(flat) -> list[tuple[int, int]]:
    """A cold_hours hash as the count scripts reply it (hour, count, ...): (hour, count) pairs."""
    return list(zip(map(int, flat[::2]), map(int, flat[1::2])))


def _pull_reply(raw) -> PullReply:
    if int(raw[1]) < 0:
        return PullReply(int(raw[0]), [], 0, paused=True)
    if int(raw[1]) > 0:
        return PullReply(int(raw[0]), [], int(raw[1]))
    return PullReply(int(raw[0]), [Message.from_stored(stored, msg_id) for msg_id, stored in zip(raw[4::2], raw[5::2])],
                     0, next_due_us=int(raw[2]), server_now_us=int(raw[3]))


def _take_reply(raw) -> Grant:
    return Grant(int(raw[0]), -1, int(raw[1]))


def _admit_reply(raw) -> Grant:
    return Grant(int(raw[0]), int(raw[1]), int(raw[2]))


def _scan_reply(raw) -> ScanReply:
    return ScanReply(*(int(value) for value in raw))


def _promote_reply(raw) -> PromoteReply:
    return PromoteReply(*(int(value) for value in raw[:4]),
                        stats={name: int(value) for name, value in zip(raw[4::2], raw[5::2])})


def _ack_reply(raw) -> AckReply:
    return AckReply(raw[0] == 1, int(raw[1]))


def _ack_many_reply(raw) -> list[AckReply]:
    return [_ack_reply(raw[i:i + 2]) for i in range(0, len(raw), 2)]


def _touch_reply(raw) -> TouchReply:
    return TouchReply(True, int(raw[1]), 3, 0) if raw[0] == 1 else TouchReply(False, 0, int(raw[1]), int(raw[2]))


def _reschedule_reply(raw) -> RescheduleReply:
    if raw[0] not in (1, 4):
        return RescheduleReply(None, int(raw[1]))
    message = Message.from_json(raw[1])
    return RescheduleReply(message, message.status)


def _restore_reply(raw) -> RestoreReply:
    return RestoreReply(int(raw[0]), int(raw[1]))


SEND = Script("send", _send_replies)
PULL = Script("pull", _pull_reply)
ACK = Script("ack", _ack_many_reply)
NACK = Script("nack", _ack_reply)
DELETE = Script("delete", int)
GET = Script("get", lambda raw: None if raw is None else Message.from_json(raw))
PROMOTE_DUE = Script("promote_due", _promote_reply)
REQUEUE_TIMED_OUT = Script("requeue_timed_out", _scan_reply)
EXPIRE = Script("expire", _scan_reply)
PURGE_ENDED = Script("purge_ended", _scan_reply)
RETIRE_TOPIC = Script("retire_topic", lambda raw: RetireReply(raw[0] == 1, int(raw[1]), raw[2]))
PRUNE_STATS = Script("prune_stats", int)
LOCK_RENEW = Script("lock_renew", lambda raw: raw == 1)
LOCK_RELEASE = Script("lock_release", lambda raw: raw == 1)
LOCK_TAKE_OVER = Script("lock_take_over", lambda raw: raw == 1)
RESTORE = Script("restore", _restore_reply)
TAKE_TOKENS = Script("take_tokens", _take_reply)
ADMIT_SEND = Script("admit_send", _admit_reply)
LIVE_SHARE_SHORTFALL = Script("live_share_shortfall", int)
GRANT_LIVE_SHARE = Script("grant_live_share", int)
RELEASE_LIVE_SHARE = Script("release_live_share", int)
COVER_LIVE_SHARE = Script("cover_live_share", int)
BORROW_LIVE = Script("borrow_live", int)
REGISTER_TOPICS = Script("register_topics", int)
CONFIRM_REGISTERED = Script("confirm_registered", lambda raw: raw == 1)
PURGE_TOPIC = Script("purge_topic", lambda raw: PurgeReply(int(raw[0]), raw[1] == 1))
ADD_COUNTS = Script("add_counts", int)
TOUCH = Script("touch", _touch_reply)
RESCHEDULE = Script("reschedule", _reschedule_reply)
RAISE_HOT = Script("raise_hot", lambda raw: None if raw[0] == "" else HotWindow(int(raw[0]), raw[1],
                                                                              None if raw[2] == "" else int(raw[2])))
LOAD_COLD = Script("load_cold", lambda raw: LoadReply(*map(int, raw)))
UNPACK_DUE = Script("unpack_due", _scan_reply)

COLD_PART = Script("cold_part", lambda raw: None if raw is None else ColdPart(int(raw[0]), _hour_counts(raw[1:])))
FORGET_COLD = Script("forget_cold", lambda raw: raw == 1)
HAND_COLD = Script("hand_cold", lambda raw: HandedPart(raw[0], int(raw[1]), _hour_counts(raw[2:])) if raw else None)
RECEIVE_COLD = Script("receive_cold", lambda raw: raw == 1)
HANDED_COLD = Script("handed_cold", lambda raw: raw == 1)
IS_COLD = Script("is_cold", lambda raw: raw == 1)
PURGE_COLD = Script("purge_cold", str)
TAKE_STATS = Script("take_stats", lambda raw: dict(zip(raw[::2], raw[1::2])))
FOLD_STATS = Script("fold_stats", int)

SCRIPTS = (SEND, PULL, ACK, NACK, DELETE, GET, PROMOTE_DUE, REQUEUE_TIMED_OUT, EXPIRE, PURGE_ENDED, RETIRE_TOPIC,
           PRUNE_STATS, LOCK_RENEW, LOCK_RELEASE, LOCK_TAKE_OVER, RESTORE, TAKE_TOKENS, ADMIT_SEND, LIVE_SHARE_SHORTFALL,
           GRANT_LIVE_SHARE, RELEASE_LIVE_SHARE, COVER_LIVE_SHARE, BORROW_LIVE, REGISTER_TOPICS, CONFIRM_REGISTERED,
           PURGE_TOPIC, TOUCH, RESCHEDULE, ADD_COUNTS, RAISE_HOT, LOAD_COLD, PURGE_COLD, TAKE_STATS,
           FOLD_STATS, UNPACK_DUE, IS_COLD, COLD_PART, FORGET_COLD, HAND_COLD, RECEIVE_COLD, HANDED_COLD)


async def load_scripts(client) -> None:
    """SCRIPT LOAD every script (on a cluster, on every primary)."""
    for script in SCRIPTS:
        await client.script_load(script.source)  # redis-py sends it to every primary of a cluster


@dataclass(frozen=True, slots=True)
class ScriptContext:
    """What every script call of a runtime shares: its namespace's keys and channels, who acts (the
    history's 'process@host', '' with the message log off: the scripts then record nothing), and
    the service's intervals and batch size. Built by each Runtime; the builders fill the ARGV these
    name (CONTEXT_ARGS) from it."""

    ns: NamespaceKeys
    actor: str
    stats_interval_millis: int  # DELAYQUEUE_MONITOR_INTERVAL_SECONDS in ms
    retention_millis: int  # DELAYQUEUE_ENDED_RETENTION_MILLIS
    scan_limit: int  # DELAYQUEUE_SCANNER_BATCH
    pack_lead_millis: int = 0  # QueueConfig.pack_lead: 0 when nothing is packed

    @property
    def ready_channel(self) -> str:
        return self.ns.ready_channel

    @property
    def schedule_channel(self) -> str:
        return self.ns.schedule_channel


# The ARGV a builder fills from its context, and the topic it is given.
CONTEXT_ARGS = frozenset({"topic", "actor", "stats_interval_millis", "retention_millis", "scan_limit", "ready_channel",
                          "schedule_channel", "pack_lead_millis"})


# One builder per script: it writes KEYS and ARGV out in header order (plain lists: a send builds
# one per message); tests/unit/test_script_headers.py calls each with every value standing for its
# slot. A message's scripts act on its shard's keys (live/shards.py), a topic's own when unsharded.

def send(ctx: ScriptContext, topic: str | Shard, *, max_live: int, namespace_capped: bool, dedupe_window_millis: int,
         cold_tier: bool, messages: Sequence[Sequence]) -> ScriptCall:
    """`messages`: per message of the topic the values named by SEND.repeated, in that order
    (logged_waiting None for none). Replies a SendReply per message, in order."""
    k = ctx.ns.topic(topic)
    args = [k.topic, ctx.ns.ready_channel, ctx.ns.wake_channel(topic), ctx.stats_interval_millis, max_live,
            _flag(namespace_capped), ctx.retention_millis, ctx.actor, dedupe_window_millis, _flag(cold_tier),
            ctx.pack_lead_millis]
    for *values, logged_waiting in messages:
        args += values
        args.append("" if logged_waiting is None else logged_waiting)
    return ScriptCall(SEND, [k.waiting, k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.meta, k.stats, k.prioritised,
                             k.events, k.cold_hours, k.packed, k.cold_sent], args)


def pull(ctx: ScriptContext, topic: str | Shard, *, batch: int, ack_timeout_millis: int, consume_rate: int,
         max_inflight: int, paused: bool = False, push_url: str = "", push_secret_id: str = "") -> ScriptCall:
    """`paused`: the process' topic settings say the topic is paused (held while its meta has no pause field);
    `push_url`: "" for a consumer's pull, else the URL the pusher pulling POSTs to; `push_secret_id`: ""
    for a consumer's pull, else which secret the pusher signs with."""
    k = ctx.ns.topic(topic)
    return ScriptCall(PULL, [k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.stats, k.meta, k.events, k.buckets,
                             k.prioritised, k.waiting],
                      [batch, ack_timeout_millis, ctx.retention_millis, ctx.stats_interval_millis,
                       ctx.ns.wake_channel(topic), k.topic, ctx.actor, consume_rate, ctx.scan_limit,
                       ctx.ns.ready_channel, max_inflight, _flag(paused), push_url, push_secret_id])


def ack(ctx: ScriptContext, topic: str | Shard, *, push_status: str = "",
        acks: Sequence[tuple[str, int | str]]) -> ScriptCall:
    """Replies an AckReply per ack, in order. `push_status`: a push's HTTP status, when the ack is
    its 2xx answer. `acks`: (msgId, the retry of the delivery acked or '' for any), as `acks_of`
    makes them."""
    k = ctx.ns.topic(topic)
    args = [ctx.retention_millis, ctx.stats_interval_millis, ctx.actor, push_status]
    for msg_id, retry in acks:
        args += [msg_id, retry]
    return ScriptCall(ACK, [k.inflight, k.msgs, k.expiry, k.ended, k.stats, k.meta, k.events], args)


def acks_of(msg_ids: Sequence[str], retries: Sequence[int | None] | None = None) -> list[tuple[str, int | str]]:
    """ack's acks: each msgId with its delivery's retry (None, or no retries: any)."""
    if retries is None:
        return [(msg_id, "") for msg_id in msg_ids]
    return [(msg_id, _any_retry(retry)) for msg_id, retry in zip(msg_ids, retries, strict=True)]


def _any_retry(retry: int | None) -> int | str:
    """A delivery's retry as the settling scripts take it: '' for any."""
    return "" if retry is None else retry


def nack(ctx: ScriptContext, topic: str | Shard, *, msg_id: str, delay_millis: int, dead_letter: bool,
         seed: int | None = None, push_failure: str = "", default_backoff_millis: int = 0,
         reason: str = "", retry: int | None = None) -> ScriptCall:
    """`delay_millis` -1: none given (the topic's retry backoff applies, or one starting at
    `default_backoff_millis` when the topic has none); `push_failure`: a failed push attempt's
    status or error, when the nack is its outcome; `reason`: a consumer's why, the history's detail;
    `seed` of the backoff's jitter (random if None); `retry`: the delivery given back (None: any)."""
    k = ctx.ns.topic(topic)
    return ScriptCall(NACK, [k.inflight, k.ready, k.msgs, k.expiry, k.ended, k.stats, k.meta, k.events, k.waiting,
                             k.prioritised],
                      [msg_id, ctx.retention_millis, ctx.stats_interval_millis, ctx.ns.ready_channel, k.topic,
                       ctx.actor, delay_millis, _flag(dead_letter), ctx.ns.wake_channel(topic), _seed(seed),
                       push_failure, default_backoff_millis, reason, _any_retry(retry)])


def touch(ctx: ScriptContext, topic: str | Shard, *, msg_id: str, ack_timeout_millis: int,
          retry: int | None = None) -> ScriptCall:
    """`retry`: the delivery whose deadline is extended (None: any)."""
    k = ctx.ns.topic(topic)
    return ScriptCall(TOUCH, [k.inflight, k.msgs, k.meta, k.events],
                      [msg_id, ack_timeout_millis, ctx.ns.wake_channel(topic), k.topic, ctx.actor, _any_retry(retry)])


def reschedule(ctx: ScriptContext, topic: str | Shard, *, msg_id: str, trigger_time: int, delay_millis: int,
               cold: str = "", old_trigger_time: int = 0, signed: bool = False) -> ScriptCall:
    """`trigger_time` -1: Redis' now + `delay_millis`. `cold`: a cold message as rescheduled in the
    log (Message.to_stored), its triggerTime before in `old_trigger_time` (answered as rescheduled
    whether it comes into Redis or stays in the log only); `signed`: the topic is sharded."""
    k = ctx.ns.topic(topic)
    return ScriptCall(RESCHEDULE, [k.waiting, k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.stats, k.meta,
                                   k.events, k.prioritised, k.cold_hours, k.packed],
                      [msg_id, trigger_time, delay_millis, ctx.retention_millis, ctx.stats_interval_millis,
                       ctx.ns.ready_channel, ctx.ns.wake_channel(topic), k.topic, ctx.actor, cold, old_trigger_time,
                       _flag(signed)])


def delete(ctx: ScriptContext, topic: str | Shard, *, msg_id: str, release: bool, tombstone: str = "",
           release_ended: bool = False, counted_cold: bool = False, signed: bool = False) -> ScriptCall:
    """Replies 1 (deleted), 0 (had ended), -1 (not held), 2 (`tombstone` kept: a message deleted
    in the log, as Message.to_stored gives it, counted out of the cold count if `counted_cold`, of
    this shard's signed part if `signed`: the topic is sharded) or 3
    (deleted with release, due after loaded_to: its body is kept until the caller has ended its log
    row, then frees it with `release_ended`, which frees an ended body only)."""
    k = ctx.ns.topic(topic)
    return ScriptCall(DELETE, [k.waiting, k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.stats, k.events,
                               k.prioritised, k.meta, k.cold_hours, k.packed, k.released],
                      [msg_id, _flag(release), ctx.retention_millis, ctx.stats_interval_millis, ctx.actor, tombstone,
                       _flag(release_ended), _flag(counted_cold), _flag(signed)])


def get(ctx: ScriptContext, topic: str | Shard, *, msg_id: str) -> ScriptCall:
    k = ctx.ns.topic(topic)
    return ScriptCall(GET, [k.waiting, k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.stats, k.events,
                            k.prioritised],
                      [msg_id, ctx.retention_millis, ctx.stats_interval_millis, ctx.actor])


def promote_due(ctx: ScriptContext, topic: str | Shard) -> ScriptCall:
    k = ctx.ns.topic(topic)
    return ScriptCall(PROMOTE_DUE, [k.waiting, k.ready, k.msgs, k.expiry, k.ended, k.events, k.prioritised],
                      [ctx.scan_limit, ctx.retention_millis, ctx.stats_interval_millis, ctx.ns.ready_channel,
                       ctx.actor])


def requeue_timed_out(ctx: ScriptContext, topic: str | Shard, *, seed: int | None = None) -> ScriptCall:
    """`seed` of the backoff's jitter (random if None)."""
    k = ctx.ns.topic(topic)
    return ScriptCall(REQUEUE_TIMED_OUT, [k.inflight, k.ready, k.msgs, k.expiry, k.ended, k.stats, k.events,
                                          k.waiting, k.meta, k.prioritised],
                      [ctx.scan_limit, ctx.retention_millis, ctx.stats_interval_millis, ctx.ns.ready_channel, k.topic,
                       ctx.actor, ctx.ns.wake_channel(topic), _seed(seed)])


def expire(ctx: ScriptContext, topic: str | Shard) -> ScriptCall:
    k = ctx.ns.topic(topic)
    return ScriptCall(EXPIRE, [k.waiting, k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.stats, k.events,
                               k.prioritised],
                      [ctx.scan_limit, ctx.retention_millis, ctx.stats_interval_millis, ctx.actor])


def purge_ended(ctx: ScriptContext, topic: str | Shard) -> ScriptCall:
    k = ctx.ns.topic(topic)
    return ScriptCall(PURGE_ENDED, [k.msgs, k.ended], [ctx.scan_limit])


# The scanner moves a second's packed list in calls of at most this many messages: a due promotion
# then waits behind one call, well under a ms, not behind a whole list (docs/benchmarks.md,
# "Packed lists in sharded topics").
UNPACK_PER_CALL = 100


def unpack_due(ctx: ScriptContext, topic: str | Shard, *, limit: int = UNPACK_PER_CALL) -> ScriptCall:
    k = ctx.ns.topic(topic)
    return ScriptCall(UNPACK_DUE, [k.packed, k.meta, k.waiting, k.ready, k.prioritised, k.msgs, k.expiry, k.ended,
                                   k.events, k.cold_hours, k.stats, k.released],
                      [k.topic, ctx.ns.ready_channel, ctx.actor, ctx.pack_lead_millis, limit,
                       ctx.stats_interval_millis])


def retire_topic(ctx: ScriptContext, topic: str | Shard, *, idle_millis: int, dry_run: bool = False,
                 cold: str = "") -> ScriptCall:
    """`cold`: "" for an unsharded topic; for a shard of a sharded topic, "=" and its part of the
    topic's cold count as read (RetireReply.cold), which must not have moved, or "*" (a dry run's
    first look) for any."""
    k = ctx.ns.topic(topic)
    return ScriptCall(RETIRE_TOPIC, [k.waiting, k.ready, k.inflight, k.msgs, k.meta, k.stats, k.events, k.prioritised],
                      [idle_millis, _flag(dry_run), cold])


def raise_hot(ctx: ScriptContext, topic: str | Shard, *, hot_until: int, loaded_to: str, start: bool,
              signed: bool = False, fetched_to: str = "") -> ScriptCall:
    """Replies the topic's HotWindow, None if it has none (and `start` is off). `loaded_to` (and
    `fetched_to`, if any): where a topic that had no hot_until starts; `signed`: a sharded topic's
    shard, which keeps a count."""
    k = ctx.ns.topic(topic)
    return ScriptCall(RAISE_HOT, [k.meta, k.cold_hours],
                      [hot_until, loaded_to, _flag(start), _flag(signed), fetched_to])


def load_cold(ctx: ScriptContext, topic: str | Shard, *, loaded_from: str, loaded_to: str, pack_lead: int,
              in_flight_millis: int, messages: Sequence[Sequence]) -> ScriptCall:
    """`messages`: per message the values named by LOAD_COLD.repeated, in that order. `pack_lead`:
    the packed lists' (ctx.pack_lead_millis), or 0 to pack nothing; a message produced less than
    `in_flight_millis` ago is not packed (its send may be on its way; 0: packs any)."""
    k = ctx.ns.topic(topic)
    args = [ctx.ns.ready_channel, ctx.ns.wake_channel(topic), k.topic, ctx.actor, loaded_from, loaded_to,
            pack_lead, in_flight_millis, ctx.stats_interval_millis, *_flat(messages)]
    return ScriptCall(LOAD_COLD, [k.waiting, k.ready, k.msgs, k.expiry, k.meta, k.events, k.prioritised, k.ended,
                                  k.cold_hours, k.packed, k.stats, k.cold_sent, k.released],
                      args)


def cold_part(ctx: ScriptContext, topic: str | Shard, *, cold: int) -> ScriptCall:
    """Replies the topic's ColdPart if its count is still `cold` and it has no packed list, else None."""
    k = ctx.ns.topic(topic)
    return ScriptCall(COLD_PART, [k.meta, k.cold_hours, k.packed], [cold])


def forget_cold(ctx: ScriptContext, topic: str | Shard, *, cold: int, forget_window: bool,
                hours: Sequence[Sequence[int]]) -> ScriptCall:
    """`cold` and `hours`: what cold_part found (its ColdPart), taken away. Replies whether the count was dropped."""
    k = ctx.ns.topic(topic)
    return ScriptCall(FORGET_COLD, [k.meta, k.cold_hours], [cold, _flag(forget_window), *_flat(hours)])


def hand_cold(ctx: ScriptContext, topic: str | Shard, *, part_id: str) -> ScriptCall:
    """Replies the HandedPart the shard (of a retired count) is handing on, taken now under `part_id`
    (new) if none was: None if it has no part, or a packed list is left."""
    k = ctx.ns.topic(topic)
    return ScriptCall(HAND_COLD, [k.meta, k.cold_hours, k.packed], [part_id])


def receive_cold(ctx: ScriptContext, topic: str | Shard, *, part_id: str, cold: int,
                 hours: Sequence[Sequence[int]]) -> ScriptCall:
    """A current shard's share (`cold`, `hours`) of the HandedPart `part_id`. Replies whether it was added now."""
    k = ctx.ns.topic(topic)
    return ScriptCall(RECEIVE_COLD, [k.meta, k.cold_hours], [part_id, cold, *_flat(hours)])


def handed_cold(ctx: ScriptContext, topic: str | Shard, *, part_id: str) -> ScriptCall:
    """Drops the HandedPart `part_id` the shard hands on. Replies whether it did."""
    return ScriptCall(HANDED_COLD, [ctx.ns.topic(topic).meta], [part_id])


def is_cold(ctx: ScriptContext, topic: str | Shard, *, msg_id: str, trigger_time: int) -> ScriptCall:
    """Whether the msgId, which the log holds waiting after loaded_to with this triggerTime, is cold."""
    k = ctx.ns.topic(topic)
    return ScriptCall(IS_COLD, [k.msgs, k.meta, k.packed], [msg_id, trigger_time])


def purge_cold(ctx: ScriptContext, topic: str | Shard, *, purged: int, signed: bool,
               hours: Sequence[Sequence[int]]) -> ScriptCall:
    """Replies the topic's loaded_to as fenced ('' if it has none). `signed`: the topic is sharded.
    `hours`: (hour, purged due in it) pairs."""
    k = ctx.ns.topic(topic)
    return ScriptCall(PURGE_COLD, [k.meta, k.stats, k.cold_hours, k.packed],
                      [purged, ctx.stats_interval_millis, _flag(signed), *_flat(hours)])


def prune_stats(ctx: ScriptContext, topic: str | Shard) -> ScriptCall:
    return ScriptCall(PRUNE_STATS, [ctx.ns.topic(topic).stats], [ctx.stats_interval_millis])


def lock_renew(ctx: ScriptContext, topic: str | Shard, *, token: str, ttl_millis: int) -> ScriptCall:
    return ScriptCall(LOCK_RENEW, [ctx.ns.topic(topic).lock], [token, ttl_millis])


def lock_release(ctx: ScriptContext, topic: str | Shard, *, token: str) -> ScriptCall:
    return ScriptCall(LOCK_RELEASE, [ctx.ns.topic(topic).lock], [token])


def lock_take_over(ctx: ScriptContext, topic: str | Shard, *, gone_token: str, token: str,
                   ttl_millis: int) -> ScriptCall:
    return ScriptCall(LOCK_TAKE_OVER, [ctx.ns.topic(topic).lock], [gone_token, token, ttl_millis])


def restore(ctx: ScriptContext, topic: str | Shard, *, dry_run: bool, with_times: bool, cold_counted: bool,
            messages: Sequence[Sequence]) -> ScriptCall:
    """`messages`: per message the values named by RESTORE.repeated, in that order. `cold_counted`:
    the caller has set the topic's cold count to the rows it leaves in the log (else the messages
    brought back that were cold, packed ones too, are counted out)."""
    k = ctx.ns.topic(topic)
    args = [ctx.ns.ready_channel, ctx.ns.wake_channel(topic), k.topic, _flag(dry_run), ctx.actor, _flag(with_times),
            _flag(cold_counted), *_flat(messages)]
    return ScriptCall(RESTORE, [k.waiting, k.ready, k.msgs, k.expiry, k.meta, k.events, k.prioritised, k.cold_hours,
                                k.released, k.packed], args)


def take_tokens(ctx: ScriptContext, topic: str | None, *, kind: str, wanted: int, rate: int) -> ScriptCall:
    """From the topic's bucket, or with topic None the namespace's."""
    k = ctx.ns if topic is None else ctx.ns.topic(topic)
    return ScriptCall(TAKE_TOKENS, [k.buckets], [kind, wanted, rate])


def _live_count_keys(k: TopicKeys) -> list[str]:
    """What live_count reads (includes/cold_count.lua): the topic's queues, then its meta."""
    return [k.waiting, k.ready, k.prioritised, k.inflight, k.meta]


def admit_send(ctx: ScriptContext, topic: str, *, wanted: int, produce_rate: int, max_live: int) -> ScriptCall:
    k = ctx.ns.topic(topic)
    return ScriptCall(ADMIT_SEND, [k.buckets, *_live_count_keys(k)], [wanted, produce_rate, max_live])


def live_share_shortfall(ctx: ScriptContext, topic: str | Shard, *, wanted: int) -> ScriptCall:
    k = ctx.ns.topic(topic)
    return ScriptCall(LIVE_SHARE_SHORTFALL, _live_count_keys(k), [wanted])


def grant_live_share(ctx: ScriptContext, topic: str | Shard, *, amount: int) -> ScriptCall:
    return ScriptCall(GRANT_LIVE_SHARE, [ctx.ns.topic(topic).meta], [amount])


def release_live_share(ctx: ScriptContext, topic: str | Shard) -> ScriptCall:
    k = ctx.ns.topic(topic)
    return ScriptCall(RELEASE_LIVE_SHARE, _live_count_keys(k), [])


def cover_live_share(ctx: ScriptContext, topic: str | Shard) -> ScriptCall:
    k = ctx.ns.topic(topic)
    return ScriptCall(COVER_LIVE_SHARE, _live_count_keys(k), [])


def borrow_live(ctx: ScriptContext, *, wanted: int, max_live: int, held: int) -> ScriptCall:
    return ScriptCall(BORROW_LIVE, [ctx.ns.live_pool], [wanted, max_live, held])


def register_topics(ctx: ScriptContext, *, at: int, topics: Sequence[str]) -> ScriptCall:
    return ScriptCall(REGISTER_TOPICS, [ctx.ns.topics], [at, *topics])


def confirm_registered(ctx: ScriptContext, topic: str | Shard) -> ScriptCall:
    return ScriptCall(CONFIRM_REGISTERED, [ctx.ns.topic(topic).meta], [])


def purge_topic(ctx: ScriptContext, topic: str | Shard) -> ScriptCall:
    k = ctx.ns.topic(topic)
    return ScriptCall(PURGE_TOPIC, [k.waiting, k.ready, k.inflight, k.msgs, k.expiry, k.ended, k.events, k.stats,
                                    k.prioritised],
                      [ctx.scan_limit, ctx.retention_millis, ctx.actor, ctx.stats_interval_millis])


def take_stats(ctx: ScriptContext, topic: str | Shard) -> ScriptCall:
    """Replies the shard's stats hash, which it deletes."""
    return ScriptCall(TAKE_STATS, [ctx.ns.topic(topic).stats], [])


def fold_stats(ctx: ScriptContext, topic: str | Shard, *, fields: Sequence[Sequence]) -> ScriptCall:
    """`fields`: per field the values named by FOLD_STATS.repeated (its name, its value)."""
    return ScriptCall(FOLD_STATS, [ctx.ns.topic(topic).stats], _flat(fields))


def add_counts(ctx: ScriptContext, *, fields: Sequence[Sequence]) -> ScriptCall:
    """`fields`: per field the values named by ADD_COUNTS.repeated (its name, what to add)."""
    return ScriptCall(ADD_COUNTS, [ctx.ns.pushes], _flat(fields))


def _flat(items: Sequence[Sequence]) -> list:
    """The ARGV of a script's repeated values: each item's, one item after another."""
    return [value for item in items for value in item]


def _flag(value: bool) -> int:
    """A yes/no ARGV as the scripts read it."""
    return 1 if value else 0


def _seed(seed: int | None) -> int:
    """A seed for a script's math.random (Redis seeds it alike for every call)."""
    return random.getrandbits(31) if seed is None else seed


BUILDERS = {script.name: globals()[script.name] for script in SCRIPTS}
