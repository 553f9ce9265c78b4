"""Form bodies: parse_form gives what Django's QueryDict(body).dict() gives."""
import random

import pytest
from django.http import QueryDict

from delayqueue.api.parsers import TooManyFields, parse_form

PIECES = ["topic", "msg", "delayMillis", "=", "==", "&", "&&", "+", "%20", "%2B", "%26", "%3D", "%", "%4", "%zz",
          "%e4%bd%a0", "%E4%BD", "你好", "é", " ", "a", "12", "", "%00", "\u00ff"]


def random_body(rng: random.Random) -> bytes:
    text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))
    encoded = text.encode("utf-8")
    if rng.random() < 0.1:
        encoded += bytes([rng.choice([0xff, 0xe9, 0xc3])])  # not valid UTF-8
    return encoded


@pytest.mark.parametrize("encoding", ["utf-8", "iso-8859-1"])
def test_parse_form_agrees_with_querydict(encoding):
    rng = random.Random(7)
    for _ in range(5000):
        body = random_body(rng)
        assert parse_form(body, encoding) == QueryDict(body, encoding=encoding).dict(), body


def test_parse_form_refuses_too_many_fields(settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 3
    assert parse_form(b"a=1&b=2&c=3", "utf-8") == {"a": "1", "b": "2", "c": "3"}
    with pytest.raises(TooManyFields):
        parse_form(b"a=1&b=2&c=3&d=4", "utf-8")
