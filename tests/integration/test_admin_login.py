"""The admin's login against password guessing (a lock-out after repeated failures, counted in
the Redis cache every process shares) and Django's password validators on admin passwords,
both through the admin's own forms."""
import re
import time

import pytest
import redis
from django.contrib.auth.models import User

from delayqueue.core.constants import ADMIN_LOGIN_MAX_ADDRESS_FAILURES, ADMIN_LOGIN_MAX_FAILURES
from delayqueue.ops import login_limit
from tests.helpers import REDIS_URL

pytestmark = pytest.mark.usefixtures("clean_state")

LOGIN = "/admin/login/"
LOCKED = "Too many failed logins from this address: try again in 15 minutes."


def log_in(client, username, password, address):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=address)


def logged_in(response) -> bool:
    return response.status_code == 302 and "sessionid" in response.cookies


def test_repeated_wrong_passwords_lock_the_username_out_from_that_address_even_with_the_right_password(client):
    User.objects.create_superuser("boss", password="a long right password")
    for i in range(ADMIN_LOGIN_MAX_FAILURES):
        refused = log_in(client, "boss", f"guess {i}", "10.0.0.1")
        assert refused.status_code == 200 and "Please enter the correct username and password" in refused.text
    locked = log_in(client, "BOSS", "a long right password", "10.0.0.1")  # usernames as typed
    assert not logged_in(locked) and LOCKED in locked.text
    # The real admin, from another address, is not locked out by someone who knows the name.
    assert logged_in(log_in(client, "boss", "a long right password", "10.0.0.2"))


def test_failures_for_one_username_from_many_addresses_do_not_lock_the_username(client):
    User.objects.create_superuser("boss", password="a long right password")
    for i in range(3 * ADMIN_LOGIN_MAX_FAILURES):  # an attacker spread over addresses, each below the limit
        assert not logged_in(log_in(client, "boss", f"guess {i}", f"10.0.{i % 3}.{i}"))
    assert logged_in(log_in(client, "boss", "a long right password", "192.0.2.1"))


def test_repeated_failures_from_one_address_lock_that_address_out_for_every_username(client):
    User.objects.create_superuser("boss", password="a long right password")
    for i in range(ADMIN_LOGIN_MAX_ADDRESS_FAILURES):
        log_in(client, f"guessed-user-{i}", "guess", "192.0.2.7")
    locked = log_in(client, "boss", "a long right password", "192.0.2.7")
    assert not logged_in(locked) and LOCKED in locked.text
    assert logged_in(log_in(client, "boss", "a long right password", "192.0.2.8"))


def test_an_ipv6_client_is_counted_by_its_64_as_one_address(client):
    """A host picks its IPv6 addresses from its /64 at will: each counted apart, it would guess
    without end."""
    User.objects.create_superuser("boss", password="a long right password")
    for i in range(ADMIN_LOGIN_MAX_FAILURES):
        assert not logged_in(log_in(client, "boss", f"guess {i}", f"2001:db8:1:2::{i + 1:x}"))
    locked = log_in(client, "boss", "a long right password", "2001:db8:1:2:ffff::1")
    assert not logged_in(locked) and LOCKED in locked.text
    for i in range(ADMIN_LOGIN_MAX_ADDRESS_FAILURES):
        log_in(client, f"guessed-user-{i}", "guess", f"2001:db8:5:6:{i + 1:x}::1")
    locked = log_in(client, "boss", "a long right password", "2001:db8:5:6::abcd")
    assert not logged_in(locked) and LOCKED in locked.text
    assert logged_in(log_in(client, "boss", "a long right password", "2001:db8:5:7::1"))  # the next /64


def test_failures_below_the_limit_are_forgotten_after_a_right_password(client):
    User.objects.create_superuser("boss", password="a long right password")
    for _round in range(2):  # from one address, twice the username's limit in all
        for _ in range(ADMIN_LOGIN_MAX_FAILURES - 1):
            assert not logged_in(log_in(client, "boss", "guess", "10.0.0.1"))
        assert logged_in(log_in(client, "boss", "a long right password", "10.0.0.1"))
        client.logout()


def test_the_counts_live_in_the_shared_redis_cache_without_usernames_and_the_lock_ends(client, monkeypatch):
    monkeypatch.setattr(login_limit, "ADMIN_LOGIN_LOCK_SECONDS", 1)
    User.objects.create_superuser("boss", password="a long right password")
    for _ in range(ADMIN_LOGIN_MAX_FAILURES):
        log_in(client, "boss", "guess", "10.0.0.1")
    cache = redis.Redis.from_url(REDIS_URL)
    try:
        keys = [key.decode() for key in cache.keys("dqcache:*login-limit*")]
    finally:
        cache.close()
    assert any(key.endswith(":locked") for key in keys)
    assert not any("boss" in key or "10.0.0." in key for key in keys)
    locked = log_in(client, "boss", "a long right password", "10.0.0.1")
    assert "try again in 1 minute." in locked.text
    time.sleep(1.5)
    assert logged_in(log_in(client, "boss", "a long right password", "10.0.0.1"))


@pytest.mark.parametrize("password, problem", [
    ("Xy7#q", "This password is too short. It must contain at least 8 characters."),
    ("password123", "This password is too common."),
    ("8364920175", "This password is entirely numeric."),
    ("operator-anna", "The password is too similar to the username."),
])
def test_the_admin_refuses_a_weak_password_for_a_new_user_saying_why(admin_client, password, problem):
    response = admin_client.post("/admin/auth/user/add/", {
        "username": "operator-anna", "password1": password, "password2": password, "usable_password": "true"})
    assert response.status_code == 200  # the form again, with the reason
    assert problem in re.sub(r"&#x27;|&quot;", "'", response.text)
    assert not User.objects.filter(username="operator-anna").exists()
    taken = admin_client.post("/admin/auth/user/add/", {
        "username": "operator-anna", "password1": "lantern orbit 42 cobalt", "password2": "lantern orbit 42 cobalt",
        "usable_password": "true"})
    assert taken.status_code == 302 and User.objects.filter(username="operator-anna").exists()
