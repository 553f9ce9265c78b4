"""The Django admin's pages over the message log and the operator data; importing this package
registers them (apps.DelayQueueConfig.ready), and the admin's login is limited against guessing."""
from django.contrib import admin

from delayqueue.ops.admin import limits, messages, schedules, stats, tokens, topics  # noqa: F401
from delayqueue.ops.login_limit import LimitedAdminAuthenticationForm

admin.site.login_form = LimitedAdminAuthenticationForm
