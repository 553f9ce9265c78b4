"""A limit on failed admin logins, against password guessing: after ADMIN_LOGIN_MAX_FAILURES
failures for one username from one client address, or ADMIN_LOGIN_MAX_ADDRESS_FAILURES from one
address for any usernames, within ADMIN_LOGIN_WINDOW_SECONDS, every attempt for that username
from that address (or from that address at all) is refused for ADMIN_LOGIN_LOCK_SECONDS, even
with the right password. A username alone is never locked: whoever knows an admin's name could
otherwise lock the admin out from anywhere. An IPv6 client counts as its /64 (core.addresses).
The counts are in Django's cache (Redis: shared by every process); while the cache is unreachable
nothing is counted and logins are not limited."""
import hashlib
import math
import time

from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.cache import cache
from django.core.exceptions import ValidationError

from delayqueue.core.addresses import counted_address
from delayqueue.core.constants import (ADMIN_LOGIN_LOCK_SECONDS, ADMIN_LOGIN_MAX_ADDRESS_FAILURES,
                                       ADMIN_LOGIN_MAX_FAILURES, ADMIN_LOGIN_WINDOW_SECONDS)


def _subjects(*, username: str, address: str) -> list[tuple[str, int]]:
    """Cache key stems, each with its limit, for the username (case-insensitive, as people type
    it) from the address, and for the address; hashed, so any text makes a valid key and none is
    stored in the clear."""
    address = counted_address(address)
    return [(f"login-limit:{kind}:{hashlib.sha256(value.encode()).hexdigest()[:32]}", limit)
            for kind, value, limit in (("user-at", f"{username.casefold()}\n{address}", ADMIN_LOGIN_MAX_FAILURES),
                                       ("address", address, ADMIN_LOGIN_MAX_ADDRESS_FAILURES))]


def locked_seconds(*, username: str, address: str) -> int:
    """Seconds until the username may try again from the address (0: it may now)."""
    unlocks = [cache.get(f"{subject}:locked") or 0 for subject, _limit in _subjects(username=username, address=address)]
    return max(0, math.ceil(max(unlocks) - time.time()))


def record_failure(*, username: str, address: str) -> None:
    for subject, limit in _subjects(username=username, address=address):
        failures = f"{subject}:failures"
        cache.add(failures, 0, ADMIN_LOGIN_WINDOW_SECONDS)  # the window starts at the first failure
        try:
            count = cache.incr(failures)
        except ValueError:  # the window ran out between add and incr
            cache.set(failures, count := 1, ADMIN_LOGIN_WINDOW_SECONDS)
        if count >= limit:
            cache.set(f"{subject}:locked", time.time() + ADMIN_LOGIN_LOCK_SECONDS, ADMIN_LOGIN_LOCK_SECONDS)
            cache.delete(failures)


def record_success(*, username: str, address: str) -> None:
    """A right password clears the username's failures from the address (not the address' own,
    which may be shared with someone guessing other usernames)."""
    cache.delete(f"{_subjects(username=username, address=address)[0][0]}:failures")


class LimitedAdminAuthenticationForm(AdminAuthenticationForm):
    """The admin's login form, refusing a locked-out username (from this address) or address
    before it checks the password, and counting the failures."""

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        address = self.request.META.get("REMOTE_ADDR", "") if self.request else ""
        wait = locked_seconds(username=username, address=address)
        if wait:
            minutes = math.ceil(wait / 60)
            raise ValidationError(
                "Too many failed logins from this address: try again in "
                f"{minutes} minute{'s' if minutes != 1 else ''}.", code="locked")
        try:
            cleaned = super().clean()
        except ValidationError as exc:
            if exc.code == "invalid_login":
                record_failure(username=username, address=address)
            raise
        record_success(username=username, address=address)
        return cleaned
