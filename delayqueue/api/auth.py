"""Who may call the queue API: the request's API token, checked through the runtime's
stores.tokens.TokenCache (no ORM on the API path).

A token comes as `Authorization: Bearer <token>`, or as the path prefix `/t/<token>/camellia/...`
that project/asgi.py strips into scope["delayqueue.token"] (camellia's Java SDK cannot set
headers). delayqueue/api/asgi.py authenticates before it reads a body and keeps the grant in
scope["delayqueue.grant"]; the view then checks only the scope."""
from delayqueue.core.exceptions import Refused
from delayqueue.stores.tokens import Grant

BEARER = "bearer "
GRANT_KEY = "delayqueue.grant"


def bearer_token(authorization: str) -> str | None:
    """The token of an Authorization header's value; None when it is not a bearer token."""
    if authorization[:len(BEARER)].lower() == BEARER:
        return authorization[len(BEARER):].strip() or None
    return None


def request_token(request) -> str | None:
    """The token of the path prefix, else of the Authorization header; None without one."""
    token = getattr(request, "scope", {}).get("delayqueue.token")  # ASGI requests only
    return token or bearer_token(request.META.get("HTTP_AUTHORIZATION", ""))


async def authenticate(rt, token: str | None) -> Grant:
    """The token's grant; Refused 401 without a valid token. No message names the token."""
    if token is None:
        raise Refused("missing API token: send the header 'Authorization: Bearer <token>' "
                      "or call /t/<token>/camellia/...", 401)
    grant = await rt.tokens.grant(token)
    if grant is None or grant.revoked:
        raise Refused("invalid or revoked API token", 401)
    return grant


async def authorize(rt, request, scope: str | tuple[str, ...]) -> str:
    """The namespace the request's token works in; Refused 401 without a valid token, 403 when
    the token lacks `scope` (a tuple: lacks every one of them)."""
    grant = getattr(request, "scope", {}).get(GRANT_KEY) or await authenticate(rt, request_token(request))
    if isinstance(scope, tuple):
        if grant.scopes.isdisjoint(scope):
            raise Refused(f"this API token lacks the {' or '.join(scope)} scope", 403)
    elif scope not in grant.scopes:
        raise Refused(f"this API token lacks the {scope} scope", 403)
    return grant.namespace
