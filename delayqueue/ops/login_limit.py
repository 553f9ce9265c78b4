"""A limit on failed admin logins, against password guessing: after ADMIN_LOGIN_MAX_FAILURES
failures for one username or from one client address within ADMIN_LOGIN_WINDOW_SECONDS, every
attempt for that username or from that address is refused for ADMIN_LOGIN_LOCK_SECONDS, even
with the right password. The counts are in Django's cache (Redis: shared by every process);
while the cache is unreachable nothing is counted and logins are not limited."""
import hashlib
import math
import time

from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.cache import cache
from django.core.exceptions import ValidationError

from delayqueue.core.constants import ADMIN_LOGIN_LOCK_SECONDS, ADMIN_LOGIN_MAX_FAILURES, ADMIN_LOGIN_WINDOW_SECONDS


def _subjects(*, username: str, address: str) -> list[str]:
    """Cache key stems for the username (case-insensitive, as people type it) and the address;
    hashed, so any text makes a valid key and none is stored in the clear."""
    return [f"login-limit:{kind}:{hashlib.sha256(value.encode()).hexdigest()[:32]}"
            for kind, value in (("user", username.casefold()), ("address", address))]


def locked_seconds(*, username: str, address: str) -> int:
    """Seconds until the username and the address may try again (0: they may now)."""
    unlocks = [cache.get(f"{subject}:locked") or 0 for subject in _subjects(username=username, address=address)]
    return max(0, math.ceil(max(unlocks) - time.time()))


def record_failure(*, username: str, address: str) -> None:
    for subject in _subjects(username=username, address=address):
        failures = f"{subject}:failures"
        cache.add(failures, 0, ADMIN_LOGIN_WINDOW_SECONDS)  # the window starts at the first failure
        try:
            count = cache.incr(failures)
        except ValueError:  # the window ran out between add and incr
            cache.set(failures, count := 1, ADMIN_LOGIN_WINDOW_SECONDS)
        if count >= ADMIN_LOGIN_MAX_FAILURES:
            cache.set(f"{subject}:locked", time.time() + ADMIN_LOGIN_LOCK_SECONDS, ADMIN_LOGIN_LOCK_SECONDS)
            cache.delete(failures)


def record_success(*, username: str) -> None:
    """A right password clears the username's failures (not the address', which may be shared
    with someone guessing other usernames)."""
    cache.delete(f"{_subjects(username=username, address='')[0]}:failures")


class LimitedAdminAuthenticationForm(AdminAuthenticationForm):
    """The admin's login form, refusing a locked-out username or address before it checks the
    password, and counting the failures."""

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        address = self.request.META.get("REMOTE_ADDR", "") if self.request else ""
        wait = locked_seconds(username=username, address=address)
        if wait:
            minutes = math.ceil(wait / 60)
            raise ValidationError(
                "Too many failed logins for this username or from this address: try again in "
                f"{minutes} minute{'s' if minutes != 1 else ''}.", code="locked")
        try:
            cleaned = super().clean()
        except ValidationError as exc:
            if exc.code == "invalid_login":
                record_failure(username=username, address=address)
            raise
        record_success(username=username)
        return cleaned
