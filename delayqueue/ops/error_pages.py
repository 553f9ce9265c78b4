"""What Django's debug error pages (DEBUG on) show of the settings and of each frame's variables:
Django hides settings named like a secret (DATABASES' PASSWORD), not a password inside a URL
(REDIS_URL, DATABASE_URL, a cache's LOCATION, a config object holding them). This filter hides
those too, keeping the rest of the URL: where the datastore is, is what one debugs."""
import re

from django.views.debug import SafeExceptionReporterFilter

from delayqueue.config.redis_urls import without_password

# A URL inside any text (a setting, a repr): scheme:// up to a blank or a quote.
URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def hide_passwords(text: str) -> str:
    return URL_IN_TEXT.sub(lambda url: without_password(url.group()), text)


class Shown:
    """A value as the page shows it: its repr, passwords hidden."""

    def __init__(self, value):
        self.text = hide_passwords(repr(value))

    def __repr__(self) -> str:
        return self.text


class PasswordHidingFilter(SafeExceptionReporterFilter):
    def cleanse_setting(self, key, value):
        value = super().cleanse_setting(key, value)  # dicts and lists come back here item by item
        return hide_passwords(value) if isinstance(value, str) else value

    def get_traceback_frame_variables(self, request, tb_frame):
        return [(name, Shown(value)) for name, value in super().get_traceback_frame_variables(request, tb_frame)]
