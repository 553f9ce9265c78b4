from django.apps import AppConfig


class DelayQueueConfig(AppConfig):
    name = "delayqueue"
    verbose_name = "Delay queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.core.signals import setting_changed

        from delayqueue.config import settings as conf

        # load_config() keeps its object until the settings change (tests override them).
        setting_changed.connect(conf.settings_changed)
        # The operator UI lives in delayqueue.ops; Django's autodiscovery looks for delayqueue.admin only.
        from delayqueue.ops import admin  # noqa: F401
