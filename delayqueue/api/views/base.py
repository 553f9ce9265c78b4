"""The views' common ground: parameters parsed and validated, answers rendered, callers
authorized, errors worded."""
import asyncio

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.views import APIView

from delayqueue.api import edge, health_state
from delayqueue.api.auth import authorize
from delayqueue.api.edge import HELD_PATHS, body_too_big
from delayqueue.api.parsers import (FORM_CONTENT_TYPE, NAME_SHOWN, FormBodyParser, FormError, JSONBodyParser,
                                    StrictMultiPartParser, parse_fields, parse_form, repeated_field)
from delayqueue.api.validation import FastValidation, first_error
from delayqueue.core.constants import Scope
from delayqueue.core.exceptions import BadRequest, Refused, error_body
from delayqueue.runtime import current

# Parameters whose empty value is itself an answer (400, "generate an id", "push off"); any other
# empty parameter counts as absent, as Spring treats it. A JSON null is absent whatever the parameter.
KEEP_EMPTY = {"topic", "msg", "msgId", "pushUrl"}

# Permission classes that let everyone in: no check to run.
NOTHING_TO_PERMIT = ((), (AllowAny,))

# DRF's refusals of a caller that keep their own code: not authenticated, not allowed, throttled.
CALLER_REFUSALS = (401, 403, 429)

_parsers: dict[type, tuple] = {}


def parse(serializer_class, data: dict) -> dict:
    """Validates request parameters: the serializer's fast path for the well-formed common case,
    the serializer itself for the rest (and for every error message). One serializer instance per
    class is reused: validation keeps no state on the instance, and building one per request (DRF
    deep-copies every field) costs more than the rest of a send."""
    parser = _parsers.get(serializer_class)
    if parser is None:
        serializer = serializer_class()
        parser = _parsers[serializer_class] = (serializer, FastValidation(serializer))
    validated = parser[1](data)
    if validated is not None:
        return validated
    try:
        return parser[0].run_validation(data)
    except ValidationError as exc:
        raise BadRequest(first_error(exc.detail)) from None


def given(params: dict) -> dict:
    """The parameters given: an empty one (but KEEP_EMPTY's) and a JSON null count as absent."""
    return {k: v for k, v in params.items() if v is not None and (v != "" or k in KEEP_EMPTY)}


def reply(code: int = 200, msg: str = "success", **payload) -> HttpResponse:
    """The API speaks JSON only, so it renders directly instead of through DRF's content
    negotiation and template response (which Django would render via a thread hop)."""
    return HttpResponse(orjson.dumps({"code": code, "msg": msg, **payload}), content_type="application/json")


class QueueAPIView(APIView):
    """An async DRF view: serializers validate the parameters, `reply` renders JSON. Form bodies
    (every call of camellia's SDK) and query strings are read from Django's request; DRF's
    Request and parsers are built only for a JSON or multipart body (`body_data`), or when the
    view has authentication, permission or throttle checks to run (`checks_callers`)."""

    http_method_names = ["get", "post"]
    parser_classes = [FormBodyParser, JSONBodyParser, StrictMultiPartParser]  # form bodies: see params()
    # Message operations count as use for /camellia/health/offline; monitor reads do not.
    marks_use = True
    # The scope a token needs (DELAYQUEUE_AUTH=tokens); None: open to anyone.
    needs_scope: Scope | tuple[Scope, ...] | None = None  # a tuple: any one of them

    # Parsers and the negotiator keep no per-request state: build them once, not per request.
    _parsers = None
    _negotiator = None

    def get_parsers(self):
        if QueueAPIView._parsers is None:
            QueueAPIView._parsers = super().get_parsers()
        return QueueAPIView._parsers

    def get_content_negotiator(self):
        if QueueAPIView._negotiator is None:
            QueueAPIView._negotiator = super().get_content_negotiator()
        return QueueAPIView._negotiator

    def checks_callers(self) -> bool:
        """Whether DRF's authentication, permission or throttle checks have anything to do. Only
        then is DRF's Request built before the view runs: for a form body it costs more than the
        rest of a send."""
        return bool(self.authentication_classes or self.throttle_classes) or (
            tuple(self.permission_classes) not in NOTHING_TO_PERMIT)

    async def dispatch(self, request, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.request = request  # Django's: see body_data()
        self.drf_request = None
        try:
            if request.method.lower() not in self.http_method_names:
                raise drf_exceptions.MethodNotAllowed(request.method)
            if self.checks_callers():
                self.drf_request = self.initialize_request(request, *args, **kwargs)
                self.initial(self.drf_request, *args, **kwargs)  # authenticates, checks permissions and throttles
            root = current()  # once: each asyncio.get_running_loop() is a getpid() system call
            self.rt = root
            await self.authorize_caller(root, request)
            if self.marks_use:
                health_state.mark_use(root)  # host-wide
            return await self.handle()
        except Exception as exc:
            if request.path_info.endswith(HELD_PATHS):  # a long poll (bad parameter, scope, cap, store down)
                await asyncio.sleep(edge.LONG_POLL_ERROR_PAUSE_SECONDS)
            return self.handle_exception(exc)

    async def authorize_caller(self, root, request) -> None:
        """Refuses a caller without `needs_scope` (DELAYQUEUE_AUTH=tokens), and makes the view work
        in its token's namespace."""
        if self.needs_scope is not None and root.config.auth == "tokens":
            self.rt = root.for_namespace(await authorize(root, request, self.needs_scope))
    async def holds(self, scope: Scope) -> bool:
        """Whether the caller's token has `scope` too (with DELAYQUEUE_AUTH=open anyone has every one)."""
        root = current()
        if root.config.auth != "tokens":
            return True
        try:
            await authorize(root, self.request, scope)
        except Refused:
            return False
        return True

    def handle_exception(self, exc):
        return reply(**error_body(self.queue_error(exc), type(self).__name__))

    def queue_error(self, exc: Exception) -> Exception:
        """Problems of the HTTP request itself as the queue's error kinds; error_answer words them all."""
        if isinstance(exc, RequestDataTooBig):
            return body_too_big()  # Django's check of Content-Length; api/asgi.py counts chunked bodies
        if isinstance(exc, TooManyFieldsSent):  # Django's own parse (request.GET, multipart) met the limit
            return BadRequest(f"request has more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} fields")
        if isinstance(exc, TooManyFilesSent):  # Django's multipart parse met the limit
            return BadRequest(f"request has more than {settings.DATA_UPLOAD_MAX_NUMBER_FILES} files")
        if isinstance(exc, drf_exceptions.MethodNotAllowed):
            return BadRequest(f"method {self.request.method} not allowed, use GET or POST")
        if isinstance(exc, drf_exceptions.APIException):
            if exc.status_code in CALLER_REFUSALS:
                return Refused(first_error(exc.detail), exc.status_code)
            return BadRequest(f"bad request: {first_error(exc.detail)}")
        return exc

    def body_data(self):
        """A JSON or multipart body, parsed by DRF (its Request costs more than a form's parse)."""
        self.charset()
        if self.drf_request is None:
            self.drf_request = self.initialize_request(self.request, *self.args, **self.kwargs)
        return self.drf_request.data

    def charset(self) -> str:
        """The request's charset (UTF-8 if none). Python's rot13, hex or base64 pass Django's check of
        the name (codecs.lookup), then fail every decode with LookupError: refused as no text encoding."""
        encoding = self.request.encoding
        if encoding is None:
            return settings.DEFAULT_CHARSET
        try:
            b"a".decode(encoding)  # not b"": decoding nothing is not checked
        except LookupError:
            raise BadRequest(f"charset {encoding} is not a text encoding") from None
        except UnicodeDecodeError:
            pass  # a text encoding of more than a byte a character (utf-16)
        return encoding

    def params(self) -> dict:
        """Query string and body (form or JSON object) merged. A name in both is refused, as one given
        twice in either is: Spring would join the two values."""
        request = self.request
        if query_string_error := getattr(request, "query_string_error", None):  # see api/asgi.py
            raise BadRequest(query_string_error)
        encoding = self.charset()
        query = request.META.get("QUERY_STRING")
        try:
            # As request.GET.dict(), but refusing what it would guess at (see parsers.py), and cheaper.
            params = parse_fields(query, encoding) if query else {}
            data = parse_form(request.body, encoding) if request.content_type == FORM_CONTENT_TYPE else None
        except FormError as exc:
            raise BadRequest(str(exc)) from None
        if data is None:
            data = self.body_data()
            if hasattr(data, "dict"):  # multipart
                name = next((name for name, values in data.lists() if len(values) > 1), None)
                if name is not None:
                    raise BadRequest(repeated_field(name, "request body"))
                data = data.dict()
            if not isinstance(data, dict):
                raise BadRequest("request body must be form fields or a JSON object")
        if both := next((name for name in data if name in params), None):
            raise BadRequest(f"{both[:NAME_SHOWN]}: given in both the query string and the request body")
        params.update(data)
        return given(params)

    def validated(self, serializer_class) -> dict:
        return parse(serializer_class, self.params())

    def validated_fully(self, serializer_class) -> dict:
        """As validated(), by the serializer alone: for parameters the fast path does not take
        (a JSON list of msgIds), on endpoints that are not hot."""
        try:
            return serializer_class().run_validation(self.params())
        except ValidationError as exc:
            raise BadRequest(first_error(exc.detail)) from None

    # Declared async so Django treats the view as async; dispatch() calls handle() for both.
    async def get(self, request, *args, **kwargs):
        return await self.handle()

    async def post(self, request, *args, **kwargs):
        return await self.handle()

    async def handle(self) -> HttpResponse:
        raise NotImplementedError
