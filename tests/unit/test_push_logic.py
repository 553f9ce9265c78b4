"""Push delivery's pure logic, no server: DELAYQUEUE_PUSH_ALLOWED_HOSTS' rules (config/push_hosts.py), the
push figures' arithmetic (live/push_counts.py), the signature header and the pusher's wake schedule."""
import asyncio
import hashlib
import hmac
import ipaddress
import socket
import threading

import pytest
from delayqueue_client import verify_signature

from delayqueue.config.push_hosts import URL_CHECK_THREADS, HostPolicy, push_url_problem
from delayqueue.core.constants import LATENESS_BOUNDS_MS
from delayqueue.live.push_counts import bucket_quantile, failed_field, lateness_field, pushed_fields, topic_figures
from delayqueue.stores.push_topics import PushTopic
from delayqueue.workers.push_http import signature_header


def problem(policy: str, url: str) -> str | None:
    return HostPolicy.parse(policy).url_problem(url)


def test_push_is_off_until_hosts_are_listed():
    assert "push is off" in problem("", "https://hooks.example.com/x")


@pytest.mark.parametrize("policy, url", [
    ("hooks.example.com", "https://hooks.example.com/x"),
    ("hooks.example.com", "https://HOOKS.example.com.:8443/x"),
    ("*.example.com", "http://a.b.example.com/x"),
    ("*", "https://anything.test/x"),
    ("*", "https://93.184.215.14/x"),
    ("127.0.0.1", "http://127.0.0.1:8080/hook"),
    ("10.1.0.0/16", "http://10.1.2.3/hook"),
    ("::1", "http://[::1]:9000/hook"),
])
def test_allowed(policy, url):
    assert problem(policy, url) is None


@pytest.mark.parametrize("policy, url, says", [
    ("hooks.example.com", "https://evil.example.com/x", "does not list"),
    ("*.example.com", "https://example.com/x", "does not list"),
    ("*", "http://127.0.0.1/x", "loopback, private or reserved"),
    ("*", "http://169.254.169.254/latest/meta-data", "loopback, private or reserved"),
    ("hooks.example.com", "http://10.0.0.1/x", "loopback, private or reserved"),
    ("hooks.example.com", "http://93.184.215.14/x", "does not list"),
    ("*", "ftp://hooks.example.com/x", "http:// or https://"),
    ("*", "https:///x", "http:// or https://"),
    ("*", "https://user:secret@hooks.example.com/x", "user name or password"),
    ("*", "https://hooks.example.com:99999/x", "not a valid URL"),
])
def test_refused(policy, url, says):
    assert says in problem(policy, url)


def test_a_name_resolving_to_a_private_address_needs_that_address_listed():
    policy = HostPolicy.parse("hooks.internal, 10.1.0.0/16")
    assert policy.address_problem(ipaddress.ip_address("10.1.4.5")) is None
    assert "loopback, private or reserved" in policy.address_problem(ipaddress.ip_address("10.2.0.1"))
    assert "loopback, private or reserved" in policy.address_problem(ipaddress.ip_address("127.0.0.1"))
    assert policy.address_problem(ipaddress.ip_address("93.184.215.14")) is None


@pytest.mark.parametrize("value", ["exa mple.com", "*..com", "10.1.0.0/99", "*.bad_name!"])
def test_a_bad_entry_is_named(value):
    with pytest.raises(ValueError, match="is not"):
        HostPolicy.parse(value)


def test_push_figures_add_up_per_topic():
    counts = {}
    for name in pushed_fields("a", 3) + pushed_fields("a", 40) + pushed_fields("b", 0):
        counts[name] = counts.get(name, 0) + 1
    counts[lateness_field("a")] = 43
    counts[failed_field("a", "500")] = 2
    counts[failed_field("a", "timeout")] = 1
    figures = topic_figures({name: str(n) for name, n in counts.items()})
    a = figures["a"]
    assert (a.pushed, a.lateness_sum_ms, dict(a.failures)) == (2, 43, {"500": 2, "timeout": 1})
    assert dict(a.lateness_buckets)[5] == 1 and dict(a.lateness_buckets)[50] == 1
    assert figures["b"].pushed == 1 and dict(figures["b"].lateness_buckets)[LATENESS_BOUNDS_MS[0]] == 1


def test_bucket_quantile_is_the_upper_bound_of_the_bucket_holding_it():
    buckets = [(1, 50), (2, 40), (5, 9), (None, 1)]
    assert bucket_quantile(buckets, 0.5) == 1
    assert bucket_quantile(buckets, 0.9) == 2
    assert bucket_quantile(buckets, 0.99) == 5
    assert bucket_quantile(buckets, 1.0) is None  # past the last bound
    assert bucket_quantile([(1, 0), (None, 0)], 0.5) is None


def test_the_signature_header_has_one_v1_per_secret_and_verifies():
    body = b'{"msgId":"m1"}'
    header = signature_header(["new", "old"], 1_700_000_000_000, body)
    t, *v1s = header.split(",")
    assert t == "t=1700000000000"
    assert v1s == [f"v1={hmac.new(s.encode(), b'1700000000000.' + body, hashlib.sha256).hexdigest()}"
                   for s in ("new", "old")]
    verify_signature("old", {"DelayQueue-Signature": header}, body, now_ms=1_700_000_000_000)


def test_wakes_keep_each_topics_earliest_and_hand_them_out_in_time_order():
    from delayqueue.workers.pusher import _Wakes

    wakes = _Wakes()
    wakes.at("a", 5.0)
    wakes.at("b", 2.0)
    wakes.at("a", 1.0)  # earlier: replaces 5.0
    wakes.at("b", 3.0)  # later: ignored
    assert wakes.next() == 1.0
    assert wakes.due(2.5) == ["a", "b"]
    assert wakes.due(10.0) == []  # a's stale 5.0 went with it
    assert wakes.next() == float("inf")


def test_a_rotated_out_secret_signs_only_until_its_grace_period_ends():
    settings = PushTopic(push_url="https://hooks.example.com/", push_concurrency=8, push_timeout_millis=10_000,
                         push_rate=0, push_secret="new", push_previous_secret="old", push_previous_until=1_000,
                         push_secret_id="")
    assert settings.signing_secrets(999) == ["new", "old"]
    assert settings.signing_secrets(1_000) == ["new"]
    assert "new" not in repr(settings) and "old" not in repr(settings)


@pytest.mark.parametrize("url", ["http://127\u30020\u30020\u30021/", "http://\uff11\uff12\uff17.0.0.1/",
                                 "http://2130706433/", "http://[2002:7f00:1::]/", "http://[::a00:5]/",
                                 "http://[::ffff:10.0.0.1]/"])
def test_hosts_an_http_client_could_read_as_internal_addresses_are_refused(url):
    assert problem("*", url) is not None


@pytest.mark.parametrize("address", [
    "64:ff9b:1::a00:1", "64:ff9b:1:ffff::808:808",  # NAT64 local use: whatever it maps to
    "::ffff:0:a00:1", "::ffff:0:7f00:1", "::ffff:0:a9fe:a9fe",  # IPv4-translated 10/8, loopback, metadata
    "64:ff9b::a9fe:a9fe",  # NAT64 well-known prefix carrying the metadata address
    "fec0::1", "feff:ffff::1",  # site-local
])
def test_ipv6_forms_reaching_private_or_site_networks_are_refused_under_any_host(address):
    assert "loopback, private or reserved" in problem("*", f"http://[{address}]/hook")
    assert "loopback, private or reserved" in HostPolicy.parse("*").address_problem(ipaddress.ip_address(address))


def test_ipv6_forms_carrying_a_global_ipv4_address_are_allowed_and_a_listed_network_still_is():
    assert problem("*", "http://[::ffff:0:808:808]/hook") is None  # IPv4-translated 8.8.8.8
    assert problem("*", "http://[64:ff9b::808:808]/hook") is None
    assert problem("fec0::/10", "http://[fec0::1]/hook") is None


async def test_one_namespaces_push_urls_that_never_resolve_leave_lookup_threads_to_another(monkeypatch):
    """A tenant setting many push URLs whose names never resolve held every lookup thread of the
    process (each until the system resolver gives up), so another tenant's good URL timed out."""
    released = threading.Event()

    def getaddrinfo(host, port, *args, **kwargs):
        if host.endswith(".hang.test"):
            released.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    policy = HostPolicy.parse("*")
    try:
        hung = await asyncio.gather(*(push_url_problem(policy, f"http://h{i}.hang.test/x", 300, namespace="noisy")
                                      for i in range(3 * URL_CHECK_THREADS)))
        assert all("did not resolve within 300 ms" in p for p in hung)
        assert await push_url_problem(policy, "http://hooks.example.com/x", 1000, namespace="quiet") is None
    finally:
        released.set()
