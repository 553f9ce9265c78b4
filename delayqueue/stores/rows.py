"""Operator data written and listed through Django's ORM: API tokens, limits and topic settings
(with their push signing secrets), and the namespaces the service serves. The admin, the
management commands and setTopicConfig (on a worker thread) change them here; every process
reads them again within a second through the caches beside this module (tokens.py, limits.py,
topic_settings.py, push_topics.py), which need no Django."""
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Sum
from django.utils import timezone

from delayqueue.config.settings import load_config
from delayqueue.core.clock import now_millis
from delayqueue.core.constants import TOKEN_PREFIX, Scope
from delayqueue.core.exceptions import BadRequest, CapReached, NotFound, Refused
from delayqueue.core.names import checked_namespace
from delayqueue.messagelog import sql
from delayqueue.messagelog.routing import database_of
from delayqueue.models import ApiToken, Limit, TopicConfig
from delayqueue.stores.limits import NAMESPACE
from delayqueue.stores.tokens import ordered_namespaces, token_hash
from delayqueue.stores.topic_settings import TopicSettings

log = logging.getLogger(__name__)

# --- API tokens: `dq_` + 32 random bytes (URL-safe base64), stored only as their sha256.

NAME_MAX = ApiToken._meta.get_field("name").max_length


def token_namespace(namespace: str) -> str:
    """The namespace, checked; BadRequest naming the rule."""
    try:
        return checked_namespace(namespace)
    except ValueError as exc:
        raise BadRequest(f"not a namespace: {exc}") from None


def checked_scopes(scopes: list[str]) -> list[str]:
    """The scopes, deduplicated in their canonical order; BadRequest naming an unknown one."""
    known = list(Scope.values)
    unknown = [s for s in scopes if s not in known]
    if unknown:
        raise BadRequest(f"unknown scope {unknown[0]!r}: choose from {', '.join(known)}")
    if not scopes:
        raise BadRequest(f"at least one scope is needed: {', '.join(known)}")
    return [s for s in known if s in scopes]


def create_token(*, namespace: str, scopes: list[str], name: str | None = None) -> tuple[ApiToken, str]:
    """A new token: its row, and the token itself (shown once: only its hash is stored)."""
    token_namespace(namespace)
    scopes = checked_scopes(scopes)
    if name is not None and not (0 < len(name) <= NAME_MAX):
        raise BadRequest(f"a token name has 1 to {NAME_MAX} characters")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    name = name or f"{namespace}-{secrets.token_hex(4)}"
    try:
        with transaction.atomic():  # a duplicate name must not break the caller's transaction
            row = ApiToken.objects.create(name=name, namespace=namespace, scopes=",".join(scopes),
                                          token_hash=token_hash(token))
    except IntegrityError:
        raise BadRequest(f"a token named {name!r} already exists") from None
    return row, token


def revoke_token(*, name: str) -> ApiToken:
    """Revokes the token (refused by every web process within a second); NotFound if no such name."""
    row = ApiToken.objects.filter(name=name).first()
    if row is None:
        raise NotFound(f"no token named {name!r}")
    if row.revoked_at is None:
        row.revoked_at = timezone.now()
        row.save(update_fields=["revoked_at"])
    return row


@dataclass(frozen=True)
class TokenInfo:
    name: str
    namespace: str
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None


def list_tokens() -> list[TokenInfo]:
    return [TokenInfo(t.name, t.namespace, t.scope_list, t.created_at, t.revoked_at)
            for t in ApiToken.objects.order_by("created_at", "name")]



def served_namespaces() -> list[str]:
    """The namespaces this service serves (the admin, the dashboard and /metrics show them):
    DELAYQUEUE_NAMESPACE, then every namespace with a token not revoked, as `manage.py
    run_scanners` runs a scanner for each. When PostgreSQL does not answer, DELAYQUEUE_NAMESPACE
    alone (as run_scanners), so that /metrics still reports its Redis figures."""
    try:
        with connections["default"].cursor() as cursor:
            cursor.execute(sql.TOKEN_NAMESPACES)
            found = [row[0] for row in cursor.fetchall()]
    except DatabaseError as exc:
        log.warning("could not read the token namespaces: %s", exc)
        found = []
    return ordered_namespaces(load_config().namespace, found)


# --- Limits (limits.py enforces them).

LIMIT_FIELDS = ("produce_rate", "consume_rate", "max_live")


def set_limits(*, namespace: str, topic: str = NAMESPACE, produce_rate: int | None = None,
               consume_rate: int | None = None, max_live: int | None = None,
               by_operator: bool = True) -> Limit | None:
    """Changes the limits given of a namespace (topic NAMESPACE) or of one of its topics: 0
    removes a limit, None leaves it as it is. Returns the limits now in force, None when none is
    left (the row is then deleted).

    The operator's limits (`by_operator`: the admin, manage.py set_limits) are theirs alone: a
    tenant's change (setTopicConfig) to a row the operator set is Refused 403, so no tenant lifts
    a limit the operator put on it. Once the operator removes them all, the tenant may set its own."""
    changes = {"produce_rate": produce_rate, "consume_rate": consume_rate, "max_live": max_live}
    database = database_of(namespace)
    with transaction.atomic(using=database):
        limit = (Limit.objects.using(database).select_for_update().filter(namespace=namespace, topic=topic).first()
                 or Limit(namespace=namespace, topic=topic, set_by_operator=by_operator))
        changing = [name for name, value in changes.items()
                    if value is not None and (value or None) != getattr(limit, name)]
        if not changing:
            return limit if limit.pk is not None else None
        # A row the admin's Limits page emptied is kept, but holds no limit of the operator's any more.
        if not by_operator and limit.set_by_operator and any(getattr(limit, name) for name in LIMIT_FIELDS):
            raise Refused(f"the limits of topic {topic} were set by the operator: only the operator changes them", 403)
        limit.set_by_operator = by_operator
        for name in changing:
            setattr(limit, name, changes[name] or None)
        if all(getattr(limit, name) is None for name in LIMIT_FIELDS):
            if limit.pk is not None:
                limit.delete()
            return None
        limit.save()
        return limit


def limits_of(*, namespace: str) -> list[Limit]:
    """The namespace's limits: its own first, then its topics' by name."""
    return list(Limit.objects.using(database_of(namespace)).filter(namespace=namespace).order_by("topic"))


# --- Topic settings (topic_settings.py), with their limits, in one transaction.

# A push signing secret: recognisable (secret scanners, logs) and 256 random bits.
PUSH_SECRET_PREFIX = "dqps_"


def new_push_secret() -> str:
    return PUSH_SECRET_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class TopicConfigCaps:
    """A namespace's caps on topic settings (0: none), checked by save_topic_config."""

    rows: int = 0  # topics with their own settings (DELAYQUEUE_MAX_TOPIC_CONFIGS)
    push_concurrency: int = 0  # the sum of its push topics' concurrency (DELAYQUEUE_MAX_PUSH_CONCURRENCY)


def save_topic_config(*, namespace: str, topic: str, changes: dict, limits: dict, by_operator: bool,
                      rotate_push_secret: bool = False, secret_grace_millis: int = 0,
                      caps: TopicConfigCaps = TopicConfigCaps(), placement: list | None = None) -> str | None:
    """Sets the TopicConfig fields in `changes` (a value None: back to the default) and the
    limits in `limits` (set_limits' keywords: 0 removes one, `by_operator` says whose); the rest
    stay as they are; nothing, if set_limits refuses. `placement`: the slot ranges of the shards
    of a count taken up (live/shards.spread), kept unless the count still drains.

    A topic given its first push URL gets a signing secret; `rotate_push_secret` makes a new one,
    the old one signing on for `secret_grace_millis`; an empty push URL forgets both. Answers
    the new secret, shown this once, or None. BadRequest for a rotation without a push URL;
    CapReached for a new row, or more push concurrency, beyond `caps` (a change that adds neither
    passes, so a lowered cap never blocks a pause). A row left with every value at its default is
    deleted (or never made): the topic has no settings of its own, and takes no place under the
    cap. The worker thread's connection is closed after, so a PostgreSQL restart leaves no broken one."""
    database = database_of(namespace)
    try:
        with transaction.atomic(using=database):
            if caps.rows or caps.push_concurrency:
                with connections[database].cursor() as cursor:
                    cursor.execute(sql.TOPIC_CONFIG_LOCK, [namespace])
            configs = TopicConfig.objects.using(database)
            config = (configs.select_for_update().filter(namespace=namespace, topic=topic).first()
                      or TopicConfig(namespace=namespace, topic=topic))
            pushes_before = _push_share(config)
            defaults = TopicSettings()
            if "shards" in changes:
                _reshard(config, changes["shards"] or defaults.shards, placement)
            for name, value in changes.items():
                setattr(config, name, getattr(defaults, name) if value is None else value)
            secret = None
            if not config.push_url:
                if rotate_push_secret:
                    raise BadRequest(f"rotatePushSecret: topic {topic} has no pushUrl, so no secret to rotate")
                config.push_secret = config.push_previous_secret = ""
                config.push_previous_until = 0
            elif not config.push_secret or rotate_push_secret:
                if config.push_secret:
                    config.push_previous_secret = config.push_secret
                    config.push_previous_until = now_millis() + secret_grace_millis
                config.push_secret = secret = new_push_secret()
            if caps.push_concurrency and _push_share(config) > pushes_before:
                others = (configs.filter(namespace=namespace).exclude(push_url="").exclude(topic=topic)
                          .aggregate(total=Sum("push_concurrency"))["total"] or 0)
                if others + _push_share(config) > caps.push_concurrency:
                    raise CapReached(f"too many pushes at once: namespace {namespace}'s other push topics have "
                                     f"{others} in flight at most, and this one would add {_push_share(config)}",
                                     setting="DELAYQUEUE_MAX_PUSH_CONCURRENCY", cap=caps.push_concurrency)
            if not _own_settings(config):  # all back to the defaults: no row, no place under the cap
                if config.pk is not None:
                    config.delete()
            else:
                if config.pk is None and caps.rows:
                    rows = configs.filter(namespace=namespace).count()
                    if rows >= caps.rows:
                        raise CapReached(f"too many topic settings: namespace {namespace} has {rows} topics with "
                                         "their own settings", setting="DELAYQUEUE_MAX_TOPIC_CONFIGS", cap=caps.rows)
                config.save()
            if limits:
                set_limits(namespace=namespace, topic=topic, by_operator=by_operator, **limits)
        return secret
    finally:
        connections[database].close()


def forget_drained_shards(*, namespace: str, topic: str, count: int, changed_at: int) -> bool:
    """Takes a shard count whose shards are empty out of the topic's draining ones, unless its
    shard count changed since the scanner found them so (at `changed_at`). True if it did."""
    database = database_of(namespace)
    try:
        with transaction.atomic(using=database):
            config = (TopicConfig.objects.using(database).select_for_update()
                      .filter(namespace=namespace, topic=topic).first())
            if config is None or config.shards_changed_at != changed_at or count not in config.draining_shards:
                return False
            config.draining_shards = [c for c in config.draining_shards if c != count]
            config.save(update_fields=["draining_shards", "updated_at"])
            return True
    finally:
        connections[database].close()


def _reshard(config: TopicConfig, shards: int, placement: list | None) -> None:
    """A new shard count: the one given up keeps its shards, read and scanned until they are
    empty (live/shards.py); a count taken up again drains no more. A count whose shards hold
    nothing (not draining) is placed anew when a placement comes with it."""
    if shards != config.shards:
        if placement is not None and shards not in config.draining_shards:
            config.shard_placement = {**config.shard_placement, str(shards): placement}
        config.draining_shards = sorted(({*config.draining_shards, config.shards}) - {shards})
        config.shards_changed_at = now_millis()


# What a topic's row holds beside its identity: a row whose every one is its default says nothing.
_SETTING_FIELDS = [field for field in TopicConfig._meta.concrete_fields
                   if field.name not in ("id", "namespace", "topic", "updated_at")]


def _own_settings(config: TopicConfig) -> bool:
    """Whether the row holds any value other than its default (a topic without one has no row)."""
    return any(getattr(config, field.name) != field.get_default() for field in _SETTING_FIELDS)


def _push_share(config: TopicConfig) -> int:
    """How many pushes the topic may have in flight at once: its concurrency, if it pushes."""
    return config.push_concurrency if config.push_url else 0
