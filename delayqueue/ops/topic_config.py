"""Writing a topic's settings (the TopicConfig row, its limits through ops/limits.set_limits) in
one transaction, for setTopicConfig, pauseTopic and resumeTopic. Synchronous ORM: the API runs
it on a worker thread (services.py), an operator's rare call."""
from django.db import connection, transaction

from delayqueue.models import TopicConfig
from delayqueue.ops.limits import set_limits
from delayqueue.topic_config import TopicSettings


def save_topic_config(*, namespace: str, topic: str, changes: dict, limits: dict) -> None:
    """Sets the TopicConfig fields in `changes` (a value None: back to the default) and the
    limits in `limits` (set_limits' keywords: 0 removes one); the rest stay as they are. The
    worker thread's connection is closed after, so a PostgreSQL restart leaves no broken one."""
    try:
        with transaction.atomic():
            config = (TopicConfig.objects.select_for_update().filter(namespace=namespace, topic=topic).first()
                      or TopicConfig(namespace=namespace, topic=topic))
            defaults = TopicSettings()
            for name, value in changes.items():
                setattr(config, name, getattr(defaults, name) if value is None else value)
            config.save()
            if limits:
                set_limits(namespace=namespace, topic=topic, **limits)
    finally:
        connection.close()
