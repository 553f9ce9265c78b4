"""The browser-safe edge of the queue API, the bounds on request bodies, and who may read
/metrics and the API docs.

The queue API is served without Django's middleware (delayqueue/api/asgi.py), so nothing else
checks the Host header (DNS rebinding) or refuses a request a web page made the browser send
(a cross-origin text/plain or form POST needs no preflight). Non-browser clients (curl, the
Java SDK) send neither Origin nor Sec-Fetch-Site and are unaffected.
"""
import asyncio
import hmac
import ipaddress
import math
from functools import lru_cache, wraps
from inspect import iscoroutinefunction
from urllib.parse import urlsplit

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse
from django.utils.cache import patch_vary_headers

from delayqueue.api.auth import bearer_token
from delayqueue.config.settings import ORIGIN_DEFAULT_PORTS, load_config
from delayqueue.core.exceptions import BadRequest, Refused, Throttled
from delayqueue.runtime import current

# Requests that may be held open; only these watch for the client hanging up.
HELD_PATHS = ("/longPollingMsg",)
# A long poll answered an error (refused here, for its token in api/asgi.py, any other in the view)
# answers no sooner than this: camellia's SDK polls again at once on any error, and would spin.
LONG_POLL_ERROR_PAUSE_SECONDS = 1.0
# Load balancers probe these with whatever Host they know the node by: no check at all.
OPEN_PATHS = ("/camellia/health/status", "/camellia/health/check")
# Answered as camellia's health endpoints answer: the code is also the HTTP status.
HEALTH_PATHS = "/camellia/health/"
# Sec-Fetch-Site values of a request that no other site's page made: same origin, or typed by the user.
NOT_CROSS_SITE = ("same-origin", "none")
PREFLIGHT_MAX_AGE_SECONDS = 600
# An attacker's Host or Origin is quoted back in the refusal only this far.
QUOTED_CHARS = 100
# Headers a proxy adds: a request carrying one came through a proxy, whatever its peer address.
FORWARDING_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


class BodyRefused(BadRequest):
    """A request body not taken whole: over the cap (HTTP 413 where the status is the answer) or
    not received in time (408). The queue API answers code 400 with the same text."""

    def __init__(self, msg: str, http_status: int):
        super().__init__(msg)
        self.http_status = http_status


def body_too_big() -> BodyRefused:
    """DATA_UPLOAD_MAX_MEMORY_SIZE is DELAYQUEUE_MAX_BODY_BYTES (project/settings.py)."""
    return BodyRefused(f"request body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes", 413)


def body_too_slow() -> BodyRefused:
    return BodyRefused(f"request body not received within {load_config().body_timeout_millis} ms "
                       "(DELAYQUEUE_BODY_TIMEOUT_MILLIS)", 408)


@lru_cache(maxsize=4)
def parsed_origins(setting: str) -> frozenset[str]:
    return frozenset(filter(None, setting.split(",")))


def allowed_origins() -> frozenset[str]:
    """DELAYQUEUE_ALLOWED_ORIGINS, normalized by config/settings.checked_origins."""
    return parsed_origins(load_config().allowed_origins)


def same_host(origin: str, host: str) -> bool:
    """Whether the origin names the request's Host (host and port; browsers omit a default port)."""
    try:
        parts = urlsplit(origin)
    except ValueError:  # no URL ("http://[::1": an unclosed bracket): no host's origin, so a cross one
        return False
    netloc = parts.netloc.lower()
    host = host.lower()
    return netloc == host or f"{netloc}:{ORIGIN_DEFAULT_PORTS.get(parts.scheme)}" == host


def check_browser_request(request: HttpRequest) -> str | None:
    """Raises BadRequest for a Host not in ALLOWED_HOSTS, Refused (403) for a cross-site browser
    request from an origin not in DELAYQUEUE_ALLOWED_ORIGINS. Returns the request's Origin when it is
    an allowed cross origin (its answer then carries CORS headers), else None."""
    try:
        host = request.get_host()  # Django's semantics: ALLOWED_HOSTS, X-Forwarded-Host, DEBUG's localhost
    except DisallowedHost:
        raw = request._get_raw_host()  # what get_host() checked
        raise BadRequest(f"Host {raw[:QUOTED_CHARS]!r} is not allowed: it is not in ALLOWED_HOSTS") from None
    meta = request.META
    origin = meta.get("HTTP_ORIGIN")
    fetch_site = meta.get("HTTP_SEC_FETCH_SITE")
    if origin is None and fetch_site is None:
        return None  # not a browser
    if origin is not None and origin.lower() in allowed_origins():
        return origin
    if (fetch_site is None or fetch_site in NOT_CROSS_SITE) and (origin is None or same_host(origin, host)):
        return None
    source = f"origin {origin[:QUOTED_CHARS]!r}" if origin is not None else "another site"
    raise Refused(f"cross-site browser request from {source} refused: list the origin in "
                  "DELAYQUEUE_ALLOWED_ORIGINS to allow it", 403)


def refusal_answer(path: str, refusal: BadRequest | Refused) -> HttpResponse:
    """In the API's envelope (HTTP 200); on the health endpoints the code is the HTTP status, as
    their other answers, so a drain script reading the status is not told `offline` succeeded."""
    body = orjson.dumps({"code": refusal.code, "msg": str(refusal)})
    status = refusal.code if path.startswith(HEALTH_PATHS) else 200
    return HttpResponse(body, status=status, content_type="application/json")


def preflight_answer(origin: str) -> HttpResponse:
    response = HttpResponse(status=204)
    response["Access-Control-Allow-Methods"] = "GET, POST"
    response["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
    response["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE_SECONDS)
    return allow_origin(response, origin)


def allow_origin(response: HttpResponse, origin: str) -> HttpResponse:
    response["Access-Control-Allow-Origin"] = origin
    patch_vary_headers(response, ("Origin",))
    return response


async def guarded(request: HttpRequest, get_response) -> HttpResponse:
    """The answer to a queue API request, through the edge's checks: refused, a CORS preflight
    answered, or the view's answer (with CORS headers for an allowed cross origin)."""
    if request.path_info.startswith(OPEN_PATHS):
        return await get_response(request)
    try:
        cross_origin = check_browser_request(request)
    except (BadRequest, Refused) as refusal:
        if request.path_info.endswith(HELD_PATHS):
            await asyncio.sleep(LONG_POLL_ERROR_PAUSE_SECONDS)
        return refusal_answer(request.path_info, refusal)
    if cross_origin is None:
        return await get_response(request)
    if request.method == "OPTIONS":
        return preflight_answer(cross_origin)
    return allow_origin(await get_response(request), cross_origin)


def metrics_token_required(view):
    """Protects a view (sync or async) with DELAYQUEUE_METRICS_TOKEN when it is set: without
    `Authorization: Bearer <it>` the answer is HTTP 401 with WWW-Authenticate; a wrong one counts
    against the client address as a failed API token does, and past DELAYQUEUE_AUTH_FAILURE_LIMIT
    the address gets HTTP 429. Unset, only a caller on this host is served (see from_loopback)."""
    run = view if iscoroutinefunction(view) else sync_to_async(view)

    @wraps(view)
    async def checked(request, *args, **kwargs):  # async: the failures are counted in the loop's runtime
        refusal = bearer_refusal(request)
        return refusal if refusal is not None else await run(request, *args, **kwargs)
    return checked


def from_loopback(request: HttpRequest) -> bool:
    """Whether the caller is on this host: a loopback peer address, and no proxy's header (behind a
    proxy on this host every peer is loopback; X-Forwarded-For is never trusted to say loopback)."""
    meta = request.META
    if any(header in meta for header in FORWARDING_HEADERS):
        return False
    try:
        return ipaddress.ip_address(meta.get("REMOTE_ADDR") or "").is_loopback
    except ValueError:  # no address (a Unix socket's peer): not known to be on this host
        return False


def bearer_refusal(request: HttpRequest) -> HttpResponse | None:
    token = load_config().metrics_token
    if not token:
        if from_loopback(request):
            return None
        return HttpResponse("served only to this host unless DELAYQUEUE_METRICS_TOKEN is set (then with "
                            "Authorization: Bearer <it>)\n", status=403, content_type="text/plain")
    given = bearer_token(request.META.get("HTTP_AUTHORIZATION", ""))
    # compare_digest: the time taken does not tell how much of a guess was right.
    if given is not None and hmac.compare_digest(
            given.encode("utf-8", "surrogateescape"), token.encode("utf-8", "surrogateescape")):
        return None
    if given is not None:  # a guess: counted with the address' failed API tokens (stores/tokens.py)
        failures = current().tokens.failures
        address = request.META.get("REMOTE_ADDR") or ""
        try:
            failures.check(address)
        except Throttled as exc:
            response = HttpResponse(f"{exc}\n", status=429, content_type="text/plain")
            response["Retry-After"] = str(math.ceil(exc.retry_after_millis / 1000))
            return response
        failures.add(address)
    response = HttpResponse("a bearer token is required: Authorization: Bearer <DELAYQUEUE_METRICS_TOKEN>\n",
                            status=401, content_type="text/plain")
    response["WWW-Authenticate"] = 'Bearer realm="delayqueue"'
    return response
