"""Request parsing for the camellia-compatible API. Errors name the parameter."""
import re

from django.core.validators import BaseValidator, ProhibitNullCharactersValidator, RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from delayqueue.config.settings import load_config, setting_text
from delayqueue.core.constants import (DEAD_LIST_DEFAULT_LIMIT, DEAD_LIST_MAX_LIMIT, MAX_DELAY_MILLIS, MAX_EVENT_DETAIL,
                                       MAX_LIMIT, MAX_PRIORITY, MAX_PUSH_URL_LENGTH, MAX_RETRY, MAX_SCHEDULE_ID_LENGTH,
                                       MAX_SHARDS,
                                       MAX_TOPIC_BYTES, PUSH_CONCURRENCY_DEFAULT, PUSH_MAX_CONCURRENCY,
                                       PUSH_MAX_TIMEOUT_MILLIS, PUSH_TIMEOUT_DEFAULT_MILLIS, REDRIVE_DEFAULT_RATE,
                                       REDRIVE_MAX_RATE, RETRY_BACKOFF_MAX_MILLIS, SCHEDULE_LIST_DEFAULT_LIMIT,
                                       SCHEDULE_LIST_MAX_LIMIT, CatchUp)
from delayqueue.core.names import CONTROL_CHARACTER_PATTERN, MAX_MSG_ID_CHARS, topic_problem
from delayqueue.core.schedules import NOT_AN_INTERVAL_SETTING

# Counts and retries below 0 mean "the default"; a floor keeps them plain integers all the way to Lua.
MIN_COUNT = -100_000
# A sendMsg's delayMillis may be any Java long, as camellia's: its SDK sends sendMsgByTriggerTime(t)
# as t - now, so a trigger time of 0 or long past is a large negative delay, due at once.
JAVA_LONG_MIN = -2 ** 63
# A triggerTime's bound: 2100-01-01, which keeps every time (plus a TTL) exact in Redis' Lua numbers
# and in the scripts' JSON.
MAX_TRIGGER_TIME_MILLIS = 4_102_444_800_000


class LongField(serializers.IntegerField):
    """An integer parameter (camellia's are Java longs), read as Java's Long.parseLong reads one: as
    text, an optional sign and ASCII digits, nothing else (int() would take " 10 ", "1_0" and "１０",
    DRF also "10.0"); as a JSON number, one that is whole (JSON does not tell 10 from 10.0)."""

    _TEXT = re.compile(r"[+-]?[0-9]+")

    def to_internal_value(self, data):
        if type(data) is str:
            if len(data) > self.MAX_STRING_LENGTH:
                self.fail("max_string_length")
            if self._TEXT.fullmatch(data):
                return int(data)
        elif type(data) is int or (type(data) is float and data.is_integer()):
            return int(data)
        self.fail("invalid")


class TopicField(serializers.CharField):
    """A topic name (core/names.py), taken exactly as sent: no trimming, as a topic with
    spaces around it is another topic to camellia."""

    def __init__(self, **kwargs):
        kwargs.setdefault("help_text", "the topic: any non-empty text without control characters (U+0000-U+001F, "
                                       f"U+007F-U+009F), at most {MAX_TOPIC_BYTES} bytes in UTF-8; taken as sent, "
                                       "not trimmed")
        super().__init__(trim_whitespace=False, validators=[check_topic],
                         error_messages={"blank": topic_problem("")}, **kwargs)
        # The schema states the rule as far as JSON Schema can: its lengths count characters, so
        # maxLength is the byte limit only for ASCII (the description says bytes).
        extend_schema_field({"type": "string", "minLength": 1, "maxLength": MAX_TOPIC_BYTES,
                             "not": {"pattern": CONTROL_CHARACTER_PATTERN}})(self)


def check_topic(value: str) -> None:
    problem = topic_problem(value)
    if problem:
        raise serializers.ValidationError(problem)


# A character str.strip() keeps (DRF trims with it), spelled out, as regex \s differs between
# engines; U+3000 is the last character str.isspace() accepts.
NOT_ONLY_SPACE = "[^%s]" % "".join(f"\\u{ord(c):04x}" for c in map(chr, range(0x3001)) if c.isspace())


def not_blank(value: str) -> None:
    """Refuses text of spaces only (a validator: DRF runs none on an allowed empty value)."""
    if value.isspace():
        raise serializers.ValidationError(serializers.CharField.default_error_messages["blank"])


class TextField(serializers.CharField):
    """A CharField whose schema also states what DRF refuses in text: NUL characters (or a
    subclass' `refused` pattern), and a value of spaces only where it is refused (trimmed to
    blank where blank is not allowed, or by not_blank). Schema only: no regex runs per request."""

    refused: re.Pattern | None = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        schema = {"type": "string", "not": {"pattern": self.refused.pattern if self.refused else "\\x00"}}
        if (self.trim_whitespace and not self.allow_blank) or not_blank in self.validators:
            schema["pattern"] = NOT_ONLY_SPACE  # where empty is allowed, drf-spectacular adds it as oneOf
        extend_schema_field(schema)(self)


class MsgIdField(TextField):
    """A msgId, taken as sent, as camellia takes it: " a " is another id than "a". One of spaces only
    is refused as blank (camellia would take it), where an empty one may mean "generate one"."""

    # No C0 or C1 control character and no DEL (they would reach logs, terminals and the admin's pages
    # as commands or invisible text).
    refused = re.compile(CONTROL_CHARACTER_PATTERN)
    default_error_messages = {"control": "must not contain control characters"}

    def __init__(self, **kwargs):
        kwargs.setdefault("max_length", MAX_MSG_ID_CHARS)
        kwargs.setdefault("help_text", f"the message's id within its topic (at most {MAX_MSG_ID_CHARS} characters, "
                                       "no control characters, not only spaces); taken as sent, not trimmed")
        super().__init__(trim_whitespace=False, validators=[not_blank], **kwargs)

    def run_validation(self, data=empty):
        if type(data) is str and self.refused.search(data):
            self.fail("control")
        return super().run_validation(data)


def millis(help_text: str, **kwargs) -> LongField:
    """A time in ms; the bounds keep it inside what Redis' Lua numbers hold exactly."""
    kwargs.setdefault("min_value", -MAX_DELAY_MILLIS)
    return LongField(max_value=MAX_DELAY_MILLIS, help_text=help_text, **kwargs)


def flag(help_text: str, default: bool) -> serializers.BooleanField:
    return serializers.BooleanField(
        required=False, default=default,
        help_text=f"{help_text}; true/false (also 1/0, yes/no, on/off), default {str(default).lower()}")


def trigger_time(help_text: str) -> LongField:
    return LongField(
        required=False, default=None, min_value=0, max_value=MAX_TRIGGER_TIME_MILLIS,
        help_text=f"{help_text}: epoch ms; not in the future (0 too): due now; at most {MAX_TRIGGER_TIME_MILLIS} "
                  "(the year 2100)")


class TopicSerializer(serializers.Serializer):
    topic = TopicField()


class MessageRefSerializer(TopicSerializer):
    msgId = MsgIdField()


def checked_msg(value: str) -> str:
    """A message body within DELAYQUEUE_MAX_MSG_BYTES."""
    limit = load_config().max_msg_bytes
    if len(value) * 4 <= limit:  # no character takes more than 4 bytes in UTF-8: no need to encode
        return value
    size = len(value.encode("utf-8"))
    if size > limit:
        raise serializers.ValidationError(f"is {size} bytes, over the limit of {limit} bytes")
    return value


def msg_field(**kwargs) -> "TextField":
    kwargs.setdefault("help_text", "the payload, any text; at most that many bytes in UTF-8 "
                                   f"({setting_text('max_msg_bytes')})")
    return TextField(trim_whitespace=False, **kwargs)


class SendMsgSerializer(TopicSerializer):
    msgId = MsgIdField(required=False, allow_blank=True,
                       help_text="the message's id within its topic (at most 256 characters, taken as sent, not "
                                 "only spaces); absent or empty: the server generates one. Sending again under a "
                                 "live id returns the stored message instead of a new one")
    msg = msg_field()
    delayMillis = millis("ms from now until the message can be pulled; 0 or less: at once. Required unless "
                         "triggerTime is given", required=False, default=None, min_value=JAVA_LONG_MIN)
    triggerTime = trigger_time("when the message can be pulled, in place of delayMillis (not both)")
    ttlMillis = millis("ms the message may wait to be consumed once due; 0 or less: the server default "
                       f"({setting_text('ttl_millis')} ms)", required=False, default=-1)
    maxRetry = LongField(
        required=False, default=-1, min_value=MIN_COUNT, max_value=MAX_RETRY,
        help_text=f"deliveries allowed after the first; below 0: the server default ({setting_text('max_retry')})")
    priority = LongField(
        required=False, default=0, min_value=0, max_value=MAX_PRIORITY,
        help_text=f"0 (default) to {MAX_PRIORITY}: ready messages of a higher priority are pulled first, "
                  "oldest first within a priority")

    def validate(self, attrs: dict) -> dict:
        if attrs["triggerTime"] is None:
            if attrs["delayMillis"] is None:
                raise serializers.ValidationError({"delayMillis": self.fields["delayMillis"].error_messages["required"]})
        elif attrs["delayMillis"] is not None:
            raise serializers.ValidationError({"triggerTime": "give triggerTime or delayMillis, not both"})
        return attrs

    def validate_msg(self, value: str) -> str:
        return checked_msg(value)


class PullMsgSerializer(TopicSerializer):
    ackTimeoutMillis = millis("ms a pulled message may stay unacked before it is delivered again; 0 or less: "
                              f"the server default ({setting_text('ack_timeout_millis')} ms)", required=False,
                              default=-1)
    batch = LongField(
        required=False, default=-1, min_value=MIN_COUNT,
        help_text=f"most messages to return; 0 or less: the server default ({setting_text('pull_batch')}); at most "
                  f"{setting_text('max_pull_batch')}")

    def validate_batch(self, value: int) -> int:
        limit = load_config().max_pull_batch
        if value > limit:
            raise serializers.ValidationError(f"must be at most {limit}")
        return value


class LongPollingMsgSerializer(PullMsgSerializer):
    longPollingTimeoutMillis = millis(
        "ms to hold the request while no message is ready; 0 or less: the server default "
        f"({setting_text('long_polling_timeout_millis')} ms); capped at "
        f"{setting_text('max_long_polling_timeout_millis')} ms", required=False, default=-1)


class AckFields(serializers.Serializer):
    """ackMsg's and ackMsgBatch's choice: ack, or give back (after a delay), or dead-letter."""

    ack = flag("true: consumed (acked); false: give it back, ready again at once or after the topic's retry "
               "backoff", True)
    delayMillis = millis("ack=false only: ms until it is delivered again (it waits, status 1, its retry count "
                         "kept); absent: at once, or after the topic's retry backoff", required=False, default=-1,
                         min_value=0)
    deadLetter = flag("ack=false only: true ends the message now as a dead letter (status 6), not to be "
                      "delivered again", False)
    reason = TextField(required=False, default="", allow_blank=True, trim_whitespace=False,
                       max_length=MAX_EVENT_DETAIL,
                       help_text=f"ack=false only: why it was given back (at most {MAX_EVENT_DETAIL} characters), "
                                 "kept on the nack's history row and shown as a dead letter's deadDetail")

    def validate(self, attrs: dict) -> dict:
        if attrs["ack"]:
            if attrs["deadLetter"]:
                raise serializers.ValidationError({"deadLetter": "only with ack=false"})
            if attrs["reason"]:
                raise serializers.ValidationError({"reason": "only with ack=false"})
            if attrs["delayMillis"] >= 0:
                raise serializers.ValidationError({"delayMillis": "only with ack=false"})
        elif attrs["deadLetter"] and attrs["delayMillis"] >= 0:
            raise serializers.ValidationError({"deadLetter": "cannot be given with delayMillis"})
        return attrs


def delivery_retry(help_text: str, **kwargs) -> LongField:
    """A delivery's retry (the pulled message's `retry`), by which a settling call names the delivery it settles."""
    return LongField(min_value=0, max_value=MAX_RETRY + 1, help_text=help_text, **kwargs)


_RETRY_HELP = ("the pulled message's retry: the call acts only on that delivery, so a late one, after the message "
               "was delivered again, does nothing (done false); absent: whichever delivery it is in")


class AckMsgSerializer(AckFields, MessageRefSerializer):
    retry = delivery_retry(_RETRY_HELP, required=False, default=None)


class AckMsgBatchSerializer(AckFields, TopicSerializer):
    msgIds = serializers.ListField(child=MsgIdField(), allow_empty=False,
                                   help_text=f"the msgIds, a JSON list of 1 to {setting_text('max_batch_send')}")
    retries = serializers.ListField(child=delivery_retry("", allow_null=True), required=False, default=None,
                                    help_text="per msgId, in order, its pulled retry (null: any), as ackMsg's retry")

    def validate_msgIds(self, value: list) -> list:
        limit = load_config().max_batch_send
        if len(value) > limit:
            raise serializers.ValidationError(f"has {len(value)} msgIds, over the limit of {limit}")
        return value

    def validate(self, attrs: dict) -> dict:
        attrs = super().validate(attrs)
        if attrs["retries"] is not None and len(attrs["retries"]) != len(attrs["msgIds"]):
            raise serializers.ValidationError({"retries": f"has {len(attrs['retries'])} values for "
                                                          f"{len(attrs['msgIds'])} msgIds: give one per msgId"})
        return attrs


class TouchMsgSerializer(MessageRefSerializer):
    ackTimeoutMillis = millis("the new ack deadline, in ms from now", min_value=1)
    retry = delivery_retry("the pulled message's retry: only that delivery's deadline is extended (code 409 once "
                           "it was delivered again); absent: whichever delivery it is in", required=False, default=None)


class RescheduleMsgSerializer(MessageRefSerializer):
    delayMillis = millis("the new trigger time in ms from now; 0 or less: due now. Give it or triggerTime",
                         required=False, default=None)
    triggerTime = trigger_time("the new trigger time, in place of delayMillis")

    def validate(self, attrs: dict) -> dict:
        if (attrs["delayMillis"] is None) == (attrs["triggerTime"] is None):
            raise serializers.ValidationError({"delayMillis": "give exactly one of delayMillis and triggerTime"})
        return attrs


class DeleteMsgSerializer(MessageRefSerializer):
    release = flag("true: free the deleted message's body at once instead of keeping it readable by getMsg "
                   "for a while", False)


class RestoreSerializer(serializers.Serializer):
    """Restore from the message log (restore?expire=true|false), optionally one topic."""

    topic = TopicField(required=False, help_text="restore only this topic; absent: every topic")
    expire = flag("true: also restore messages whose TTL ran out before delivery", False)


class RestoreMsgSerializer(MessageRefSerializer):
    expire = flag("true: restore the message even if its TTL ran out before delivery", False)


def _limit(help_text: str) -> LongField:
    return LongField(required=False, min_value=0, max_value=MAX_LIMIT,
                     help_text=f"{help_text}; 0 removes the limit")


class SetTopicConfigSerializer(TopicSerializer):
    """setTopicConfig: a setting absent stays as it is."""

    ttlMillis = millis("default TTL of the topic's sends that give none; 0 or less: back to the server default",
                       required=False)
    maxRetry = LongField(
        required=False, min_value=MIN_COUNT, max_value=MAX_RETRY,
        help_text="default maxRetry of the topic's sends that give none; below 0: back to the server default")
    ackTimeoutMillis = millis("default ack timeout of the topic's pulls that give none; 0 or less: back to the "
                              "server default", required=False)
    retryBackoffMillis = millis("wait before a message given back by its ack timeout or a nack without delayMillis "
                                "is ready again, doubling with each delivery; 0: ready at once", required=False,
                                min_value=0)
    retryBackoffMaxMillis = millis(f"longest backoff wait; 0: back to the default ({RETRY_BACKOFF_MAX_MILLIS} ms)",
                                   required=False,
                                   min_value=0)
    deadLetter = serializers.BooleanField(
        required=False, help_text="keep the topic's messages that end as 5 or 6 as dead letters; true/false. Judged "
        "by the setting in force, not at their death: false takes the topic's status-5 and 6 messages out of "
        "getDeadMsgList, redrives and purgeDeadMsg, and prune_log removes them as other ended messages; true "
        "again brings back those not yet pruned")
    produceRatePerSecond = _limit("messages a second the topic takes")
    consumeRatePerSecond = _limit("messages a second the topic hands out")
    maxLiveMessages = _limit("most messages of the topic waiting, ready or consuming at once")
    pushUrl = serializers.CharField(
        required=False, allow_blank=True, max_length=MAX_PUSH_URL_LENGTH, trim_whitespace=True,
        help_text="due messages are POSTed to this http(s) URL, whose host DELAYQUEUE_PUSH_ALLOWED_HOSTS must allow, "
        "instead of being pulled (docs/push.md); the first one set generates the signing secret, answered once as "
        "pushSecret; empty: push off, secrets forgotten")
    pushConcurrency = LongField(
        required=False, min_value=1, max_value=PUSH_MAX_CONCURRENCY,
        help_text=f"most pushes of the topic in flight at once, across every pusher (default {PUSH_CONCURRENCY_DEFAULT})")
    pushTimeoutMillis = LongField(
        required=False, min_value=1, max_value=PUSH_MAX_TIMEOUT_MILLIS,
        help_text=f"a push attempt not answered within this long fails (default {PUSH_TIMEOUT_DEFAULT_MILLIS})")
    pushRatePerSecond = _limit("most pushes of the topic started a second")
    rotatePushSecret = serializers.BooleanField(
        required=False, help_text="true: a new signing secret, answered once as pushSecret; the old one still "
        "signs for DELAYQUEUE_PUSH_SECRET_GRACE_SECONDS")
    shards = LongField(
        required=False, min_value=1, max_value=MAX_SHARDS,
        help_text="Redis key sets (hash slots) the topic's new messages spread over, so that one topic spreads over "
        "a Redis Cluster's masters (docs/scaling.md); its messages already sent stay where they are, and are still "
        "delivered, until those shards are empty")

    def validate(self, attrs: dict) -> dict:
        if len(attrs) == 1:
            raise serializers.ValidationError(
                "give at least one setting: " + ", ".join(name for name in self.fields if name != "topic"))
        return attrs


class MsgIdListSerializer(serializers.Serializer):
    """`msgIds` of the dead-letter operations: a JSON list in a JSON body (absent: every dead
    letter of the topic). Validated by the serializer itself: the fast path takes no lists."""

    msgIds = serializers.ListField(
        child=MsgIdField(), required=False, min_length=1,
        error_messages={"not_a_list": "must be a JSON list of msgIds, in a JSON body", "min_length": "must not be empty"},
        help_text="only these msgIds, a JSON list in a JSON body (at most DELAYQUEUE_MAX_BATCH_SEND); absent: all")

    def validate_msgIds(self, value: list[str]) -> list[str]:
        limit = load_config().max_batch_send
        if len(value) > limit:
            raise serializers.ValidationError(f"has {len(value)} msgIds, over the limit of {limit}")
        return value


# getDeadMsgList's nextCursor: the last row's death time (µs) and id; the admin's pages take it too.
DEAD_CURSOR = re.compile(r"^[0-9]{1,18}\.[0-9]{1,18}$")


class DeadMsgListSerializer(TopicSerializer):
    limit = LongField(required=False, default=DEAD_LIST_DEFAULT_LIMIT, min_value=1,
                      max_value=DEAD_LIST_MAX_LIMIT,
                      help_text=f"most dead letters in the page (default {DEAD_LIST_DEFAULT_LIMIT})")
    cursor = serializers.RegexField(
        DEAD_CURSOR, required=False, max_length=64,
        error_messages={"invalid": "not a nextCursor that getDeadMsgList answered"},
        help_text="the nextCursor of the previous page; absent: the first page")


class RedriveDeadMsgSerializer(TopicSerializer, MsgIdListSerializer):
    maxPerSecond = LongField(
        required=False, min_value=1, max_value=REDRIVE_MAX_RATE,
        help_text=f"most dead letters sent back per second (default {REDRIVE_DEFAULT_RATE}, or the cap "
                  f"{setting_text('max_redrive_rate')}, when that is lower)")


class RedriveTaskSerializer(serializers.Serializer):
    taskId = LongField(min_value=1, max_value=2 ** 63 - 1, help_text="as redriveDeadMsg answered it")


class PurgeDeadMsgSerializer(TopicSerializer, MsgIdListSerializer):
    pass


def first_error(errors) -> str:
    """DRF's error dict -> one readable line naming the parameter, e.g. 'delayMillis: A valid integer is required.'"""
    if isinstance(errors, dict):
        for field, problems in errors.items():
            text = first_error(problems)
            return text if field == "non_field_errors" else f"{field}: {text}"
    if isinstance(errors, list) and errors:
        return first_error(errors[0])
    return str(errors)


class FastValidation:
    """A serializer's validation for the common, well-formed request, without DRF's per-field
    machinery (which costs more than the whole rest of a send). Built from the serializer's own
    fields, validators and validate_<field> methods, so the serializer stays the one statement of
    the rules. It accepts a subset of what the serializer accepts, with the same result; for
    anything else (a missing required field, an int given as "+12", any failed check) it
    answers None and the caller runs the serializer, which decides and words the error."""

    _INTEGER = re.compile(r"-?[0-9]{1,18}")
    _SURROGATE = re.compile("[\ud800-\udfff]")

    def __init__(self, serializer: serializers.Serializer):
        self.serializer = serializer
        self.checks = [(name, self._check_for(field), field, self._default_of(field))
                       for name, field in serializer.fields.items()]
        self.validate = None if type(serializer).validate is serializers.Serializer.validate else serializer.validate

    @staticmethod
    def _default_of(field):
        """The field's default as a constant (`empty`: none). A callable one would need calling
        per request, as DRF does: no fast path for it."""
        if field.default is not empty and callable(field.default):  # (empty, a class, is callable too)
            raise TypeError(f"no fast validation with a callable default ({field.field_name})")
        return field.default

    @staticmethod
    def _predicate(validator):
        """The validator as a cheap test. Django's call builds an error-params dict every time."""
        if isinstance(validator, (ProhibitNullCharactersValidator, ProhibitSurrogateCharactersValidator)):
            return None  # the CharField coercion below refuses those characters itself
        if isinstance(validator, BaseValidator) and not callable(validator.limit_value):
            compare, clean, limit = validator.compare, validator.clean, validator.limit_value
            return lambda value: not compare(clean(value), limit)
        if isinstance(validator, RegexValidator):
            search, inverse = re.compile(validator.regex.pattern, validator.regex.flags).search, validator.inverse_match
            return lambda value: bool(search(str(value))) != inverse
        if getattr(validator, "requires_context", False):
            raise TypeError(f"no fast validation with {type(validator).__name__}")

        def run(value):
            validator(value)
            return True

        return run

    def _check_for(self, field):
        extra = getattr(self.serializer, f"validate_{field.field_name}", None)
        validators = [test for test in map(self._predicate, field.validators) if test is not None]
        if isinstance(field, serializers.CharField):
            blank_ok, trim = field.allow_blank, field.trim_whitespace
            refused = getattr(field, "refused", None)  # a pattern the value as sent must not hold

            def coerce(value):
                if type(value) is not str or "\x00" in value or self._SURROGATE.search(value):
                    return empty
                if refused is not None and refused.search(value):
                    return empty
                if trim:
                    value = value.strip()
                if value == "":
                    return "" if blank_ok else empty
                return value
        elif isinstance(field, serializers.IntegerField):
            def coerce(value):
                if type(value) is int:
                    return value
                if type(value) is str and self._INTEGER.fullmatch(value):
                    return int(value)
                return empty
        elif isinstance(field, serializers.ListField):
            item, allow_empty = self._check_for(field.child), field.allow_empty

            def coerce(value):
                if type(value) is not list or not (value or allow_empty):
                    return empty
                items = [item(each) for each in value]
                return empty if empty in items else items
        elif isinstance(field, serializers.BooleanField):
            true, false = field.TRUE_VALUES, field.FALSE_VALUES

            def coerce(value):
                if type(value) not in (str, bool, int):
                    return empty
                return True if value in true else False if value in false else empty
        else:
            raise TypeError(f"no fast validation for {type(field).__name__}")

        def check(value):
            value = coerce(value)
            if value is empty:
                return empty
            if value != "":  # DRF runs no validators on an allowed blank
                for valid in validators:
                    if not valid(value):
                        return empty
            return extra(value) if extra else value

        return check

    def __call__(self, data: dict) -> dict | None:
        out = {}
        try:
            for name, check, field, default in self.checks:
                value = data.get(name, empty)
                if value is empty or value is None:
                    if field.required or value is None:
                        return None
                    if default is not empty:
                        out[name] = default
                    continue
                value = check(value)
                if value is empty:
                    return None
                out[name] = value
            return self.validate(out) if self.validate else out
        except Exception:  # any failed check: the serializer decides, and words the error
            return None


# A scheduleId: its ticks' msgIds are "<scheduleId>@<tick>", so it holds no "@" or "#".
SCHEDULE_ID = re.compile(rf"^[A-Za-z0-9._:-]{{1,{MAX_SCHEDULE_ID_LENGTH}}}$")


class ScheduleRefSerializer(serializers.Serializer):
    scheduleId = serializers.RegexField(
        SCHEDULE_ID, max_length=MAX_SCHEDULE_ID_LENGTH,
        error_messages={"invalid": f"must be 1 to {MAX_SCHEDULE_ID_LENGTH} letters, digits, '.', '_', ':' or '-'"},
        help_text=f"the schedule's name within the namespace: 1 to {MAX_SCHEDULE_ID_LENGTH} letters, digits, "
                  "'.', '_', ':' or '-'")


def _time_or_none(help_text: str) -> LongField:
    return LongField(required=False, min_value=0, max_value=MAX_TRIGGER_TIME_MILLIS,
                     help_text=f"{help_text}: epoch ms; 0: none")


class ScheduleFieldsSerializer(ScheduleRefSerializer):
    """The settable fields of a schedule; each optional here (updateSchedule), createSchedule
    requires its own."""

    topic = TopicField(required=False)
    msg = msg_field(required=False, help_text="the body of each tick's message; at most "
                                              f"{setting_text('max_msg_bytes')} bytes in UTF-8")
    cron = serializers.CharField(
        required=False, max_length=200,
        help_text="5 fields (minute hour day-of-month month day-of-week) in `timezone`, e.g. '*/5 * * * *'; "
                  "in place of everyMillis (docs/schedules.md: ranges, steps, names, time changes)")
    timezone = serializers.CharField(required=False, max_length=64,
                                     help_text="the cron's IANA time zone, e.g. Europe/Berlin (default UTC)")
    # No min_value here: services/schedules checks DELAYQUEUE_SCHEDULE_MIN_INTERVAL_MILLIS for every value below it,
    # where a bound of 1 answered 0 with "greater than or equal to 1", which is refused as well.
    everyMillis = LongField(
        required=False, max_value=MAX_DELAY_MILLIS,
        help_text=f"a tick every this many ms, in place of cron; at least {setting_text('schedule_min_interval_millis')}")
    startTime = _time_or_none("an interval schedule's first tick (default: one interval after it is created or "
                              "made an interval schedule), a cron schedule's earliest")
    endTime = _time_or_none("no tick after this")
    catchUp = serializers.RegexField(
        f"^({'|'.join(CatchUp.values)})$", required=False,
        error_messages={"invalid": f"must be one of {', '.join(CatchUp.values)}"},
        help_text="ticks missed while no scanner ran: 'latest' (default) fires the latest once, 'all' each once, "
                  "'skip' none")
    priority = LongField(required=False, min_value=0, max_value=MAX_PRIORITY,
                         help_text=f"each tick's priority, 0 (default) to {MAX_PRIORITY}")
    ttlMillis = millis("each tick's TTL; 0: the topic's default", required=False, min_value=0)
    maxRetry = LongField(required=False, min_value=-1, max_value=MAX_RETRY,
                         help_text="each tick's maxRetry; -1 (default): the topic's")
    paused = serializers.BooleanField(required=False, help_text="true: no tick fires until resumeSchedule")

    def validate_msg(self, value: str) -> str:
        return checked_msg(value)

    def validate(self, attrs: dict) -> dict:
        if "timezone" in attrs and "everyMillis" in attrs:
            raise serializers.ValidationError({"timezone": NOT_AN_INTERVAL_SETTING})
        return attrs


class CreateScheduleSerializer(ScheduleFieldsSerializer):
    def validate(self, attrs: dict) -> dict:
        attrs = super().validate(attrs)
        for name in ("topic", "msg"):
            if name not in attrs:
                raise serializers.ValidationError({name: self.fields[name].error_messages["required"]})
        if ("cron" in attrs) == ("everyMillis" in attrs):
            raise serializers.ValidationError({"cron": "give either cron or everyMillis"})
        return attrs


class UpdateScheduleSerializer(ScheduleFieldsSerializer):
    def validate(self, attrs: dict) -> dict:
        attrs = super().validate(attrs)
        if len(attrs) == 1:
            raise serializers.ValidationError(
                "give at least one field to change: " + ", ".join(n for n in self.fields if n != "scheduleId"))
        if "cron" in attrs and "everyMillis" in attrs:
            raise serializers.ValidationError({"cron": "give either cron or everyMillis"})
        return attrs


class ListSchedulesSerializer(serializers.Serializer):
    topic = TopicField(required=False, help_text="only this topic's schedules; absent: all")
    limit = LongField(required=False, default=SCHEDULE_LIST_DEFAULT_LIMIT, min_value=1,
                      max_value=SCHEDULE_LIST_MAX_LIMIT,
                      help_text=f"most schedules in the page (default {SCHEDULE_LIST_DEFAULT_LIMIT})")
    cursor = serializers.RegexField(
        SCHEDULE_ID, required=False, max_length=MAX_SCHEDULE_ID_LENGTH,
        error_messages={"invalid": "not a nextCursor that listSchedules answered"},
        help_text="the nextCursor of the previous page; absent: the first page")
