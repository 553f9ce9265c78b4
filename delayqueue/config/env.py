"""Settings from environment variables, read the same way by Django's settings and by
`./dev` (tools/stack.py), which runs before Django is set up. A bad value stops the process
at start with one line naming the variable, instead of misbehaving later."""
import os
from collections.abc import Callable
from typing import Any


TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_bool(name: str, default: bool) -> bool:
    """A flag; a word that is neither (`ture`) is refused rather than read as false, which would
    quietly turn off what it names (DELAYQUEUE_MESSAGE_LOG, SECURE_SSL_REDIRECT)."""
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    word = value.strip().lower()
    if word not in TRUE_WORDS + FALSE_WORDS:
        raise SystemExit(f"environment variable {name} must be one of {', '.join(TRUE_WORDS)} or "
                         f"{', '.join(FALSE_WORDS)}, got {value!r}")
    return word in TRUE_WORDS


def env_list(name: str, default: str) -> list[str]:
    """A comma-separated list (unset means the default), without blanks."""
    value = os.environ.get(name)
    return [item.strip() for item in (default if value is None else value).split(",") if item.strip()]


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def env_log_level(name: str, default: str) -> str:
    """A logging level's name in any case (logging itself takes upper case only, and a bad one
    raised a traceback from Django's logging setup)."""
    value = os.environ.get(name, "").strip()
    if value and value.upper() not in LOG_LEVELS:
        raise SystemExit(f"environment variable {name} must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return value.upper() or default


def env_url(name: str, default: str, parse: Callable[[str], Any]) -> Any:
    """What `parse` makes of the URL in `name` (empty means the default); `parse` raises
    ValueError saying what is wrong. The value is not echoed: URLs carry passwords."""
    value = os.environ.get(name) or default
    try:
        return parse(value)
    except ValueError as exc:
        raise SystemExit(f"environment variable {name} {exc}") from None


def env_int(name: str, default: int, minimum: int | None = None, maximum: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise SystemExit(f"environment variable {name} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise SystemExit(f"environment variable {name} must be at least {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise SystemExit(f"environment variable {name} must be at most {maximum}, got {number}")
    return number
