from django.apps import AppConfig


class DelayQueueConfig(AppConfig):
    name = "delayqueue"
    verbose_name = "Delay queue"
    default_auto_field = "django.db.models.BigAutoField"
