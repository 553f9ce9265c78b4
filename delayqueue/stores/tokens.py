"""API tokens: created, listed and revoked here (the admin and the management commands call
these); the API checks them in delayqueue/api/auth.py without the ORM. A token is
`dq_` + 32 random bytes (URL-safe base64) and is stored only as its sha256."""
import hashlib
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.utils import timezone

from delayqueue.config import settings as conf
from delayqueue.core.constants import TOKEN_PREFIX, Scope
from delayqueue.core.exceptions import BadRequest, NotFound
from delayqueue.messagelog import sql
from delayqueue.models import ApiToken

log = logging.getLogger(__name__)

NAME_MAX = ApiToken._meta.get_field("name").max_length


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def checked_namespace(namespace: str) -> str:
    try:
        return conf.checked_namespace(namespace)
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
    checked_namespace(namespace)
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



def ordered_namespaces(own: str, token_namespaces: Iterable[str]) -> list[str]:
    """DELAYQUEUE_NAMESPACE first, then the tokens' other namespaces, sorted and each once."""
    return [own, *sorted(set(token_namespaces) - {own})]


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
    return ordered_namespaces(conf.load_config().namespace, found)
