"""Request bodies and query strings for the queue API: form fields without DRF's parser machinery,
JSON through DRF with a faster decoder, multipart through DRF. Text that is not valid in its
charset is refused, never guessed at: a silently re-decoded body stores mojibake."""
import io
import json
from urllib.parse import unquote_plus

import orjson
from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser, JSONParser, MultiPartParser

from delayqueue.core.exceptions import BadRequest

FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"

# Enough of a field name to recognise it in an error answer.
NAME_SHOWN = 64


class FormError(ValueError):
    """Form fields (a body or a query string) that cannot be read; the text says why."""


def parse_form(body: bytes, encoding: str, what: str = "request body") -> dict[str, str]:
    """A form body as a plain dict: what Django's QueryDict(body).dict() gives for a body valid in
    its charset with no field repeated (tests/unit/test_parsers.py holds it to that), at a fifth
    of the cost. Camellia's SDK sends every call as a form, so this is most requests' parse.
    Unlike QueryDict, a body (or a percent-encoded field) not valid in `encoding` is a FormError,
    not Latin-1 or U+FFFD, and so is a repeated field (repeated_field)."""
    try:
        text = body.decode(encoding)
    except UnicodeDecodeError as exc:
        raise FormError(f"{what} is not valid {encoding} (byte {exc.start})") from None
    return parse_fields(text, encoding, what)


def parse_fields(text: str, encoding: str, what: str = "query string") -> dict[str, str]:
    """parse_form of text already decoded (a query string): percent-escapes decode in `encoding`."""
    limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
    if limit is not None and text.count("&") >= limit:
        raise FormError(f"{what} has more than {limit} fields")
    fields = {}
    for field in text.split("&"):
        if field:
            name, _, value = field.partition("=")
            if "%" in field or "+" in field:  # most fields of a send have nothing to unquote
                try:
                    name = unquote_plus(name, encoding, errors="strict")
                except UnicodeDecodeError:
                    raise FormError(f"{what} has a field name that is not valid {encoding} once "
                                    "percent-decoded") from None
                try:
                    value = unquote_plus(value, encoding, errors="strict")
                except UnicodeDecodeError:
                    raise FormError(f"{what} field {name[:NAME_SHOWN]} is not valid {encoding} once "
                                    "percent-decoded") from None
            if name in fields:
                raise FormError(repeated_field(name, what))
            fields[name] = value
    return fields


def repeated_field(name: str, what: str) -> str:
    """Why a parameter given twice is refused: which value the client meant would be a guess
    (QueryDict keeps the last, Spring joins them with ","). No parameter is a list in a form."""
    return f"{name[:NAME_SHOWN]}: given more than once in the {what}"


def _encoding(parser_context) -> str:
    return (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET


class FormBodyParser(BaseParser):
    """DRF's place for parse_form (a form body read through DRF: sendMsgBatch's)."""

    media_type = FORM_CONTENT_TYPE

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return parse_form(stream.read() if stream is not None else b"", _encoding(parser_context))
        except FormError as exc:
            raise ParseError(str(exc)) from None


def repeated_key(decoded, text: bytes | str) -> str | None:
    """A key given twice in one object of the JSON `text` (orjson keeps the last), or None. Outside
    its strings a JSON text has one ':' a key, so when `text` has as many as `decoded` has keys and
    ':' in its strings, none was dropped; only otherwise (a key given twice, or a ':' escaped as
    \\u003a) is `text` read again, pair by pair. ValueError: too deep to read again (no API body is)."""
    colon, escaped = (b":", b"\\u003") if isinstance(text, bytes) else (":", "\\u003")
    expected, stack = 0, [[decoded]]
    while stack:  # not recursion: orjson takes nesting deeper than Python's recursion limit
        for value in stack.pop():
            kind = type(value)
            if kind is str:
                expected += value.count(":")
            elif kind is dict:
                expected += len(value) + "".join(value).count(":")  # a ':' a key, and those in its keys
                stack.append(value.values())
            elif kind is list:
                stack.append(value)
    if text.count(colon) == expected and escaped not in text:
        return None

    def pairs(items):
        keys = set()
        for key, _ in items:
            if key in keys:
                raise KeyError(key)
            keys.add(key)
        return None

    try:
        json.loads(text, object_pairs_hook=pairs)
    except KeyError as exc:
        return exc.args[0]
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return None


class JSONBodyParser(JSONParser):
    """DRF's JSON parser, decoding with orjson (as strict: no NaN or Infinity), refusing a key
    given twice in an object (as a form's field given twice is refused)."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = _encoding(parser_context)
        body = stream.read()
        text = body if encoding.lower().replace("_", "-") == "utf-8" else None
        try:
            if text is None:
                text = body.decode(encoding)
            decoded = orjson.loads(text)
        except UnicodeDecodeError as exc:
            raise ParseError(f"request body is not valid {encoding} (byte {exc.start})") from None
        except ValueError as exc:
            try:  # orjson's words for bad UTF-8 name neither the body nor the byte
                body.decode("utf-8")
            except UnicodeDecodeError as bad:
                raise ParseError(f"request body is not valid {encoding} (byte {bad.start})") from None
            raise ParseError(f"JSON parse error - {exc}") from None
        try:
            name = repeated_key(decoded, text)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        if name is not None:  # BadRequest, not ParseError: worded as a form's field given twice
            raise BadRequest(repeated_field(name, "request body"))
        return decoded


class StrictMultiPartParser(MultiPartParser):
    """DRF's multipart parser, refusing a body not valid in its charset: Django's replaces bad
    bytes in field values with U+FFFD. The body is checked only when a value holds U+FFFD."""

    def parse(self, stream, media_type=None, parser_context=None):
        body = stream.read() if stream is not None else b""
        parsed = super().parse(io.BytesIO(body), media_type, parser_context)
        if any("\ufffd" in key or "\ufffd" in value for key, values in parsed.data.lists() for value in values):
            encoding = _encoding(parser_context)
            try:
                body.decode(encoding)
            except UnicodeDecodeError as exc:
                raise ParseError(f"request body is not valid {encoding} (byte {exc.start})") from None
        return parsed
