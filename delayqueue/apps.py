"""The Django app: settings read again when they change, and the operator UI's admin pages
registered once the models are loaded."""
from django.apps import AppConfig
from django.core.signals import setting_changed

from delayqueue.config.settings import settings_changed


class DelayQueueConfig(AppConfig):
    name = "delayqueue"
    verbose_name = "Delay queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # load_config() keeps its object until the settings change (tests override them).
        setting_changed.connect(settings_changed)
        # The operator UI lives in delayqueue.ops; Django's autodiscovery looks for delayqueue.admin
        # only, and the admin's modules need the models loaded.
        from delayqueue.ops import admin  # noqa: F401
