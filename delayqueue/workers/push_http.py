"""The pushers' HTTP side: a push's signed request, and the keep-alive connections it goes over.

One aiohttp session per origin (scheme, host, port), shared by every topic pushing there, with
no connection limit of its own (each topic's pushConcurrency bounds what it holds, so a hanging
endpoint holds only its own topics' slots) and no timeouts of its own (an attempt's whole time
limit is its topic's pushTimeoutMillis). Its resolver refuses addresses DELAYQUEUE_PUSH_ALLOWED_HOSTS
does not allow, where the connection is made."""
import asyncio
import hashlib
import hmac
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver

from delayqueue.config.push_hosts import HostPolicy, resolved_addresses
from delayqueue.core.messages import Message

ANSWER_LIMIT_BYTES = 4096  # of an answer, read and dropped (a connection is reused only once it is read)
ENDPOINT_IDLE_SECONDS = 60.0  # an endpoint's connections are closed after this long unused
# The name lookups under way at once in a process, for every namespace's pushers (apart from the
# loop's default executor), and of those, for one namespace's (one PushClient). A lookup runs on
# until the system resolver gives up, whatever its attempt's time limit: a namespace's names that
# never answer hold its share of the threads, the other namespaces' lookups go on.
DNS_THREADS = 64
DNS_THREADS_PER_CLIENT = 16
_DNS = ThreadPoolExecutor(DNS_THREADS, thread_name_prefix="push-dns")  # threads started as lookups need them

# Header values are ASCII: a topic or msgId with other characters (or a '%') goes percent-encoded
# as UTF-8, and one of printable ASCII goes as it is, but for spaces at either end, which HTTP
# drops from a header value: they go as %20 (" orders " is another topic than "orders").
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")
_END_SPACES = re.compile("^ +| +$")



def header_value(text: str) -> str:
    return _END_SPACES.sub(lambda spaces: "%20" * len(spaces[0]), quote(text, safe=_HEADER_SAFE))



def signature_header(secrets: list[str], at_millis: int, body: bytes) -> str:
    """`t=<ms>,v1=<hex>` with one v1 per secret: HMAC-SHA256 of "<t>." and the body."""
    signed = f"{at_millis}.".encode() + body
    return ",".join([f"t={at_millis}", *(f"v1={hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()}"
                                        for secret in secrets)])



def push_headers(message: Message, secrets: list[str], signed_at: int, body: bytes) -> dict[str, str]:
    """A push's headers: its topic, msgId and deliveries so far, and its signature (docs/push.md)."""
    return {"Content-Type": "application/json", "DelayQueue-Topic": header_value(message.topic),
            "DelayQueue-Msg-Id": header_value(message.msg_id), "DelayQueue-Retry": str(message.retry),
            "DelayQueue-Signature": signature_header(secrets, signed_at, body)}


class RefusedAddress(OSError):
    """A push URL's host resolved to an address DELAYQUEUE_PUSH_ALLOWED_HOSTS does not allow."""



class _AllowedResolver(AbstractResolver):
    """Resolves as the system does, then refuses addresses the policy does not allow: checked
    where the connection is made, so a name cannot be pointed elsewhere after it was set.
    Lookups run on the pushers' own threads (_DNS), at most `slots` at once: a receiver's DNS that
    never answers ties up one of those (aiohttp looks a name up once at a time), not the loop's,
    which the scanner needs."""

    def __init__(self, policy: HostPolicy, slots: asyncio.Semaphore):
        self._policy = policy
        self._slots = slots

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict]:
        async with self._slots:
            addresses = await resolved_addresses(host, port, _DNS)
        found = []
        for address, address_family in addresses:
            problem = self._policy.address_problem(address)
            if problem is not None:
                raise RefusedAddress(f"{host} {problem}")
            found.append({"hostname": host, "host": str(address), "port": port, "family": address_family,
                          "proto": 0, "flags": socket.AI_NUMERICHOST})
        return found

    async def close(self) -> None:
        pass



@dataclass
class _Endpoint:
    """The keep-alive connections to one origin (scheme, host, port), used by every topic pushing there."""
    session: aiohttp.ClientSession
    last_used: float  # time.monotonic() an attempt last started or ended
    in_flight: int = 0  # attempts under way: closing the session would cut them



class PushClient:
    """POSTs pushes over one keep-alive session per origin, closing those left unused; one a
    namespace's pushers."""

    def __init__(self, policy: HostPolicy):
        self.policy = policy
        self._endpoints: dict[tuple[str, str, int | None], _Endpoint] = {}
        self._lookups = asyncio.Semaphore(DNS_THREADS_PER_CLIENT)

    async def post(self, url: str, body: bytes, headers: dict[str, str],
                   timeout_millis: int) -> tuple[int | None, tuple[str, str]]:
        """The answer's status, or None and (status label, error) for an attempt that got none."""
        problem = self.policy.url_problem(url)
        if problem is not None:
            return None, ("refused", f"pushUrl {problem}")
        endpoint = self._endpoint(url)
        endpoint.in_flight += 1
        try:
            async with asyncio.timeout(timeout_millis / 1000):
                async with endpoint.session.post(url, data=body, headers=headers, allow_redirects=False) as answer:
                    await answer.content.read(ANSWER_LIMIT_BYTES)
                    return answer.status, ("", "")
        except TimeoutError:
            return None, ("timeout", f"no answer within {timeout_millis} ms")
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, RefusedAddress):
                return None, ("refused", str(exc.os_error))
            return None, ("connection", str(exc.os_error) or type(exc.os_error).__name__)
        except (aiohttp.ClientError, OSError) as exc:
            return None, ("connection", str(exc) or type(exc).__name__)
        finally:
            endpoint.in_flight -= 1
            endpoint.last_used = time.monotonic()

    def _endpoint(self, url: str) -> _Endpoint:
        parts = urlsplit(url)
        origin = (parts.scheme, parts.hostname, parts.port)
        endpoint = self._endpoints.get(origin)
        if endpoint is None:
            connector = aiohttp.TCPConnector(limit=0, resolver=_AllowedResolver(self.policy, self._lookups))
            # No cookie jar: a receiver's cookies would grow the process without bound (every namespace's
            # pushers share it) and go along with other topics' pushes to the origin.
            session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                            cookie_jar=aiohttp.DummyCookieJar(),
                                            timeout=aiohttp.ClientTimeout(total=None, sock_connect=None),
                                            skip_auto_headers=("User-Agent",),
                                            headers={"User-Agent": "delayqueue-pusher"})
            endpoint = self._endpoints[origin] = _Endpoint(session, 0.0)
        endpoint.last_used = time.monotonic()
        return endpoint

    async def close_idle(self) -> None:
        now = time.monotonic()
        # All taken out before the first close yields: an attempt started meanwhile opens a new one.
        idle = [self._endpoints.pop(origin) for origin, e in list(self._endpoints.items())
                if not e.in_flight and now - e.last_used > ENDPOINT_IDLE_SECONDS]
        for endpoint in idle:
            await endpoint.session.close()

    async def close(self) -> None:
        for endpoint in self._endpoints.values():
            await endpoint.session.close()
        self._endpoints.clear()
