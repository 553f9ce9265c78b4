"""An ASGI handler for the queue API that never leaves the event loop.

Django's own ASGIHandler runs every request inside a ThreadSensitiveContext and calls the
sync request_started / request_finished receivers (database housekeeping) and the sync
middleware through sync_to_async: a thread is started and joined per request, capping a
process at a few hundred requests per second. The queue API's views are async and never
use the ORM, so this handler serves them with no middleware and no signal receivers. The
admin and everything else keep Django's standard handler (see project/asgi.py), bounded as
this one is: BoundedASGIHandler.

Bounds on what a client can make a worker hold: a body is refused past DELAYQUEUE_MAX_BODY_BYTES
(chunked or not) and when not received within DELAYQUEUE_BODY_TIMEOUT_MILLIS, and on the queue API
a missing or invalid token is refused before the body is read at all (what takes no body, such as a
preflight or the health endpoints, is answered without reading one).
"""
import asyncio
import io
import tempfile

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpResponse
from django.urls import Resolver404, ResolverMatch, get_resolver, set_script_prefix

from delayqueue.api import edge
from delayqueue.api.auth import GRANT_KEY, authenticate, header_token
from delayqueue.config.settings import load_config
from delayqueue.core.deadlines import loop_deadlines
from delayqueue.core.exceptions import QueueError, Refused
from delayqueue.core.stopping import cancel_and_wait
from delayqueue.runtime import current

# /t/<token>/ is a prefix of the queue API's paths only: /t/<token>/metrics is not /metrics.
TOKEN_PREFIXED_PATHS = "camellia/"
UNSERVED_TOKEN_PREFIX = "/t/-/"
# Every answer of the queue API: never sniffed as another type, never kept by a cache.
ANSWER_HEADERS = ((b"X-Content-Type-Options", b"nosniff"), (b"Cache-Control", b"no-store"))
# Answers that carry no body, nor a Content-Length (RFC 9110 8.6).
NO_BODY_STATUSES = (204, 304)
# The methods the queue endpoints take parameters by (the query string, a body); the others they refuse.
BODY_METHODS = ("GET", "POST")


# The API's paths are fixed (no converters): each is resolved once, not by walking every
# pattern of the URLconf per request. Bounded, so unknown paths cannot grow it.
ROUTE_CACHE_SIZE = 64


def strip_token_prefix(scope: dict) -> None:
    """/t/<token>/camellia/... -> /camellia/..., with the token kept in scope["delayqueue.token"]
    (see api/auth.py). Any other rest is no page: /t/<token>/rest -> /t/-/rest, which Django
    answers 404 (and logs without the token). The scope is changed in place: uvicorn's access
    log reads this same dict, so it logs the path without the token."""
    token, _slash, rest = scope["path"][1:].partition("/")[2].partition("/")
    served = rest.startswith(TOKEN_PREFIXED_PATHS)
    kept = "/" if served else UNSERVED_TOKEN_PREFIX
    if served:
        scope["delayqueue.token"] = token
    scope["path"] = kept + rest
    raw = scope.get("raw_path")
    if raw:
        scope["raw_path"] = kept.encode() + raw[1:].partition(b"/")[2].partition(b"/")[2]


async def read_bounded_body(receive):
    """The request body as a file, refused (edge.BodyRefused) past the body cap, chunked or not, and
    when not received whole in time. A body that came in one message (every queue call's) is read
    from memory; a longer one is spooled as Django spools it."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    task = asyncio.current_task()
    deadlines = loop_deadlines(task.get_loop())
    deadlines.watch(task, load_config().body_timeout_millis / 1000, task.cancel)  # see except below
    body_file = None
    try:
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            body = message.get("body", b"")
            if len(body) > limit:
                raise edge.body_too_big()
            return io.BytesIO(body)
        body_file = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b")
        while True:
            if message["type"] == "http.disconnect":
                raise RequestAborted()
            chunk = message.get("body", b"")
            if body_file.tell() + len(chunk) > limit:
                raise edge.body_too_big()
            body_file.write(chunk)
            if not message.get("more_body", False):
                body_file.seek(0)
                return body_file
            message = await receive()
    except BaseException as exc:
        if body_file is not None:
            body_file.close()
        # The task is watched only in here, so a cancellation for being late arrives here.
        if isinstance(exc, asyncio.CancelledError) and deadlines.forget(task):
            task.uncancel()  # our own cancellation: the request goes on, to be refused
            raise edge.body_too_slow() from None
        raise
    finally:
        deadlines.forget(task)


def request_path_info(scope: dict) -> str:
    """The path as the URLconf sees it (Django's request.path_info), before a request is made."""
    return scope["path"].removeprefix(get_script_prefix(scope))


def announces_body(scope: dict) -> bool:
    """Whether the request says a body follows (chunked, or a Content-Length above 0)."""
    return any(name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0")
               for name, value in scope["headers"])


def closing(response: HttpResponse) -> HttpResponse:
    """An answer given before the body was read: the connection is closed after it, so the
    client cannot go on sending a body nobody reads."""
    response["Connection"] = "close"
    return response


class BoundedASGIHandler(ASGIHandler):
    """Django's ASGI handler with the body bounded (read_bounded_body); refusals are HTTP 413
    and 408 in plain text. Serves the admin and everything not the queue API."""

    async def read_body(self, receive):
        return await read_bounded_body(receive)

    async def handle(self, scope, receive, send):
        try:
            await super().handle(scope, receive, send)
        except edge.BodyRefused as refusal:  # raised by read_body, before anything was answered
            response = HttpResponse(f"{refusal}\n", status=refusal.http_status, content_type="text/plain")
            await self.send_response(closing(response), send)


class EventLoopAPIHandler(BoundedASGIHandler):
    def __init__(self):
        super().__init__()
        self._routes = {}

    def route(self, path_info: str) -> ResolverMatch | None:
        """The URLconf's match for the path (None: no page), cached for the API's fixed paths."""
        match = self._routes.get(path_info)
        if match is None:
            try:
                match = get_resolver().resolve(path_info)
            except Resolver404:
                return None
            if not match.args and not match.kwargs and len(self._routes) < ROUTE_CACHE_SIZE:
                self._routes[path_info] = match
        return match

    def resolve_request(self, request):
        match = self.route(request.path_info)
        if match is None:
            return super().resolve_request(request)  # raises Resolver404 as Django expects
        request.resolver_match = match
        return match

    def view_answer(self, scope: dict, error: QueueError) -> HttpResponse:
        """The error as the path's view answers it (health views: as the HTTP status)."""
        path_info = request_path_info(scope)
        match = self.route(path_info)
        view_class = getattr(match.func, "view_class", None) if match is not None else None
        if view_class is None or not hasattr(view_class, "handle_exception"):
            return edge.refusal_answer(path_info, error)
        return view_class().handle_exception(error)

    @staticmethod
    def reads_body(scope: dict, match: ResolverMatch | None) -> bool:
        """Whether the request's view reads a body: a queue endpoint's GET or POST. The rest (a CORS
        preflight, the health endpoints, a path that is no endpoint) is answered without reading it,
        so that no caller makes a worker take a body before its token is checked."""
        return (scope["method"] in BODY_METHODS and match is not None
                and getattr(getattr(match.func, "view_class", None), "needs_scope", None) is not None)

    async def early_refusal(self, scope: dict, match: ResolverMatch | None) -> HttpResponse | None:
        """With DELAYQUEUE_AUTH=tokens, a view that needs a token refuses a missing or invalid one
        before the body is read (the view checks the token's scope). The grant is kept for the view."""
        if not self.reads_body(scope, match) or load_config().auth != "tokens":
            return None
        rt = current()
        token = scope.get("delayqueue.token") or header_token(scope["headers"])
        try:
            scope[GRANT_KEY] = await authenticate(rt, token, address=(scope.get("client") or ("",))[0])
        except QueueError as error:
            if isinstance(error, Refused) and scope["path"].endswith(edge.HELD_PATHS):
                await asyncio.sleep(edge.LONG_POLL_ERROR_PAUSE_SECONDS)
            return self.view_answer(scope, error)
        return None

    def create_request(self, scope, body_file):
        """Django answers a query string that is not UTF-8 with a bare HTTP 400 (and a traceback in
        the log); the request is made without it instead, marked, for the view to answer in the
        API's envelope (QueueAPIView.params)."""
        query = scope.get("query_string", b"")
        if not query.isascii():
            try:
                query.decode()
            except UnicodeDecodeError as exc:
                request, error = super().create_request({**scope, "query_string": b""}, body_file)
                if request is not None:
                    request.query_string_error = f"query string is not valid utf-8 (byte {exc.start})"
                return request, error
        return super().create_request(scope, body_file)

    def load_middleware(self, is_async=False):
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)

    async def send_response(self, response, send):
        # Without it uvicorn chunks the answer, even to an HTTP/1.0 client, which knows no chunks (Django's
        # CommonMiddleware sets it on the other answers). None on a 204 or 304, which have no body.
        length = (() if response.streaming or response.status_code in NO_BODY_STATUSES
                  else ((b"Content-Length", b"%d" % len(response.content)),))

        async def send_with_answer_headers(message):
            # Added as bytes to the start message: through the response object each costs a send
            # more than the rest of its answer's headers.
            if message["type"] == "http.response.start":
                message["headers"] = [*message["headers"], *ANSWER_HEADERS, *length]
            await send(message)

        await super().send_response(response, send_with_answer_headers)

    async def refuse(self, scope, answer: HttpResponse, send) -> None:
        """An answer given without the body, through the edge's checks as any other answer: a bad
        Host or a cross-site request is refused as such, an allowed origin gets its CORS headers."""
        request, _error = self.create_request(scope, io.BytesIO())
        if request is not None:
            async def refusal(_request):
                return answer

            answer = await edge.guarded(request, refusal)
        await self.send_response(closing(answer), send)

    async def __call__(self, scope, receive, send):
        match = self.route(request_path_info(scope))
        refusal = await self.early_refusal(scope, match)
        if refusal is not None:
            await self.refuse(scope, refusal, send)
            return
        if not self.reads_body(scope, match):
            # Answered without its body: the connection is closed after it if one was announced.
            set_script_prefix(get_script_prefix(scope))
            request, error_response = self.create_request(scope, io.BytesIO())
            answer = error_response if request is None else await edge.guarded(request, self.get_response_async)
            await self.send_response(closing(answer) if announces_body(scope) else answer, send)
            return
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        except edge.BodyRefused as error:
            await self.refuse(scope, self.view_answer(scope, error), send)
            return
        try:
            set_script_prefix(get_script_prefix(scope))
            request, error_response = self.create_request(scope, body_file)
            if request is None:
                await self.send_response(error_response, send)
                return
            if not scope["path"].endswith(edge.HELD_PATHS):
                await self._respond(request, send)  # answered at once: no hang-up to watch for
                return
            # A client that hangs up cancels its request (a held long poll stops holding).
            respond = asyncio.ensure_future(self._respond(request, send))
            disconnect = asyncio.ensure_future(self.listen_for_disconnect(receive))
            await asyncio.wait({respond, disconnect}, return_when=asyncio.FIRST_COMPLETED)
            await cancel_and_wait(disconnect, respond)
            error = None if respond.cancelled() else respond.exception()
            if error is not None and not isinstance(error, RequestAborted):
                raise error
        finally:
            body_file.close()

    async def _respond(self, request, send):
        # Django's middleware would check the Host; here the edge does, and refuses other sites' pages.
        response = await edge.guarded(request, self.get_response_async)
        await self.send_response(response, send)
