"""The queue's settings, each declared once on QueueConfig: its environment variable, default,
bounds and meaning. project/settings.py and the Spark jobs (which run without Django settings)
read the environment through these declarations; the service reads the result through
load_config(). A bad value stops the process at start with one line naming the variable."""
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

import dj_database_url

from delayqueue.config.env import env_bool, env_int, env_url
from delayqueue.config.push_hosts import HostPolicy, checked_allowed_hosts
from delayqueue.config.redis_urls import URL_FORMS, checked_url
from delayqueue.core.constants import MAX_AGE_DAYS, MAX_DELAY_MILLIS, REDRIVE_MAX_RATE
from delayqueue.core.names import checked_namespace

# Variables with this prefix live in settings.DELAYQUEUE under the rest of their name; the
# others (the two URLs) are Django settings of their own name.
PREFIX = "DELAYQUEUE_"


def checked_postgres_url(url: str) -> str:
    """The URL, if it names a PostgreSQL database; else ValueError saying what is wrong."""
    try:
        engine = dj_database_url.parse(url).get("ENGINE")
    except ValueError:
        engine = None
    if engine != "django.db.backends.postgresql":
        raise ValueError("must be a postgres://user:password@host:port/database URL (the message log is PostgreSQL)")
    return url


# A log database's name in Django's DATABASES (DEFAULT_DATABASE is DATABASE_URL's).
DEFAULT_DATABASE = "default"
DATABASE_ALIAS_PATTERN = r"[a-z][a-z0-9_]{0,39}"


def _pairs(value: str, example: str, what: str) -> dict[str, str]:
    """`name=value` items, comma-separated (blanks ignored), by name; ValueError naming a malformed
    item or a name given twice."""
    pairs: dict[str, str] = {}
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, rest = item.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise ValueError(f"must be comma-separated {example} pairs; one item has no name=value form")
        if name.strip() in pairs:
            raise ValueError(f"names {what} {name.strip()} twice")
        pairs[name.strip()] = rest.strip()
    return pairs


def checked_alias(alias: str) -> str:
    if not re.fullmatch(DATABASE_ALIAS_PATTERN, alias) or alias == DEFAULT_DATABASE:
        raise ValueError(f"names a database {alias!r}: an alias is 1-40 of a-z 0-9 _, starting with a letter, "
                         "and not 'default' (DATABASE_URL's)")
    return alias


def log_databases(value: str) -> dict[str, str]:
    """DELAYQUEUE_LOG_DATABASES as alias -> URL; ValueError saying what is wrong (never the URL)."""
    databases = _pairs(value, "alias=postgres://...", "database")
    for alias, url in databases.items():
        checked_alias(alias)
        try:
            checked_postgres_url(url)
        except ValueError as exc:
            raise ValueError(f"database {alias}'s URL {exc}") from None
    return databases


def namespace_databases(value: str) -> dict[str, str]:
    """DELAYQUEUE_NAMESPACE_DATABASES as namespace -> alias; ValueError saying what is wrong."""
    routes = _pairs(value, "namespace=alias", "namespace")
    for namespace, alias in routes.items():
        checked_namespace(namespace)
        if alias != DEFAULT_DATABASE:
            checked_alias(alias)
    return routes


def _checked(parse: Callable[[str], Any]) -> Callable[[str], str]:
    def check(value: str) -> str:
        parse(value)
        return value
    return check


ORIGIN_DEFAULT_PORTS = {"http": 80, "https": 443}


def checked_origins(value: str) -> str:
    """A comma-separated list of web origins, normalized as browsers send them in Origin
    (lower case, no default port); ValueError saying what is wrong."""
    origins = []
    for item in value.split(","):
        origin = item.strip().lower().rstrip("/")
        if not origin:
            continue
        try:
            parts = urlsplit(origin)
            port = parts.port
        except ValueError:
            parts, port = None, None
        if parts is None or parts.scheme not in ORIGIN_DEFAULT_PORTS or not parts.hostname or parts.path \
                or parts.query or parts.fragment or "@" in parts.netloc:
            raise ValueError("must be comma-separated origins like https://app.example.com (scheme, host and "
                             "optional port, no path)")
        if port == ORIGIN_DEFAULT_PORTS[parts.scheme]:
            origin = origin.rsplit(":", 1)[0]
        origins.append(origin)
    return ",".join(origins)


AUTH_MODES = ("tokens", "open")


def checked_auth(mode: str) -> str:
    if mode not in AUTH_MODES:
        raise ValueError(f"must be {' or '.join(AUTH_MODES)}, got {mode!r}")
    return mode


HOST_TOKEN_MIN_LENGTH = 32


def checked_host_token(token: str) -> str:
    """The host token, if long enough to resist guessing (empty: none); ValueError without it."""
    if token and len(token) < HOST_TOKEN_MIN_LENGTH:
        raise ValueError(f"must be at least {HOST_TOKEN_MIN_LENGTH} characters (openssl rand -hex 32)")
    return token


MIN_HOT_WINDOW_MILLIS = 1000


def checked_hot_window(millis: int) -> int:
    if 0 < millis < MIN_HOT_WINDOW_MILLIS:
        raise ValueError(f"must be 0 (off) or at least {MIN_HOT_WINDOW_MILLIS}, got {millis}")
    return millis


@dataclass(frozen=True)
class Setting:
    env: str
    default: Any
    doc: str
    minimum: int | None = None
    maximum: int | None = None
    check: Callable[[Any], Any] | None = None  # a URL's (list's, number's) checker, raising ValueError
    secret: bool = False  # kept out of the config's repr (and so out of any log line showing it)

    def read(self) -> Any:
        """The value from the environment (unset or empty: the default), checked."""
        if isinstance(self.default, bool):
            return env_bool(self.env, self.default)
        if isinstance(self.default, int):
            number = env_int(self.env, self.default, self.minimum, self.maximum)
            try:
                return number if self.check is None else self.check(number)
            except ValueError as exc:
                raise SystemExit(f"environment variable {self.env} {exc}") from None
        if self.check is not None:
            return env_url(self.env, self.default, self.check)
        return os.environ.get(self.env) or self.default

    @property
    def django_key(self) -> str:
        return self.env.removeprefix(PREFIX)


def setting(env: str, default: Any, doc: str, **bounds) -> Any:
    declared = Setting(env, default, doc, **bounds)
    return field(default=default, repr=not declared.secret, metadata={"setting": declared})


@dataclass(frozen=True)
class QueueConfig:
    redis_url: str = setting(
        "REDIS_URL", "redis://127.0.0.1:16379/0",
        "the live queue: " + URL_FORMS, check=checked_url, secret=True)  # its password, like the next one's
    database_url: str = setting(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:15432/delayqueue",
        "the PostgreSQL message log", check=checked_postgres_url, secret=True)
    log_databases: str = setting(
        "DELAYQUEUE_LOG_DATABASES", "", "more PostgreSQL databases for the message log, as comma-separated "
        "alias=postgres://... pairs; DELAYQUEUE_NAMESPACE_DATABASES says whose log each holds",
        check=_checked(log_databases), secret=True)
    namespace_databases: str = setting(
        "DELAYQUEUE_NAMESPACE_DATABASES", "", "which database holds a namespace's log and settings, as "
        "comma-separated namespace=alias pairs (aliases of DELAYQUEUE_LOG_DATABASES); unlisted namespaces: "
        "DATABASE_URL's", check=_checked(namespace_databases))
    namespace: str = setting("DELAYQUEUE_NAMESPACE", "default",
                             "separates deployments sharing one Redis; the namespace of `open` mode and of the "
                             "health endpoints", check=checked_namespace)
    auth: str = setting(
        "DELAYQUEUE_AUTH", "tokens",
        "`tokens`: every queue call needs an API token (its namespace and scopes); `open`: anyone may do "
        "anything in DELAYQUEUE_NAMESPACE", check=checked_auth)
    # A Redis that stops answering (hung, paused, dropping packets) fails the calls waiting on it
    # after this long, instead of holding them forever.
    redis_timeout_millis: int = setting(
        "DELAYQUEUE_REDIS_TIMEOUT_MILLIS", 10_000, "a Redis call not answered within this long fails", minimum=1)
    ttl_millis: int = setting("DELAYQUEUE_TTL_MILLIS", 3_600_000, "default TTL, counted from triggerTime", minimum=1)
    max_retry: int = setting("DELAYQUEUE_MAX_RETRY", 10, "default redeliveries", minimum=0)
    ack_timeout_millis: int = setting(
        "DELAYQUEUE_ACK_TIMEOUT_MILLIS", 30_000, "default ack deadline after a pull", minimum=1)
    pull_batch: int = setting("DELAYQUEUE_PULL_BATCH", 1, "default pull batch", minimum=1)
    max_pull_batch: int = setting("DELAYQUEUE_MAX_PULL_BATCH", 1000, "largest pull batch", minimum=1)
    long_polling_timeout_millis: int = setting(
        "DELAYQUEUE_LONG_POLLING_TIMEOUT_MILLIS", 10_000, "default long-poll hold", minimum=1)
    max_long_polling_timeout_millis: int = setting(
        "DELAYQUEUE_MAX_LONG_POLLING_TIMEOUT_MILLIS", 60_000, "longest long-poll hold", minimum=1)
    ended_retention_millis: int = setting(
        "DELAYQUEUE_ENDED_RETENTION_MILLIS", 300_000, "how long ended messages stay readable by getMsg", minimum=1)
    max_msg_bytes: int = setting("DELAYQUEUE_MAX_MSG_BYTES", 1_048_576, "largest msg in UTF-8 bytes", minimum=1)
    max_batch_send: int = setting("DELAYQUEUE_MAX_BATCH_SEND", 1000, "most messages in one sendMsgBatch", minimum=1)
    monitor_interval_seconds: int = setting(
        "DELAYQUEUE_MONITOR_INTERVAL_SECONDS", 60, "getMonitorData interval", minimum=1)
    # Below 100 ms a scanner could lose its lock between two of its own calls.
    scanner_lock_ttl_millis: int = setting(
        "DELAYQUEUE_SCANNER_LOCK_TTL_MILLIS", 5_000, "scanner topic lock TTL (the take-over bound)", minimum=100)
    scanner_batch: int = setting("DELAYQUEUE_SCANNER_BATCH", 1000, "messages per scanner script call", minimum=1)
    topic_idle_seconds: int = setting(
        "DELAYQUEUE_TOPIC_IDLE_SECONDS", 1800, "an idle, empty topic is retired after this long", minimum=1)
    topic_check_seconds: int = setting(
        "DELAYQUEUE_TOPIC_CHECK_SECONDS", 600, "how often topics are checked for retirement", minimum=1)
    message_log: bool = setting(
        "DELAYQUEUE_MESSAGE_LOG", True, "the PostgreSQL message log; off only to measure what it costs")
    log_writer_interval_millis: int = setting(
        "DELAYQUEUE_LOG_WRITER_INTERVAL_MILLIS", 100, "how often the log writer drains the streams", minimum=1)
    log_writer_batch: int = setting(
        "DELAYQUEUE_LOG_WRITER_BATCH", 5000, "about how many events per drain, shared by the topics that have some",
        minimum=1)
    log_retention_days: int = setting(
        "DELAYQUEUE_LOG_RETENTION_DAYS", 7, "prune_log's default age", minimum=1, maximum=MAX_AGE_DAYS)
    dead_letter_retention_days: int = setting(
        "DELAYQUEUE_DEAD_LETTER_RETENTION_DAYS", 14,
        "days dead letters (status 5 or 6) are kept before prune_log's age counts", minimum=1, maximum=MAX_AGE_DAYS)
    # Whether PostgreSQL times the statement out or does not answer at all (a send waits for one).
    log_timeout_millis: int = setting(
        "DELAYQUEUE_LOG_TIMEOUT_MILLIS", 30_000, "a statement on the message log fails after this long", minimum=1)
    allowed_origins: str = setting(
        "DELAYQUEUE_ALLOWED_ORIGINS", "", "web origins whose pages may call the queue API "
        "(comma-separated, like https://app.example.com); other sites' requests are refused", check=checked_origins)
    push_allowed_hosts: str = setting(
        "DELAYQUEUE_PUSH_ALLOWED_HOSTS", "", "hosts push URLs may name (comma-separated: host names, *.domain, IP "
        "addresses or networks, or *); loopback and private addresses only when listed as addresses; empty: push "
        "is off", check=checked_allowed_hosts)
    push_secret_grace_seconds: int = setting(
        "DELAYQUEUE_PUSH_SECRET_GRACE_SECONDS", 86_400, "how long a rotated push secret still signs", minimum=0)
    metrics_token: str = setting(
        "DELAYQUEUE_METRICS_TOKEN", "", "bearer token that /metrics and the API docs require; unset: open",
        secret=True)
    # Caps that keep one tenant from using up what a shared deployment has (docs/deploy.md,
    # "Limits and caps"); each refusal answers code 429 naming its variable.
    max_topics: int = setting(
        "DELAYQUEUE_MAX_TOPICS", 1_000, "most topics a namespace has registered at once; a send that would "
        "make one more is refused", minimum=1)
    max_topic_configs: int = setting(
        "DELAYQUEUE_MAX_TOPIC_CONFIGS", 1_000, "most topics with their own settings (setTopicConfig rows) per "
        "namespace", minimum=1)
    max_long_polls_per_token: int = setting(
        "DELAYQUEUE_MAX_LONG_POLLS_PER_TOKEN", 100, "most longPollingMsg calls one API token holds at once, over "
        "every web process", minimum=1)
    max_push_concurrency: int = setting(
        "DELAYQUEUE_MAX_PUSH_CONCURRENCY", 200, "most pushes in flight at once for a namespace: the sum of its "
        "push topics' pushConcurrency", minimum=1)
    max_redrive_rate: int = setting(
        "DELAYQUEUE_MAX_REDRIVE_RATE", 1_000, "largest maxPerSecond of a dead-letter redrive", minimum=1,
        maximum=REDRIVE_MAX_RATE)
    max_schedules: int = setting(
        "DELAYQUEUE_MAX_SCHEDULES", 10_000, "most schedules per namespace (createSchedule)", minimum=1)
    schedule_min_interval_millis: int = setting(
        "DELAYQUEUE_SCHEDULE_MIN_INTERVAL_MILLIS", 1_000, "shortest everyMillis a schedule may have", minimum=1_000,
        maximum=MAX_DELAY_MILLIS)
    # Failed token checks per client address (stores/tokens.py): past the limit, a token this
    # process does not already hold as valid is refused without asking PostgreSQL.
    auth_failure_limit: int = setting(
        "DELAYQUEUE_AUTH_FAILURE_LIMIT", 50, "unknown or revoked API tokens (and wrong DELAYQUEUE_METRICS_TOKENs) one "
        "client address may present within DELAYQUEUE_AUTH_FAILURE_WINDOW_SECONDS (per web process) before its calls "
        "with a token not already known valid answer 429", minimum=1)
    auth_failure_window_seconds: int = setting(
        "DELAYQUEUE_AUTH_FAILURE_WINDOW_SECONDS", 60, "the window of DELAYQUEUE_AUTH_FAILURE_LIMIT, from an "
        "address' first failure", minimum=1)
    token_trust_seconds: int = setting(
        "DELAYQUEUE_TOKEN_TRUST_SECONDS", 60, "while PostgreSQL does not answer, a token's last answer stands for "
        "at most this long after it was last confirmed; then its calls answer 500 (token check unavailable)",
        minimum=1)
    host_token: str = setting(
        "DELAYQUEUE_HOST_TOKEN", "", "the host operator's bearer token for /camellia/health/online and offline "
        f"(at least {HOST_TOKEN_MIN_LENGTH} characters); unset: a manage token of DELAYQUEUE_NAMESPACE",
        check=checked_host_token, secret=True)
    # A producer that retries a send after a lost answer must not get a second delivery when the
    # first was quick: a msgId stays taken this long after its message ended (acked, dead, deleted).
    dedupe_window_millis: int = setting(
        "DELAYQUEUE_DEDUPE_WINDOW_MILLIS", 86_400_000, "a send under the msgId of a message that ended less than "
        "this long ago answers that message and delivers nothing; a dead letter's msgId stays taken until it is "
        "redriven or pruned (purged, it is a deleted message from then on)",
        minimum=0, maximum=MAX_AGE_DAYS * 86_400_000)
    # The cold tier (workers/loader.py): messages due beyond the window wait in the message log only.
    hot_window_millis: int = setting(
        "DELAYQUEUE_HOT_WINDOW_MILLIS", 3_600_000, "Redis holds the waiting messages due within this long (the "
        "loader brings the others from the message log ahead of their time); 0 holds every message in Redis; "
        "with the message log off, Redis holds every message whatever this says",
        minimum=0, maximum=MAX_DELAY_MILLIS, check=checked_hot_window)
    # About 350 bytes of Redis each (docs/benchmarks.md): the default holds a topic to about 0.7 GB.
    hot_max_messages: int = setting(
        "DELAYQUEUE_HOT_MAX_MESSAGES", 2_000_000, "the cold tier: the loader brings a topic's messages into Redis "
        "while it holds fewer than this many waiting; beyond, the topic's window shrinks, never below a minute "
        "ahead (or the window, if shorter)", minimum=1)

    # The cold tier's packed lists (lua/includes/packed.lua): a waiting message due later than
    # twice this is packed, and each second's list goes into the waiting set this long before it.
    pack_lead_millis: int = setting(
        "DELAYQUEUE_PACK_LEAD_MILLIS", 5_000, "the cold tier: a waiting message due more than twice this far "
        "ahead waits packed in a list of its second of due time (about 145 bytes of Redis with a 100-byte body, "
        "against 350 in the waiting set), which the scanner moves into the waiting set this long before that "
        "second; 0 packs nothing", minimum=0, maximum=60_000)

    @property
    def pack_lead(self) -> int:
        """The packed lists' lead in ms, 0 when nothing is packed (no cold tier)."""
        return self.pack_lead_millis if self.cold_tier else 0

    @property
    def cold_tier(self) -> bool:
        """Whether a message may wait in the message log only: a hot window, and the log to hold it."""
        return self.message_log and self.hot_window_millis > 0

    @property
    def finds_cold(self) -> bool:
        """Whether the API looks for a message Redis does not hold in the message log (where a topic
        has a loader position): in the cold tier, and with the window switched off too, until the
        loader has brought in what was left cold."""
        return self.message_log

    # The whole body of one request, whatever it carries: a sendMsgBatch of DELAYQUEUE_MAX_BATCH_SEND
    # messages of DELAYQUEUE_MAX_MSG_BYTES each would otherwise be allowed up to 1 GB.
    max_body_bytes: int = setting(
        "DELAYQUEUE_MAX_BODY_BYTES", 16_777_216, "largest request body, chunked or not (code 400, HTTP 413 outside "
        "the queue API)", minimum=1024)
    body_timeout_millis: int = setting(
        "DELAYQUEUE_BODY_TIMEOUT_MILLIS", 10_000, "a request body not received whole within this long is refused",
        minimum=1)
    header_timeout_millis: int = setting(
        "DELAYQUEUE_HEADER_TIMEOUT_MILLIS", 10_000, "a connection whose request line and headers are not received "
        "within this long is closed", minimum=1)
    # A PostgreSQL restart (a fast shutdown and start: about half a second) must not fail the
    # sends made meanwhile; a log down for longer fails them after this long, as it always did.
    log_retry_millis: int = setting(
        "DELAYQUEUE_LOG_RETRY_MILLIS", 2_500, "how long the sends' writes to the message log are retried once "
        "PostgreSQL is found unreachable (restarting, connection refused or lost); then they fail; 0: not "
        "retried", minimum=0)

    def __post_init__(self):
        missing = sorted(set(self.log_routes.values()) - set(self.database_urls))
        if missing:
            raise ValueError(f"environment variable DELAYQUEUE_NAMESPACE_DATABASES names database {missing[0]}, "
                             "which DELAYQUEUE_LOG_DATABASES does not declare")

    @cached_property
    def log_database_urls(self) -> dict[str, str]:
        """The message log's databases besides DATABASE_URL's: alias -> URL."""
        return log_databases(self.log_databases)

    @cached_property
    def log_routes(self) -> dict[str, str]:
        """The namespaces whose log is not in DATABASE_URL's database: namespace -> alias."""
        return namespace_databases(self.namespace_databases)

    @property
    def database_urls(self) -> dict[str, str]:
        """Every database of the message log: alias -> URL, DATABASE_URL's (`default`) first."""
        return {DEFAULT_DATABASE: self.database_url, **self.log_database_urls}

    def log_database_of(self, namespace: str) -> str:
        """The alias of the database that holds `namespace`'s rows (messagelog/routing.py)."""
        return self.log_routes.get(namespace, DEFAULT_DATABASE)

    @property
    def redis_timeout(self) -> float:
        return self.redis_timeout_millis / 1000

    @property
    def push_hosts(self) -> HostPolicy:
        return HostPolicy.parse(self.push_allowed_hosts)

    @property
    def monitor_interval_millis(self) -> int:
        return self.monitor_interval_seconds * 1000

    def with_overrides(self, **changes) -> "QueueConfig":
        return replace(self, **changes)

    @classmethod
    def from_environment(cls) -> "QueueConfig":
        values = {name: s.read() for name, s in SETTINGS.items()}
        try:
            return cls(**values)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None

    def queue_settings(self) -> dict:
        """settings.DELAYQUEUE: the DELAYQUEUE_* settings, keyed without the prefix."""
        return {s.django_key: getattr(self, name) for name, s in SETTINGS.items() if s.env.startswith(PREFIX)}


# field name -> its declaration, in declaration order
SETTINGS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in fields(QueueConfig)}



def setting_text(name: str) -> str:
    """How help texts name a setting of QueueConfig: its variable and its default."""
    declared = SETTINGS[name]
    return f"{declared.env}, default {declared.default}"


_current: QueueConfig | None = None


def load_config() -> QueueConfig:
    """The running service's config, built from Django's settings on first use and kept until
    they change (the setting_changed handler below: tests' settings overrides)."""
    global _current
    if _current is None:
        from django.conf import settings

        _current = QueueConfig(**{
            name: settings.DELAYQUEUE[s.django_key] if s.env.startswith(PREFIX) else getattr(settings, s.env)
            for name, s in SETTINGS.items()
        })
    return _current


def settings_changed(setting: str, **kwargs) -> None:
    global _current
    if setting == "DELAYQUEUE" or setting in {s.env for s in SETTINGS.values()}:
        _current = None
