"""Form bodies for the queue API, parsed without DRF's parser machinery."""
from urllib.parse import unquote_plus

from django.conf import settings

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
            fields[unquote_plus(name, encoding)] = unquote_plus(value, encoding)
    return fields
