from django.apps import AppConfig


class DelayQueueConfig(AppConfig):
    name = "delayqueue"
    verbose_name = "Delay queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # The operator UI lives in delayqueue.ops; Django's autodiscovery looks for delayqueue.admin only.
        from delayqueue.ops import admin  # noqa: F401
