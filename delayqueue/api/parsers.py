"""Request bodies for the queue API: form bodies without DRF's parser machinery, JSON through
DRF with a faster decoder."""
from urllib.parse import unquote_plus

import orjson
from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"


class TooManyFields(ValueError):
    pass


def parse_form(body: bytes, encoding: str) -> dict[str, str]:
    """A form body as a plain dict, the last value of a repeated field winning: what Django's
    QueryDict(body).dict() gives (tests/test_parsers.py holds it to that), at a fifth of the cost.
    Camellia's SDK sends every call as a form, so this is most requests' parse."""
    try:
        text = body.decode(encoding)
    except UnicodeDecodeError:
        text = body.decode("iso-8859-1")  # as QueryDict: some clients send Latin-1 unannounced
    limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
    if limit is not None and text.count("&") >= limit:
        raise TooManyFields(f"more than {limit} form fields")
    fields = {}
    for field in text.split("&"):
        if field:
            name, _, value = field.partition("=")
            if "%" in field or "+" in field:  # most fields of a send have nothing to unquote
                name, value = unquote_plus(name, encoding), unquote_plus(value, encoding)
            fields[name] = value
    return fields


class JSONBodyParser(JSONParser):
    """DRF's JSON parser, decoding with orjson (as strict: no NaN or Infinity)."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        body = stream.read()
        try:
            return orjson.loads(body if encoding.lower().replace("_", "-") == "utf-8" else body.decode(encoding))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
