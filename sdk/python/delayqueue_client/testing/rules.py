"""The server's parameter checks (delayqueue/api/validation.py, which words them through Django
REST framework) restated for the fake: the same fields, bounds and order, the same `msg` texts
("<parameter>: <problem>") for what they refuse. And the server's reading of a schedule's cron
rule (delayqueue/core/schedule_rules.py), as far as refusing one goes: the fake fires no cron
ticks, so it computes none."""
import functools
import re
import zoneinfo
from dataclasses import dataclass, field
from typing import Any, Callable

MAX_TOPIC_BYTES = 255
MAX_MSG_ID_LENGTH = 256
MAX_DELAY_MILLIS = 10 * 365 * 86_400_000
JAVA_LONG_MIN = -2 ** 63  # a sendMsg's lowest delayMillis, as camellia's
MAX_TRIGGER_TIME_MILLIS = 4_102_444_800_000  # 2100-01-01
MAX_RETRY = 100_000
MAX_PRIORITY = 9
MIN_COUNT = -100_000
MAX_LIMIT = 1_000_000_000
MAX_REASON_LENGTH = 200  # the server's MAX_EVENT_DETAIL: a nack's reason
DEAD_LIST_DEFAULT_LIMIT = 100
DEAD_LIST_MAX_LIMIT = 1000
REDRIVE_DEFAULT_RATE = 500
REDRIVE_MAX_RATE = 100_000
RETRY_BACKOFF_MAX_MILLIS = 3_600_000
MAX_SCHEDULE_ID_LENGTH = 128
SCHEDULE_LIST_DEFAULT_LIMIT = 100
SCHEDULE_LIST_MAX_LIMIT = 1000
CATCH_UP = ("latest", "all", "skip")

TOPIC_RULE = f"must be 1-{MAX_TOPIC_BYTES} bytes of UTF-8 text without control characters"
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_MSG_ID_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_LONG_TEXT = re.compile(r"[+-]?[0-9]+")  # as Java's Long.parseLong reads a number, ASCII digits only
_MAX_NUMBER_TEXT = 1000
_DEAD_CURSOR = re.compile(r"^[0-9]{1,18}\.[0-9]{1,18}$")
_TRUE = {"t", "T", "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON", "1", 1, True}
_FALSE = {"f", "F", "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF", "0", 0, 0.0, False}
# Parameters whose empty value is itself an answer; any other empty parameter counts as absent.
KEEP_EMPTY = {"topic", "msg", "msgId", "pushUrl"}
_ABSENT = object()


class Invalid(Exception):
    """A parameter the server refuses: code 400 with this text."""


@functools.lru_cache(maxsize=1024)
def topic_problem(topic: str) -> str | None:
    if not topic:
        return f"{TOPIC_RULE}; it is empty"
    refused = _CONTROL.search(topic)
    if refused:
        return f"{TOPIC_RULE}; it has U+{ord(refused[0]):04X}"
    size = len(topic.encode("utf-8"))
    return f"{TOPIC_RULE}; it is {size} bytes" if size > MAX_TOPIC_BYTES else None


@dataclass(frozen=True)
class Field:
    """One parameter: `kind` int, bool, text or list (of msgIds); absent and not required: `default`."""

    kind: str
    required: bool = False
    default: Any = _ABSENT
    low: int | None = None
    high: int | None = None
    trim: bool = True
    allow_blank: bool = False
    not_blank: bool = False  # untrimmed text of spaces only is refused as blank (a msgId)
    max_length: int | None = None
    refused: re.Pattern[str] | None = None  # searched in the text as sent
    check: Callable[[str], str | None] | None = None  # a problem of the whole text, or None
    blank_error: str = "This field may not be blank."
    messages: dict[str, str] = field(default_factory=dict)

    def clean(self, value: Any) -> Any:
        if value is None:
            raise Invalid("This field may not be null.")
        return _CLEANERS[self.kind](self, value)

    def _int(self, value: Any) -> int:
        if type(value) is int or (type(value) is float and value.is_integer()):  # a JSON number that is whole
            number = int(value)
        elif type(value) is str and len(value) > _MAX_NUMBER_TEXT:
            raise Invalid("String value too large.")
        elif type(value) is str and _LONG_TEXT.fullmatch(value):
            number = int(value)
        else:
            raise Invalid("A valid integer is required.")
        if self.high is not None and number > self.high:
            raise Invalid(f"Ensure this value is less than or equal to {self.high}.")
        if self.low is not None and number < self.low:
            raise Invalid(f"Ensure this value is greater than or equal to {self.low}.")
        return number

    def _bool(self, value: Any) -> bool:
        try:
            if value in _TRUE:
                return True
            if value in _FALSE:
                return False
        except TypeError:  # unhashable
            pass
        raise Invalid("Must be a valid boolean.")

    def _text(self, value: Any) -> str:
        if isinstance(value, str) and self.refused is not None and self.refused.search(value):
            raise Invalid("must not contain control characters")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise Invalid("Not a valid string.")
        text = str(value)
        if text == "" or (self.trim and text.strip() == ""):
            if not self.allow_blank:
                raise Invalid(self.blank_error)
            return ""
        if self.trim:
            text = text.strip()
        elif self.not_blank and text.isspace():
            raise Invalid(self.blank_error)
        if self.max_length is not None and len(text) > self.max_length:
            raise Invalid(f"Ensure this field has no more than {self.max_length} characters.")
        if "\x00" in text:
            raise Invalid("Null characters are not allowed.")
        problem = self.check(text) if self.check else None
        if problem:
            raise Invalid(problem)
        return text

    def _retries(self, value: Any) -> list[int | None]:
        return self._items(value, lambda item: None if item is None else DELIVERY_RETRY.clean(item))

    def _list(self, value: Any) -> list[str]:
        if isinstance(value, list) and not value:
            raise Invalid(self.messages.get("empty", "This list may not be empty."))
        return self._items(value, MSG_ID.clean)

    def _items(self, value: Any, clean: Callable[[Any], Any]) -> list[Any]:
        """A JSON list, each item cleaned; DRF's words for what is not a list, an item's index before its error."""
        if not isinstance(value, list):
            default = f'Expected a list of items but got type "{type(value).__name__}".'
            raise Invalid(self.messages.get("not_a_list", default))
        cleaned = []
        for i, item in enumerate(value):
            try:
                cleaned.append(clean(item))
            except Invalid as exc:
                raise Invalid(f"{i}: {exc}") from None
        return cleaned


_CLEANERS: dict[str, Callable[[Field, Any], Any]] = {
    "int": Field._int, "bool": Field._bool, "text": Field._text, "list": Field._list, "retries": Field._retries}
TOPIC = Field("text", required=True, trim=False, check=topic_problem, blank_error=topic_problem("") or "")
_OPTIONAL_TOPIC = Field("text", trim=False, check=topic_problem, blank_error=topic_problem("") or "")
MSG_ID = Field("text", required=True, trim=False, not_blank=True, max_length=MAX_MSG_ID_LENGTH,
               refused=_MSG_ID_CONTROL)


def millis(**kwargs: Any) -> Field:
    kwargs.setdefault("low", -MAX_DELAY_MILLIS)
    return Field("int", high=MAX_DELAY_MILLIS, **kwargs)


TRIGGER_TIME = Field("int", default=None, low=0, high=MAX_TRIGGER_TIME_MILLIS)
ACK_FIELDS = {"ack": Field("bool", default=True), "delayMillis": millis(default=-1, low=0),
              "deadLetter": Field("bool", default=False),
              "reason": Field("text", default="", trim=False, allow_blank=True, max_length=MAX_REASON_LENGTH)}
SEND = {"topic": TOPIC, "msgId": Field("text", trim=False, not_blank=True, allow_blank=True,
                                       max_length=MAX_MSG_ID_LENGTH, refused=_MSG_ID_CONTROL),
        "msg": Field("text", required=True, trim=False), "delayMillis": millis(default=None, low=JAVA_LONG_MIN),
        "triggerTime": TRIGGER_TIME, "ttlMillis": millis(default=-1),
        "maxRetry": Field("int", default=-1, low=MIN_COUNT, high=MAX_RETRY),
        "priority": Field("int", default=0, low=0, high=MAX_PRIORITY)}
PULL = {"topic": TOPIC, "ackTimeoutMillis": millis(default=-1), "batch": Field("int", default=-1, low=MIN_COUNT)}
LONG_POLL = {**PULL, "longPollingTimeoutMillis": millis(default=-1)}
MESSAGE_REF = {"topic": TOPIC, "msgId": MSG_ID}
DELIVERY_RETRY = Field("int", default=None, low=0, high=MAX_RETRY + 1)  # a pulled message's retry, naming its delivery
ACK = {"topic": TOPIC, "msgId": MSG_ID, **ACK_FIELDS, "retry": DELIVERY_RETRY}
ACK_BATCH = {"topic": TOPIC, **ACK_FIELDS, "msgIds": Field("list", required=True),
             "retries": Field("retries", default=None)}
TOUCH = {**MESSAGE_REF, "ackTimeoutMillis": millis(required=True, low=1), "retry": DELIVERY_RETRY}
RESCHEDULE = {**MESSAGE_REF, "delayMillis": millis(default=None), "triggerTime": TRIGGER_TIME}
DELETE = {**MESSAGE_REF, "release": Field("bool", default=False)}
TOPIC_ONLY = {"topic": TOPIC}
_LIMIT = Field("int", low=0, high=MAX_LIMIT)
TOPIC_CONFIG = {
    "topic": TOPIC, "ttlMillis": millis(), "maxRetry": Field("int", low=MIN_COUNT, high=MAX_RETRY),
    "ackTimeoutMillis": millis(), "retryBackoffMillis": millis(low=0), "retryBackoffMaxMillis": millis(low=0),
    "deadLetter": Field("bool"), "produceRatePerSecond": _LIMIT, "consumeRatePerSecond": _LIMIT,
    "maxLiveMessages": _LIMIT, "pushUrl": Field("text", allow_blank=True, max_length=2000),
    "pushConcurrency": Field("int", low=1, high=200), "pushTimeoutMillis": Field("int", low=1, high=60_000),
    "pushRatePerSecond": _LIMIT, "rotatePushSecret": Field("bool"), "shards": Field("int", low=1, high=256)}
_MSG_IDS = Field("list", messages={"not_a_list": "must be a JSON list of msgIds, in a JSON body",
                                   "empty": "must not be empty"})
DEAD_LIST = {"topic": TOPIC, "limit": Field("int", default=DEAD_LIST_DEFAULT_LIMIT, low=1, high=DEAD_LIST_MAX_LIMIT),
             "cursor": Field("text", max_length=64, check=lambda c: None if _DEAD_CURSOR.match(c) else
                             "not a nextCursor that getDeadMsgList answered")}
REDRIVE = {"topic": TOPIC, "msgIds": _MSG_IDS,
           "maxPerSecond": Field("int", default=REDRIVE_DEFAULT_RATE, low=1, high=REDRIVE_MAX_RATE)}
PURGE_DEAD = {"topic": TOPIC, "msgIds": _MSG_IDS}
_EXPIRE = Field("bool", default=False)
RESTORE = {"topic": _OPTIONAL_TOPIC, "expire": _EXPIRE}
RESTORE_MSG = {**MESSAGE_REF, "expire": _EXPIRE}
REDRIVE_TASK = {"taskId": Field("int", required=True, low=1, high=2 ** 63 - 1)}


def parse(fields: dict[str, Field], params: dict[str, Any]) -> dict[str, Any]:
    """The validated parameters (absent ones at their defaults; absent without a default: left
    out); Invalid naming the first parameter refused, in the server's field order."""
    data = {k: v for k, v in params.items() if v is not None and (v != "" or k in KEEP_EMPTY)}
    parsed: dict[str, Any] = {}
    for name, spec in fields.items():
        if name not in data:
            if spec.required:
                raise Invalid(f"{name}: This field is required.")
            if spec.default is not _ABSENT:
                parsed[name] = spec.default
            continue
        try:
            parsed[name] = spec.clean(data[name])
        except Invalid as exc:
            raise Invalid(f"{name}: {exc}") from None
    return parsed


def checked_send(params: dict[str, Any], max_msg_bytes: int) -> dict[str, Any]:
    """sendMsg's parameters, with the checks across them."""
    data = parse(SEND, params)
    size = len(data["msg"].encode("utf-8"))
    if size > max_msg_bytes:
        raise Invalid(f"msg: is {size} bytes, over the limit of {max_msg_bytes} bytes")
    if data["triggerTime"] is None:
        if data["delayMillis"] is None:
            raise Invalid("delayMillis: This field is required.")
    elif data["delayMillis"] is not None:
        raise Invalid("triggerTime: give triggerTime or delayMillis, not both")
    return data


def checked_ack(fields: dict[str, Field], params: dict[str, Any]) -> dict[str, Any]:
    """ackMsg's or ackMsgBatch's parameters, with the checks across them."""
    data = parse(fields, params)
    if data["ack"]:
        if data["deadLetter"]:
            raise Invalid("deadLetter: only with ack=false")
        if data["reason"]:
            raise Invalid("reason: only with ack=false")
        if data["delayMillis"] >= 0:
            raise Invalid("delayMillis: only with ack=false")
    elif data["deadLetter"] and data["delayMillis"] >= 0:
        raise Invalid("deadLetter: cannot be given with delayMillis")
    if data.get("retries") is not None and len(data["retries"]) != len(data["msgIds"]):
        raise Invalid(f"retries: has {len(data['retries'])} values for {len(data['msgIds'])} msgIds: give one per "
                      "msgId")
    return data


def checked_reschedule(params: dict[str, Any]) -> dict[str, Any]:
    data = parse(RESCHEDULE, params)
    if (data["delayMillis"] is None) == (data["triggerTime"] is None):
        raise Invalid("delayMillis: give exactly one of delayMillis and triggerTime")
    return data


def checked_topic_config(params: dict[str, Any]) -> dict[str, Any]:
    data = parse(TOPIC_CONFIG, params)
    if len(data) == 1:
        raise Invalid("give at least one setting: " + ", ".join(name for name in TOPIC_CONFIG if name != "topic"))
    return data


# --- schedules

_SCHEDULE_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_SCHEDULE_ID_LENGTH}}}")
SCHEDULE_ID_RULE = f"must be 1 to {MAX_SCHEDULE_ID_LENGTH} letters, digits, '.', '_', ':' or '-'"
SCHEDULE_ID = Field("text", required=True, max_length=MAX_SCHEDULE_ID_LENGTH,
                    check=lambda text: None if _SCHEDULE_ID.fullmatch(text) else SCHEDULE_ID_RULE)
_SCHEDULE_TIME = Field("int", low=0, high=MAX_TRIGGER_TIME_MILLIS)
SCHEDULE_REF = {"scheduleId": SCHEDULE_ID}
SCHEDULE_FIELDS = {
    "scheduleId": SCHEDULE_ID, "topic": _OPTIONAL_TOPIC, "msg": Field("text", trim=False),
    "cron": Field("text", max_length=200), "timezone": Field("text", max_length=64),
    "everyMillis": Field("int", high=MAX_DELAY_MILLIS), "startTime": _SCHEDULE_TIME, "endTime": _SCHEDULE_TIME,
    "catchUp": Field("text", check=lambda v: None if v in CATCH_UP else f"must be one of {', '.join(CATCH_UP)}"),
    "priority": Field("int", low=0, high=MAX_PRIORITY), "ttlMillis": Field("int", low=0, high=MAX_DELAY_MILLIS),
    "maxRetry": Field("int", low=-1, high=MAX_RETRY), "paused": Field("bool")}
LIST_SCHEDULES = {
    "topic": _OPTIONAL_TOPIC,
    "limit": Field("int", default=SCHEDULE_LIST_DEFAULT_LIMIT, low=1, high=SCHEDULE_LIST_MAX_LIMIT),
    "cursor": Field("text", max_length=MAX_SCHEDULE_ID_LENGTH, check=lambda c: None if _SCHEDULE_ID.fullmatch(c) else
                    "not a nextCursor that listSchedules answered")}


# The server's refusal of a time zone given to an interval schedule (which would seem to be in force).
NOT_AN_INTERVAL_SETTING = "timezone: is a cron schedule's: not with everyMillis"
INTERVAL_ZONE = "UTC"  # the zone the server keeps for an interval schedule: the only one a change of it may name


def _checked_schedule_fields(data: dict[str, Any], max_msg_bytes: int) -> dict[str, Any]:
    """Each tick's body within the message size limit (a tick over it could never be sent); no
    timezone with everyMillis."""
    size = len(data["msg"].encode("utf-8")) if "msg" in data else 0
    if size > max_msg_bytes:
        raise Invalid(f"msg: is {size} bytes, over the limit of {max_msg_bytes} bytes")
    if "timezone" in data and "everyMillis" in data:
        raise Invalid(NOT_AN_INTERVAL_SETTING)
    return data


def checked_create_schedule(params: dict[str, Any], max_msg_bytes: int) -> dict[str, Any]:
    data = _checked_schedule_fields(parse(SCHEDULE_FIELDS, params), max_msg_bytes)
    for name in ("topic", "msg"):
        if name not in data:
            raise Invalid(f"{name}: This field is required.")
    if ("cron" in data) == ("everyMillis" in data):
        raise Invalid("cron: give either cron or everyMillis")
    return data


def checked_update_schedule(params: dict[str, Any], max_msg_bytes: int) -> dict[str, Any]:
    data = _checked_schedule_fields(parse(SCHEDULE_FIELDS, params), max_msg_bytes)
    if len(data) == 1:
        raise Invalid("give at least one field to change: "
                      + ", ".join(name for name in SCHEDULE_FIELDS if name != "scheduleId"))
    if "cron" in data and "everyMillis" in data:
        raise Invalid("cron: give either cron or everyMillis")
    return data


# A cron rule (the server's core/schedule_rules.py): 5 fields, each a comma list of parts.
_CRON_FIELD_NAMES = "minute hour day-of-month month day-of-week"
_CRON_PART = re.compile(r"(?:\*|([0-9]+|[A-Za-z]+)(?:-([0-9]+|[A-Za-z]+))?)(?:/([0-9]+))?")
_MONTH_NAMES = {name: number for number, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1)}
_WEEKDAY_NAMES = {name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
# (name, low, high, names, the names' range)
_CronField = tuple[str, int, int, dict[str, int], str]
_CRON_FIELDS: tuple[_CronField, ...] = (
    ("minute", 0, 59, {}, ""), ("hour", 0, 23, {}, ""), ("day-of-month", 1, 31, {}, ""),
    ("month", 1, 12, _MONTH_NAMES, "jan-dec"), ("day-of-week", 0, 7, _WEEKDAY_NAMES, "sun-sat"))
_LONGEST_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # Feb 29 comes, in leap years


@functools.cache
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones() - {"localtime"})


def _cron_number(digits: str) -> int:
    significant = digits.lstrip("0") or "0"
    return int(significant) if len(significant) <= 2 else 100


def _cron_value(text: str, spec: _CronField) -> int:
    name, low, high, names, name_range = spec
    if text.isdigit():
        value = _cron_number(text)
        if not low <= value <= high:
            raise Invalid(f"cron: {name} field: {text} is out of range {low}-{high}")
        return value
    if not names:
        raise Invalid(f"cron: {name} field: {text!r} is not a number")
    found = names.get(text.lower())
    if found is None:
        raise Invalid(f"cron: {name} field: unknown name {text!r} (use {low}-{high} or {name_range})")
    return found


def _cron_field(text: str, spec: _CronField) -> set[int]:
    name, low, high = spec[:3]
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise Invalid(f"cron: {name} field: empty item in {text!r}")
        match = _CRON_PART.fullmatch(part)
        if match is None:
            raise Invalid(f"cron: {name} field: cannot read {part!r} (a part is *, a number, a range a-b, "
                          "or one of these with /step)")
        first, last, step_text = match.groups()
        if first is None:
            start, end = low, high
        else:
            start = _cron_value(first, spec)
            end = _cron_value(last, spec) if last else high if step_text else start
            if start > end:
                raise Invalid(f"cron: {name} field: range {part!r} runs backwards")
        step = 1 if step_text is None else _cron_number(step_text)
        if step == 0:
            raise Invalid(f"cron: {name} field: step 0 in {part!r} (a step is at least 1)")
        values.update(range(start, end + 1, step))
    return values


def check_cron(expression: str, timezone: str) -> None:
    """Invalid with the server's text for a cron rule it refuses: an unknown time zone, a rule it
    cannot read, one that never fires."""
    if timezone not in _zone_names():
        raise Invalid(f"unknown time zone {timezone!r}")
    text = expression.strip()
    if text.startswith("@"):
        raise Invalid(f"cron: macros such as {text.split()[0]!r} are not supported; write the 5 fields "
                      f"({_CRON_FIELD_NAMES})")
    fields = re.split(r"[ \t]+", text) if text else []
    if len(fields) != 5:
        raise Invalid(f"cron: needs 5 fields ({_CRON_FIELD_NAMES}), got {len(fields)}")
    _, _, days, months, _ = (_cron_field(field_text, spec) for field_text, spec in zip(fields, _CRON_FIELDS))
    either_day = not fields[2].startswith("*") and not fields[4].startswith("*")
    # Every date comes on every weekday within 28 years: a rule fires unless its days are never in its months.
    if not either_day and not any(day <= _LONGEST_MONTH[month - 1] for month in months for day in days):
        raise Invalid(f"cron {expression!r} never fires")
