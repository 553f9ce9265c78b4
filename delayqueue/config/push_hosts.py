"""Which push URLs an operator allows (DELAYQUEUE_PUSH_ALLOWED_HOSTS), checked when a URL is set
and again for every address a push connects to, so that a topic's settings cannot aim the
service at its own network (a cloud metadata address, a database, an admin port).

Entries: a host name (`hooks.example.com`), a subdomain wildcard (`*.example.com`: subdomains
only), an IP address or network (`10.1.0.0/16`, `127.0.0.1`) or `*` (any host). A URL's host
must match an entry; an address that is not globally routable (loopback, private, link-local,
reserved) is refused unless an IP or network entry covers it, whatever name led there."""
import asyncio
import ipaddress
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from delayqueue.core.addresses import carried_ipv4

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = ("http", "https")

# The lookups of push URLs being set run on threads of their own, at most this many at once: a
# name whose resolver never answers holds one until the system resolver gives up, whatever the
# call's time limit, and the loop's default executor runs the process' sync_to_async work.
URL_CHECK_THREADS = 8
_URL_CHECKS = ThreadPoolExecutor(URL_CHECK_THREADS, thread_name_prefix="push-url-dns")
# Of those, one namespace's lookups hold at most this many, so that a tenant's names that never
# resolve leave the others threads to resolve theirs.
URL_CHECK_THREADS_PER_NAMESPACE = 2
_url_check_slots: dict[str, threading.BoundedSemaphore] = {}
_url_check_slots_lock = threading.Lock()


def _address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


@dataclass(frozen=True)
class HostPolicy:
    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()  # ".example.com" for `*.example.com`
    networks: tuple[Network, ...] = ()
    any_host: bool = False

    @classmethod
    def parse(cls, value: str) -> "HostPolicy":
        """The policy of a DELAYQUEUE_PUSH_ALLOWED_HOSTS value; ValueError naming a bad entry."""
        names, suffixes, networks, any_host = set(), [], [], False
        for item in value.split(","):
            entry = item.strip().lower().rstrip(".")
            if not entry:
                continue
            if entry == "*":
                any_host = True
            elif entry.startswith("*."):
                if not _is_name(entry[2:]):
                    raise ValueError(f"{item.strip()!r} is not a host name wildcard like *.example.com")
                suffixes.append(entry[1:])
            elif "/" in entry or _address(entry) is not None:
                try:
                    networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                except ValueError:
                    raise ValueError(f"{item.strip()!r} is not an IP address or network like 10.1.0.0/16") from None
            elif _is_name(entry):
                names.add(entry)
            else:
                raise ValueError(f"{item.strip()!r} is not a host name, *.domain, IP address, network or *")
        return cls(frozenset(names), tuple(suffixes), tuple(networks), any_host)

    @property
    def empty(self) -> bool:
        return not (self.names or self.suffixes or self.networks or self.any_host)

    def _listed(self, address: Address) -> bool:
        return any(address in network for network in self.networks)

    def allows_name(self, host: str) -> bool:
        return self.any_host or host in self.names or any(host.endswith(suffix) for suffix in self.suffixes)

    def url_problem(self, url: str) -> str | None:
        """Why `url` cannot be a push URL under this policy, or None. Names are judged here;
        the addresses they resolve to are checked where they are resolved (address_problem)."""
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError:
            return "is not a valid URL"
        if parts.scheme not in SCHEMES or not parts.hostname:
            return "must be an http:// or https:// URL with a host"
        if parts.username is not None or parts.password is not None:
            return "must not carry a user name or password (the topic's settings are not secret)"
        if self.empty:
            return "cannot be set: push is off on this server (DELAYQUEUE_PUSH_ALLOWED_HOSTS lists no host)"
        host = parts.hostname.rstrip(".")
        address = _address(host)
        if address is not None:
            if self._listed(address) or (self.any_host and _is_global(address)):
                return None
            if not _is_global(address):
                return (f"has address {address}, a loopback, private or reserved address that "
                        "DELAYQUEUE_PUSH_ALLOWED_HOSTS does not list")
            return f"has address {address}, which DELAYQUEUE_PUSH_ALLOWED_HOSTS does not list"
        # Only plain ASCII names: what an HTTP client makes of any other text (full-width digits,
        # other dots) need not be what was judged here. An IDN goes in its xn-- form.
        if not _is_name(host) or host.rpartition(".")[2].isdigit():
            return f"has host {host!r}, which is not a host name (ASCII letters, digits, hyphens) or an IP address"
        if not self.allows_name(host):
            return f"has host {host}, which DELAYQUEUE_PUSH_ALLOWED_HOSTS does not list"
        return None

    def address_problem(self, address: Address) -> str | None:
        """Why a push may not connect to `address` (an allowed name resolved to it), or None. The
        address itself is not named: the answer goes to whoever set the URL."""
        if self._listed(address) or _is_global(address):
            return None
        return "resolves to a loopback, private or reserved address that DELAYQUEUE_PUSH_ALLOWED_HOSTS does not list"


# Never globally reachable, though Python 3.11's is_global says so: NAT64's local-use prefix
# (RFC 8215; it maps to whatever IPv4 network the site's translator reaches) and the deprecated
# site-local fec0::/10.
_NOT_GLOBAL_IPV6 = tuple(ipaddress.ip_network(n) for n in ("64:ff9b:1::/48", "fec0::/10"))


def _is_global(address: Address) -> bool:
    """Globally routable, and so is any IPv4 address an IPv6 one carries."""
    if not address.is_global:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        if any(address in network for network in _NOT_GLOBAL_IPV6):
            return False
        carried = carried_ipv4(address)
        if carried is not None and not carried.is_global:
            return False
    return True


async def resolved_addresses(host: str, port: int | None, executor: Executor,
                             then: Callable[[], None] | None = None) -> list[tuple[Address, int]]:
    """The addresses `host` resolves to, each with its address family, looked up on `executor`
    (never the loop's default one, see URL_CHECK_THREADS). `then` is called once the lookup's
    thread is done with it, or once it is cancelled before it began: a caller that stops waiting
    does not end the lookup. Raises OSError."""
    def lookup():
        try:
            return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        finally:
            if then is not None:
                then()

    looked_up = executor.submit(lookup)
    if then is not None:
        looked_up.add_done_callback(lambda future: future.cancelled() and then())
    try:
        infos = await asyncio.wrap_future(looked_up)
    except UnicodeError as exc:  # a label the IDNA codec refuses (too long, empty): no such name
        raise OSError(f"not a resolvable name: {exc}") from None
    return [(ipaddress.ip_address(info[4][0].split("%", 1)[0]), info[0]) for info in infos]


async def _namespace_lookup(namespace: str, host: str) -> list[tuple[Address, int]]:
    """resolved_addresses on _URL_CHECKS once one of the namespace's slots there is free, held
    until the lookup's thread is done with it."""
    with _url_check_slots_lock:
        slots = _url_check_slots.setdefault(namespace, threading.BoundedSemaphore(URL_CHECK_THREADS_PER_NAMESPACE))
    while not slots.acquire(blocking=False):  # released on a lookup's thread: no loop to be woken on
        await asyncio.sleep(0.02)
    return await resolved_addresses(host, None, _URL_CHECKS, then=slots.release)


async def push_url_problem(policy: HostPolicy, url: str, timeout_millis: int, *, namespace: str) -> str | None:
    """Why `url` cannot be a push URL, its host's addresses included (looked up within
    `timeout_millis`, the push timeout: a push could not resolve it either), or None. `namespace`:
    whose lookup it is (URL_CHECK_THREADS_PER_NAMESPACE)."""
    problem = policy.url_problem(url)
    if problem is not None:
        return problem
    host = urlsplit(url).hostname.rstrip(".")
    if _address(host) is not None:
        return None
    try:
        addresses = await asyncio.wait_for(_namespace_lookup(namespace, host), timeout_millis / 1000)
    except TimeoutError:
        return f"has host {host}, which did not resolve within {timeout_millis} ms (pushTimeoutMillis)"
    except OSError:
        return f"has host {host}, which does not resolve"
    for address, _family in addresses:
        problem = policy.address_problem(address)
        if problem is not None:
            return f"has host {host}, which {problem}"
    return None


def _is_name(text: str) -> bool:
    labels = text.split(".")
    return all(label and len(label) <= 63 and label.replace("-", "").isalnum() and label.isascii()
               for label in labels) and len(text) <= 253


def checked_allowed_hosts(value: str) -> str:
    HostPolicy.parse(value)
    return value
