"""Option types shared by the command lines (manage.py commands, the Spark jobs, the benchmarks).
A bad value ends, as argparse reports it, in one line naming the option and exit code 2."""
import argparse

from delayqueue.core.constants import MAX_AGE_DAYS, MAX_LIMIT, MAX_PRUNE_BATCH
from delayqueue.core.names import checked_namespace, msg_id_problem, topic_problem


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def limit_value(text: str) -> int:
    """A rate (messages/s) or a live-message cap; 0 removes the limit."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be 0 (no limit) to {MAX_LIMIT}, got {value}")
    return value


def age_in_days(text: str) -> int:
    value = positive_int(text)
    if value > MAX_AGE_DAYS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_AGE_DAYS} days, got {value}")
    return value


def prune_batch(text: str) -> int:
    value = positive_int(text)
    if value > MAX_PRUNE_BATCH:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_PRUNE_BATCH}, got {value}")
    return value


def _named(text: str, kind: str, problem: str | None) -> str:
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r}: a {kind} {problem}")
    return text


def topic_name(text: str) -> str:
    return _named(text, "topic", topic_problem(text))


def namespace_name(text: str) -> str:
    try:
        return checked_namespace(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a namespace: {exc}") from None


def msg_id(text: str) -> str:
    return _named(text, "msgId", msg_id_problem(text))


def utf8_text(text: str) -> str:
    # Bytes of argv that are not UTF-8 reach Python as lone surrogates, which Redis and PostgreSQL cannot take.
    try:
        text.encode()
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{text!r}: not UTF-8 text") from None
    return text


def non_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return utf8_text(text)

