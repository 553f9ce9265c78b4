"""The SDK's verify_signature for push receivers, and docs/push.md's standard-library recipe, against
signatures made here with hmac and hashlib as the contract says: lowercase hex HMAC-SHA256, key the
secret's UTF-8 bytes, message "<t>." followed by the raw body. No server."""
import hashlib
import hmac
import re
import time
from pathlib import Path

import pytest
from delayqueue_client import InvalidSignature, verify_signature

ROOT = Path(__file__).resolve().parents[2]
SECRET = "dqps_" + "A" * 43
OLD_SECRET = "dqps_" + "b-_" * 14 + "c"
NOW = 1_764_000_030_500
BODY = (b'{"topic":"orders","msgId":"m1","msg":"cancel order 42 \xe2\x82\xac","produceTime":1764000000000,'
        b'"triggerTime":1764000030000,"expireTime":1764003630000,"maxRetry":10,"retry":1,"status":3}')


def sign(secret: str, t: int | str, body: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), str(t).encode("ascii") + b"." + body, hashlib.sha256).hexdigest()


def header(t: int, *secrets: str, body: bytes = BODY) -> str:
    return f"t={t}," + ",".join(f"v1={sign(s, t, body)}" for s in secrets)


def verify(secret, headers, body=BODY, **kw):
    kw.setdefault("now_ms", NOW)
    return verify_signature(secret, headers, body, **kw)


def test_invalid_signature_is_a_value_error():
    assert issubclass(InvalidSignature, ValueError)


@pytest.mark.parametrize("name", ["DelayQueue-Signature", "delayqueue-signature", "DELAYQUEUE-SIGNATURE",
                                  "Delayqueue-Signature", "HTTP_DELAYQUEUE_SIGNATURE"])
def test_a_valid_signature_passes_whatever_the_header_names_case(name):
    headers = {"Content-Type": "application/json", "DelayQueue-Msg-Id": "m1", name: header(NOW, SECRET)}
    assert verify(SECRET, headers) is None


def test_a_str_body_is_encoded_as_utf8():
    assert verify(SECRET, {"DelayQueue-Signature": header(NOW, SECRET)}, BODY.decode("utf-8")) is None


def test_bytes_header_pairs_as_in_an_asgi_scope():
    pairs = [(b"content-type", b"application/json"), (b"delayqueue-signature", header(NOW, SECRET).encode())]
    assert verify(SECRET, pairs) is None


def test_now_defaults_to_the_current_time():
    now = time.time_ns() // 1_000_000
    verify_signature(SECRET, {"DelayQueue-Signature": header(now, SECRET)}, BODY)
    with pytest.raises(InvalidSignature):
        verify_signature(SECRET, {"DelayQueue-Signature": header(now - 400_000, SECRET)}, BODY)


@pytest.mark.parametrize("secret", [SECRET, OLD_SECRET, [SECRET], [OLD_SECRET], [SECRET, OLD_SECRET],
                                    (OLD_SECRET, SECRET), {SECRET}])
def test_a_rotation_header_with_two_v1_passes_with_either_secret_or_both(secret):
    value = header(NOW, SECRET, OLD_SECRET)
    assert value.count("v1=") == 2
    assert verify(secret, {"DelayQueue-Signature": value}) is None


def test_a_list_of_secrets_passes_when_any_one_signed():
    assert verify(["dqps_other", OLD_SECRET], {"DelayQueue-Signature": header(NOW, OLD_SECRET)}) is None


def test_spaces_around_elements_are_allowed():
    value = f"t={NOW}, v1={sign(SECRET, NOW, BODY)}"
    assert verify(SECRET, {"DelayQueue-Signature": value}) is None


def test_other_keys_in_the_header_are_ignored():
    value = f"t={NOW},v2=abcdef,v1={sign(SECRET, NOW, BODY)}"
    assert verify(SECRET, {"DelayQueue-Signature": value}) is None


@pytest.mark.parametrize("body", [BODY.replace(b"42", b"43"), BODY + b" ", BODY + b"\n", b"", BODY[:-1]])
def test_a_tampered_body_fails(body):
    with pytest.raises(InvalidSignature, match="no v1 signature .* matches"):
        verify(SECRET, {"DelayQueue-Signature": header(NOW, SECRET)}, body)


def test_a_wrong_secret_fails():
    with pytest.raises(InvalidSignature, match="matches the secret"):
        verify("dqps_" + "Z" * 43, {"DelayQueue-Signature": header(NOW, SECRET)})
    with pytest.raises(InvalidSignature, match="matches the secrets"):
        verify(["dqps_x", "dqps_y"], {"DelayQueue-Signature": header(NOW, SECRET)})


def test_a_changed_timestamp_breaks_the_signature():
    value = f"t={NOW + 1},v1={sign(SECRET, NOW, BODY)}"
    with pytest.raises(InvalidSignature, match="matches"):
        verify(SECRET, {"DelayQueue-Signature": value})


def test_an_uppercase_signature_still_compares_equal():
    value = f"t={NOW},v1={sign(SECRET, NOW, BODY).upper()}"
    assert verify(SECRET, {"DelayQueue-Signature": value}) is None


def test_a_non_ascii_v1_fails_as_invalid_not_with_a_type_error():
    with pytest.raises(InvalidSignature):
        verify(SECRET, {"DelayQueue-Signature": f"t={NOW},v1=\u00e9\u00e9"})


@pytest.mark.parametrize("offset,within", [(-300_000, True), (300_000, True), (-299_999, True), (0, True),
                                           (-300_001, False), (300_001, False), (-3_600_000, False),
                                           (86_400_000, False)])
def test_the_timestamp_must_be_within_the_tolerance_either_way(offset, within):
    t = NOW + offset
    headers = {"DelayQueue-Signature": header(t, SECRET)}
    if within:
        assert verify(SECRET, headers) is None
    elif offset < 0:
        with pytest.raises(InvalidSignature, match=rf"t={t} is {-offset} ms ago, beyond the tolerance of 300000 ms"):
            verify(SECRET, headers)
    else:
        with pytest.raises(InvalidSignature, match=rf"t={t} is {offset} ms in the future, beyond the tolerance"):
            verify(SECRET, headers)


def test_the_tolerance_is_a_parameter():
    headers = {"DelayQueue-Signature": header(NOW - 10_000, SECRET)}
    assert verify(SECRET, headers, tolerance_ms=10_000) is None
    with pytest.raises(InvalidSignature, match="tolerance of 9999 ms"):
        verify(SECRET, headers, tolerance_ms=9_999)


@pytest.mark.parametrize("headers", [{}, {"Content-Type": "application/json"}, {"DelayQueue-Signature-2": "t=1,v1=a"},
                                     {"X-DelayQueue-Signature": header(NOW, SECRET)}])
def test_a_missing_header_fails(headers):
    with pytest.raises(InvalidSignature, match="^no DelayQueue-Signature header$"):
        verify(SECRET, headers)


@pytest.mark.parametrize("value,problem", [
    ("", "is not key=value"),
    (f"v1={'a' * 64}", "no t="),
    (f"t={NOW}", "no v1="),
    (f"t={NOW},v1", "is not key=value"),
    (f"t=,v1={'a' * 64}", "is not an integer"),
    (f"t=abc,v1={'a' * 64}", "is not an integer"),
    (f"t=1.5,v1={'a' * 64}", "is not an integer"),
    (f"t=-5,v1={'a' * 64}", "is not an integer"),
    (f"t=\u00b2,v1={'a' * 64}", "is not an integer"),
    (f"t={NOW},t={NOW},v1={'a' * 64}", "more than one t="),
    (f"ts={NOW},v1={'a' * 64}", "no t="),
])
def test_a_malformed_header_fails_naming_the_problem(value, problem):
    with pytest.raises(InvalidSignature, match=f"^malformed DelayQueue-Signature header: .*{re.escape(problem)}"):
        verify(SECRET, {"DelayQueue-Signature": value})


def test_a_malformed_header_is_refused_even_with_a_valid_v1():
    value = f"t=soon,v1={sign(SECRET, 'soon', BODY)}"
    with pytest.raises(InvalidSignature, match="is not an integer"):
        verify(SECRET, {"DelayQueue-Signature": value})


@pytest.mark.parametrize("secret,error", [("", ValueError), ([], ValueError), ([SECRET, ""], ValueError),
                                          (None, TypeError), ([1], TypeError)])
def test_no_usable_secret_is_a_programming_error_not_an_invalid_signature(secret, error):
    with pytest.raises(error) as raised:
        verify(secret, {"DelayQueue-Signature": header(NOW, SECRET)})
    assert not isinstance(raised.value, InvalidSignature)


def test_a_body_of_another_type_is_a_type_error():
    with pytest.raises(TypeError, match="raw request body"):
        verify(SECRET, {"DelayQueue-Signature": header(NOW, SECRET)}, {"topic": "orders"})


# docs/push.md's standard-library recipe: the python block right after the line <!-- recipe -->.

def recipe_verify():
    text = (ROOT / "docs" / "push.md").read_text()
    found = re.findall(r"^<!-- recipe -->\n```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert len(found) == 1, "one python block right after <!-- recipe --> in docs/push.md"
    code = found[0]
    lines = [line for line in code.splitlines() if line.strip()]
    assert len(lines) <= 10, f"the recipe is {len(lines)} lines, the page promises at most 10"
    namespace: dict = {}
    exec(compile(code, "docs/push.md recipe", "exec"), namespace)
    return namespace["verify"]


def test_the_docs_recipe_accepts_a_good_signature_and_rejects_bad_ones():
    verify_recipe = recipe_verify()
    now = time.time_ns() // 1_000_000
    good = {"DelayQueue-Signature": header(now, SECRET)}
    assert verify_recipe(SECRET, good, BODY) is True
    assert verify_recipe(SECRET, {"delayqueue-signature": header(now, SECRET)}, BODY) is True
    assert verify_recipe(OLD_SECRET, {"DelayQueue-Signature": header(now, SECRET, OLD_SECRET)}, BODY) is True
    assert verify_recipe(SECRET, good, BODY.replace(b"42", b"43")) is False
    assert verify_recipe("dqps_wrong", good, BODY) is False
    assert verify_recipe(SECRET, {"DelayQueue-Signature": header(now - 400_000, SECRET)}, BODY) is False
    assert verify_recipe(SECRET, {"DelayQueue-Signature": header(now + 400_000, SECRET)}, BODY) is False
    assert verify_recipe(SECRET, {}, BODY) is False
    assert verify_recipe(SECRET, {"DelayQueue-Signature": "t=x,v1=y"}, BODY) is False
    assert verify_recipe(SECRET, {"DelayQueue-Signature": f"t={now},v1=\u00e9"}, BODY) is False
