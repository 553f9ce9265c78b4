"""Who may call the queue API: the request's API token, checked through the runtime's
stores.tokens.TokenCache (no ORM on the API path).

A token comes as `Authorization: Bearer <token>`, or as the path prefix `/t/<token>/camellia/...`
that project/asgi.py strips into scope["delayqueue.token"] (camellia's Java SDK cannot set
headers). delayqueue/api/asgi.py authenticates before it reads a body and keeps the grant in
scope["delayqueue.grant"]; the view then checks only the scope.

A token that fails (unknown or revoked) counts against the client address (REMOTE_ADDR: the
ASGI client, or the proxy's X-Forwarded-For under uvicorn's --proxy-headers; an IPv6 client by
its /64); an address past DELAYQUEUE_AUTH_FAILURE_LIMIT is refused with 429 (stores/tokens.py).

/camellia/health/online and offline act on the whole host, so they take the host operator's
credential instead (authorize_host)."""
import hmac

from delayqueue.core.constants import Scope
from delayqueue.core.exceptions import Refused
from delayqueue.stores.tokens import Grant

BEARER = "bearer "
GRANT_KEY = "delayqueue.grant"


def bearer_token(authorization: str) -> str | None:
    """The token of an Authorization header's value; None when it is not a bearer token."""
    if authorization[:len(BEARER)].lower() == BEARER:
        return authorization[len(BEARER):].strip() or None
    return None


def header_token(headers) -> str | None:
    """The token of the first Authorization header among ASGI's raw headers; None without one."""
    return next((bearer_token(value.decode("latin-1")) for name, value in headers if name == b"authorization"), None)


def request_token(request) -> str | None:
    """The token of the path prefix, else of the Authorization header; None without one. The one
    api/asgi.py authenticated: Django's META joins repeated headers with ",", and a token read there
    would let a second header make each request another holder of the token's long polls."""
    scope = getattr(request, "scope", None)  # ASGI requests only
    if scope is None:
        return bearer_token(request.META.get("HTTP_AUTHORIZATION", ""))
    return scope.get("delayqueue.token") or header_token(scope["headers"])


def present(token: str | None) -> str:
    """The token; Refused 401 without one."""
    if token is None:
        raise Refused("missing API token: send the header 'Authorization: Bearer <token>' "
                      "or call /t/<token>/camellia/...", 401)
    return token


async def authenticate(rt, token: str | None, *, address: str) -> Grant:
    """The token's grant; Refused 401 without a valid token, 429 when the client `address`
    presented too many invalid tokens. No message names the token."""
    grant = await rt.tokens.grant(present(token), address=address)
    if grant is None or grant.revoked:
        raise Refused("invalid or revoked API token", 401)
    return grant


async def authorize(rt, request, scope: str | tuple[str, ...]) -> str:
    """The namespace the request's token works in; Refused 401 without a valid token, 403 when
    the token lacks `scope` (a tuple: lacks every one of them), 429 when the client address
    presented too many invalid tokens. No message names the token."""
    grant = getattr(request, "scope", {}).get(GRANT_KEY) or await authenticate(
        rt, request_token(request), address=request.META.get("REMOTE_ADDR") or "")
    if isinstance(scope, tuple):
        if grant.scopes.isdisjoint(scope):
            raise Refused(f"this API token lacks the {' or '.join(scope)} scope", 403)
    elif scope not in grant.scopes:
        raise Refused(f"this API token lacks the {scope} scope", 403)
    return grant.namespace


async def authorize_host(rt, request) -> None:
    """For calls on the whole host (health online/offline): with DELAYQUEUE_HOST_TOKEN set, that
    token alone (in either mode), else in `tokens` mode a manage token of DELAYQUEUE_NAMESPACE, the
    host's own (a tenant's manage token works only in its namespace). Refused 401/403 otherwise."""
    host_token = rt.config.host_token
    if host_token:
        if not hmac.compare_digest(present(request_token(request)).encode(), host_token.encode()):
            raise Refused("this call takes the host token (DELAYQUEUE_HOST_TOKEN)", 403)
    elif rt.config.auth == "tokens" and await authorize(rt, request, Scope.MANAGE) != rt.config.namespace:
        raise Refused("this call takes a manage token of the host's namespace (DELAYQUEUE_NAMESPACE) or the host "
                      "token (DELAYQUEUE_HOST_TOKEN)", 403)
