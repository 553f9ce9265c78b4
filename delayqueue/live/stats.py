"""A topic's stats hash: camellia's request counters per monitor interval with their lifetime
totals, the request gaps (triggerTime to pull, triggerTime to ready), and the fire-lateness
histogram and per-minute series.

Its field names have one owner, this module: the scripts write them through the prelude
(live/scripts.py generates the COUNTER, GAP and PART tables and one Lua function per FIELDS template
from what is declared here), and services/topics.py and ops/figures.py read them through
`field`.
"""
from enum import StrEnum


class Counter(StrEnum):
    """What a topic counts per interval and in total (camellia's request types)."""

    SEND = "sendMsg"
    PULL = "pullMsg"  # messages handed out
    DELETE = "deleteMsg"
    ACK = "ackMsg"
    GET = "getMsg"
    READY = "triggerMsgReady"
    END_LIFE = "triggerMsgEndLife"
    TIMEOUT = "triggerMsgTimeout"


class Gap(StrEnum):
    """A delay from a message's triggerTime, as count, sum and max per interval."""

    PULL = "pullGap"  # to its pull
    READY = "readyGap"  # to its promotion


class Part(StrEnum):
    """The parts of a gap, and of the fire lateness in all and per minute (no max in all)."""

    COUNT = "count"
    SUM = "sum"
    MAX = "max"


# The fire-lateness bucket past the last of LATENESS_BOUNDS_MS.
LATENESS_OVERFLOW = "inf"

# Each field's template; the scripts get a function per template (stats_field_<name>) taking its
# placeholders in order. An interval or minute placeholder is an index: epoch ms // its length.
FIELDS = {
    "counter": "{interval}:{name}",
    "total": "total:{name}",
    "gap": "{interval}:{name}:{part}",
    "lateness_bucket": "lateness:le:{bound}",  # per LATENESS_BOUNDS_MS bound, and LATENESS_OVERFLOW
    "lateness": "lateness:{part}",  # count and sum
    "minute_lateness": "m{minute}:lateness:{part}",  # count, sum and max
}
# Fields prune_stats.lua drops once old: those that start with an interval or a minute.
INTERVAL_FIELDS = ("counter", "gap")
MINUTE_FIELDS = ("minute_lateness",)
_MAX_SUFFIX = f":{Part.MAX}"


def added(hashes: list[dict[str, str]]) -> dict[str, int]:
    """A sharded topic's stats hash from its shards' (live/shards.py): each field added up, but
    a max part, which is the greatest."""
    total: dict[str, int] = {}
    for fields in hashes:
        add_into(total, fields)
    return total


def add_into(total: dict[str, int], fields: dict[str, str] | dict[str, int]) -> None:
    """Adds `fields` into `total` as fold_stats.lua adds them into a stats hash: each field added,
    but a max part, which keeps the greater."""
    for name, value in fields.items():
        total[name] = (max(total.get(name, 0), int(value)) if name.endswith(_MAX_SUFFIX)
                       else total.get(name, 0) + int(value))


def field(template: str, **values) -> str:
    """The name of a field of the stats hash, e.g. field("counter", interval=12, name=Counter.SEND)."""
    return FIELDS[template].format(**values)
