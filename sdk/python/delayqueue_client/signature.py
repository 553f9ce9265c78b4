"""Checks the DelayQueue-Signature header of a push delivery (docs/push.md). Standard library only."""
import hashlib
import hmac
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

HEADER = "DelayQueue-Signature"
_NAMES = {"delayqueue-signature", "http-delayqueue-signature"}  # any case; WSGI's HTTP_DELAYQUEUE_SIGNATURE
_DIGITS = re.compile(r"[0-9]{1,18}")
# A mapping looked up without regard to case, or (name, value) pairs; str or bytes.
Headers = Mapping[Any, Any] | Iterable[tuple[Any, Any]]


class InvalidSignature(ValueError):
    """A push delivery whose DelayQueue-Signature header is missing, malformed, too old or too new, or
    matches none of the secrets. Answer it with a non-2xx status (e.g. 401)."""


def verify_signature(secret: str | Iterable[str], headers: Headers, body: bytes | str, *, tolerance_ms: int = 300_000,
                     now_ms: int | None = None) -> None:
    """Returns if `body` carries a valid DelayQueue-Signature; raises InvalidSignature otherwise.

    `secret`: the topic's push secret, or several (the new and the old one during a rotation).
    `headers`: the request's headers, a mapping looked up without regard to case (Django's
    request.headers, a plain dict, a WSGI environ's HTTP_DELAYQUEUE_SIGNATURE) or (name, value)
    pairs as in an ASGI scope; str or bytes. `body`: the raw body as received (str is encoded as UTF-8).

    Checks, in this order: the header is there; it has one `t=` (epoch milliseconds, digits only)
    and at least one `v1=`; one of the `v1=` values is the lowercase hex HMAC-SHA256 of
    `<t>.` + body under one of the secrets (compared in constant time); `t` is at most
    `tolerance_ms` from `now_ms` (default: the current time), before or after. Elements with other
    keys are ignored.
    """
    secrets = _secrets(secret)
    if isinstance(body, str):
        body = body.encode()
    elif isinstance(body, (bytearray, memoryview)):
        body = bytes(body)
    elif not isinstance(body, bytes):
        raise TypeError(f"body must be bytes (the raw request body), not {type(body).__name__}")
    value = _header(headers)
    if value is None:
        raise InvalidSignature(f"no {HEADER} header")
    t, signatures = _parse(value)
    signed = t.encode() + b"." + body
    expected = [hmac.new(key, signed, hashlib.sha256).hexdigest().encode() for key in secrets]
    # every pair is compared, so the time taken does not tell which one matched
    matched = False
    for candidate in signatures:
        for digest in expected:
            matched |= hmac.compare_digest(digest, candidate)
    if not matched:
        raise InvalidSignature(f"no v1 signature in the {HEADER} header matches the secret"
                               f"{'s' if len(secrets) > 1 else ''}: a wrong secret, or a body changed on the way"
                               " (verify the raw body bytes as received, before any parsing)")
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    age = now - int(t)
    if abs(age) > tolerance_ms:
        when = f"{age} ms ago" if age > 0 else f"{-age} ms in the future"
        raise InvalidSignature(f"{HEADER} timestamp t={t} is {when}, beyond the tolerance of {tolerance_ms} ms"
                               " (a replayed delivery, or a clock off)")


def _secrets(secret: str | bytes | Iterable[str | bytes]) -> list[bytes]:
    items = [secret] if isinstance(secret, (str, bytes)) else list(secret)
    if not items:
        raise ValueError("no push secret given")
    keys = []
    for item in items:
        if not isinstance(item, (str, bytes)):
            raise TypeError(f"a push secret must be str, not {type(item).__name__}")
        if not item:
            raise ValueError("empty push secret (is the variable holding it set?)")
        keys.append(item.encode() if isinstance(item, str) else item)
    return keys


def _text(value: object) -> str:
    return value.decode("latin-1") if isinstance(value, (bytes, bytearray)) else str(value)


def _header(headers: Headers) -> str | None:
    pairs = headers.items() if hasattr(headers, "items") else headers
    for name, value in pairs:
        if _text(name).strip().lower().replace("_", "-") in _NAMES:
            return _text(value)
    return None


def _show(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _parse(value: str) -> tuple[str, list[bytes]]:
    t = None
    signatures = []
    for element in value.split(","):
        key, sep, item = element.strip().partition("=")
        if not sep:
            raise InvalidSignature(f"malformed {HEADER} header: {_show(element.strip())} is not key=value")
        key, item = key.strip(), item.strip()
        if key == "t":
            if t is not None:
                raise InvalidSignature(f"malformed {HEADER} header: more than one t=")
            if not _DIGITS.fullmatch(item):
                raise InvalidSignature(f"malformed {HEADER} header: t={_show(item)} is not an integer"
                                       " (epoch milliseconds)")
            t = item
        elif key == "v1":
            signatures.append(item.lower().encode("utf-8", "replace"))
    if t is None:
        raise InvalidSignature(f"malformed {HEADER} header: no t= (the signing time)")
    if not signatures:
        raise InvalidSignature(f"malformed {HEADER} header: no v1= (the signature)")
    return t, signatures
