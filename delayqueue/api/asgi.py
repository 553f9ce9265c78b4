"""An ASGI handler for the queue API that never leaves the event loop.

Django's own ASGIHandler runs every request inside a ThreadSensitiveContext and calls the
sync request_started / request_finished receivers (database housekeeping) and the sync
middleware through sync_to_async: a thread is started and joined per request, capping a
process at a few hundred requests per second. The queue API's views are async and never
use the ORM, so this handler serves them with no middleware and no signal receivers. The
admin and everything else keep Django's standard handler (see project/asgi.py).
"""
import asyncio
import io

from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.urls import set_script_prefix

from delayqueue.api import edge
from delayqueue.core.stopping import cancel_and_wait

# Requests that may be held open; only these watch for the client hanging up.
HELD_PATHS = ("/longPollingMsg",)


# The API's paths are fixed (no converters): each is resolved once, not by walking every
# pattern of the URLconf per request. Bounded, so unknown paths cannot grow it.
ROUTE_CACHE_SIZE = 64


def strip_token_prefix(scope: dict) -> None:
    """/t/<token>/rest -> /rest, with the token kept in scope["delayqueue.token"] (see api/auth.py).
    The scope is changed in place: uvicorn's access log reads this same dict, so it logs the
    path without the token."""
    token, _slash, rest = scope["path"][1:].partition("/")[2].partition("/")
    scope["delayqueue.token"] = token
    scope["path"] = "/" + rest
    raw = scope.get("raw_path")
    if raw:
        scope["raw_path"] = b"/" + raw[1:].partition(b"/")[2].partition(b"/")[2]


class EventLoopAPIHandler(ASGIHandler):
    def __init__(self):
        super().__init__()
        self._routes = {}

    def resolve_request(self, request):
        match = self._routes.get(request.path_info)
        if match is None:
            match = super().resolve_request(request)
            if not match.args and not match.kwargs and len(self._routes) < ROUTE_CACHE_SIZE:
                self._routes[request.path_info] = match
        request.resolver_match = match
        return match

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

    async def read_body(self, receive):
        """A body that came in one message (every queue call's) is read from memory; Django
        spools every body through a temporary-file object, which costs more than the parse."""
        first = await receive()
        if first["type"] == "http.request" and not first.get("more_body", False):
            return io.BytesIO(first.get("body", b""))
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return first

        return await super().read_body(replay)

    def load_middleware(self, is_async=False):
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)

    async def __call__(self, scope, receive, send):
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            set_script_prefix(get_script_prefix(scope))
            request, error_response = self.create_request(scope, body_file)
            if request is None:
                await self.send_response(error_response, send)
                return
            if not scope["path"].endswith(HELD_PATHS):
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
