"""Form bodies: parse_form gives what Django's QueryDict(body).dict() gives for a body valid in
its charset, and refuses one that is not (QueryDict would re-decode it as Latin-1 or put U+FFFD
in its place) or that repeats a field (QueryDict would keep the last value). JSON bodies: a key
given twice in an object is found, as reading the pairs one by one finds it."""
import json
import random
import re
from urllib.parse import unquote_to_bytes

import pytest
from django.http import QueryDict

import orjson

from delayqueue.api.parsers import FormError, parse_fields, parse_form, repeated_key

PIECES = ["topic", "msg", "delayMillis", "=", "==", "&", "&&", "+", "%20", "%2B", "%26", "%3D", "%", "%4", "%zz",
          "%e4%bd%a0", "%E4%BD", "%ff", "你好", "é", " ", "a", "12", "", "%00", "\u00ff"]


def random_body(rng: random.Random) -> bytes:
    text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))
    encoded = text.encode("utf-8")
    if rng.random() < 0.1:
        encoded += bytes([rng.choice([0xff, 0xe9, 0xc3])])  # not valid UTF-8
    return encoded


def valid_in(body: bytes, encoding: str) -> bool:
    """Whether the body, and each of its fields once percent-decoded, is text in `encoding`."""
    try:
        text = body.decode(encoding)
        for field in text.split("&"):
            for part in field.partition("="):
                unquote_to_bytes(part.replace("+", " ")).decode(encoding)
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("encoding", ["utf-8", "iso-8859-1"])
def test_parse_form_agrees_with_querydict_and_refuses_what_it_would_guess_at(encoding):
    rng = random.Random(7)
    refused = refused_repeats = 0
    for _ in range(5000):
        body = random_body(rng)
        if valid_in(body, encoding):
            fields = QueryDict(body, encoding=encoding)
            repeated = [name for name, values in fields.lists() if len(values) > 1]
            if repeated:
                refused_repeats += 1
                with pytest.raises(FormError, match="^(%s): given more than once in the request body$" % "|".join(
                        map(re.escape, repeated))):
                    parse_form(body, encoding)
            else:
                assert parse_form(body, encoding) == fields.dict(), body
        else:
            refused += 1
            with pytest.raises(FormError, match=f"not valid {encoding}|given more than once"):  # which comes first
                parse_form(body, encoding)
    # Every byte string is Latin-1; a tenth of the bodies, and more of the fields, are not UTF-8.
    assert refused == 0 if encoding == "iso-8859-1" else refused > 500
    assert refused_repeats > 5


def test_a_stray_byte_is_refused_not_read_as_latin1():
    order = "msg=订单".encode()
    assert parse_form(order, "utf-8") == {"msg": "订单"}
    with pytest.raises(FormError, match=r"^request body is not valid utf-8 \(byte 10\)$"):
        parse_form(order + b"\xff", "utf-8")


def test_a_percent_encoded_field_must_decode_in_the_charset():
    assert parse_form(b"topic=t&msg=%E8%AE%A2%E5%8D%95", "utf-8")["msg"] == "订单"
    with pytest.raises(FormError, match="^request body field msg is not valid utf-8 once percent-decoded$"):
        parse_form(b"topic=t&msg=%E8%AE%A2%E5", "utf-8")
    with pytest.raises(FormError, match="^query string has a field name that is not valid utf-8"):
        parse_fields("%ff=1", "utf-8")


def test_parse_form_refuses_too_many_fields(settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 3
    assert parse_form(b"a=1&b=2&c=3", "utf-8") == {"a": "1", "b": "2", "c": "3"}
    with pytest.raises(FormError, match="^request body has more than 3 fields$"):
        parse_form(b"a=1&b=2&c=3&d=4", "utf-8")
    with pytest.raises(FormError, match="^query string has more than 3 fields$"):
        parse_fields("a=1&b=2&c=3&d=4", "utf-8")


def test_a_repeated_field_is_refused_naming_it():
    for body, name in ((b"topic=a&topic=b", "topic"), (b"msgIds=m1&msg=x&msgIds=m2", "msgIds"), (b"a&b=2&a=", "a"),
                       (b"topic=a&t%6Fpic=a", "topic")):
        with pytest.raises(FormError, match=f"^{name}: given more than once in the request body$"):
            parse_form(body, "utf-8")
    with pytest.raises(FormError, match="^topic: given more than once in the query string$"):
        parse_fields("topic=a&topic=a", "utf-8")


JSON_KEYS = ["topic", "msg", "a:b", "t\\u003a", ":", "k"]
JSON_STRINGS = ['""', '"x"', '"a:b"', '"{\\"k\\": 1}"', '"\\u003a"', '"\\u003A:"', '"\\\\u003a"', '"你好:"']


def random_json(rng: random.Random, depth: int = 0) -> str:
    kind = rng.random()
    if depth < 3 and kind < 0.4:
        keys = [rng.choice(JSON_KEYS) for _ in range(rng.randint(0, 4))]
        return "{" + ", ".join(f'"{key}" {rng.choice(["", " "])}: {random_json(rng, depth + 1)}' for key in keys) + "}"
    if depth < 3 and kind < 0.6:
        return "[" + ",".join(random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))) + "]"
    return rng.choice(JSON_STRINGS + ["1", "-2.5", "true", "null"])


def first_repeated(text: str) -> str | None:
    found = []

    def pairs(items):
        keys = [key for key, _ in items]
        found.extend(key for i, key in enumerate(keys) if key in keys[:i])
        return dict(items)

    json.loads(text, object_pairs_hook=pairs)
    return found[0] if found else None


def test_a_json_key_given_twice_is_found_as_reading_pair_by_pair_finds_it():
    rng = random.Random(7)
    repeated = 0
    for _ in range(5000):
        text = random_json(rng)
        expected = first_repeated(text)
        repeated += expected is not None
        for given in (text, text.encode()):
            assert repeated_key(orjson.loads(given), given) == expected, text
    assert 500 < repeated < 4500
