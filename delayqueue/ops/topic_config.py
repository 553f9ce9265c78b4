"""Writing a topic's settings (the TopicConfig row, its limits through ops/limits.set_limits) in
one transaction, for setTopicConfig, pauseTopic and resumeTopic. Synchronous ORM: the API runs
it on a worker thread (services.py), an operator's rare call."""
import secrets

from django.db import connection, transaction

from delayqueue.core.clock import now_millis
from delayqueue.core.exceptions import BadRequest
from delayqueue.models import TopicConfig
from delayqueue.ops.limits import set_limits
from delayqueue.stores.topic_settings import TopicSettings

# A push signing secret: recognisable (secret scanners, logs) and 256 random bits.
PUSH_SECRET_PREFIX = "dqps_"


def new_push_secret() -> str:
    return PUSH_SECRET_PREFIX + secrets.token_urlsafe(32)


def save_topic_config(*, namespace: str, topic: str, changes: dict, limits: dict, rotate_push_secret: bool = False,
                      secret_grace_millis: int = 0) -> str | None:
    """Sets the TopicConfig fields in `changes` (a value None: back to the default) and the
    limits in `limits` (set_limits' keywords: 0 removes one); the rest stay as they are.

    A topic given its first push URL gets a signing secret; `rotate_push_secret` makes a new one,
    the old one signing on for `secret_grace_millis`; an empty push URL forgets both. Answers
    the new secret, shown this once, or None. BadRequest for a rotation without a push URL. The
    worker thread's connection is closed after, so a PostgreSQL restart leaves no broken one."""
    try:
        with transaction.atomic():
            config = (TopicConfig.objects.select_for_update().filter(namespace=namespace, topic=topic).first()
                      or TopicConfig(namespace=namespace, topic=topic))
            defaults = TopicSettings()
            for name, value in changes.items():
                setattr(config, name, getattr(defaults, name) if value is None else value)
            secret = None
            if not config.push_url:
                if rotate_push_secret:
                    raise BadRequest(f"rotatePushSecret: topic {topic} has no pushUrl, so no secret to rotate")
                config.push_secret = config.push_previous_secret = ""
                config.push_previous_until = 0
            elif not config.push_secret or rotate_push_secret:
                if config.push_secret:
                    config.push_previous_secret = config.push_secret
                    config.push_previous_until = now_millis() + secret_grace_millis
                config.push_secret = secret = new_push_secret()
            config.save()
            if limits:
                set_limits(namespace=namespace, topic=topic, **limits)
        return secret
    finally:
        connection.close()
