"""Setting and listing the limits that delayqueue/limits.py enforces, for `manage.py set_limits`
and the admin. Web processes read them from the Limit table within a second (messagelog/refreshed.py)."""
from django.db import transaction

from delayqueue.stores.limits import NAMESPACE
from delayqueue.models import Limit

LIMIT_FIELDS = ("produce_rate", "consume_rate", "max_live")


def set_limits(*, namespace: str, topic: str = NAMESPACE, produce_rate: int | None = None,
               consume_rate: int | None = None, max_live: int | None = None) -> Limit | None:
    """Changes the limits given of a namespace (topic NAMESPACE) or of one of its topics: 0
    removes a limit, None leaves it as it is. Returns the limits now in force, None when none is
    left (the row is then deleted)."""
    changes = {"produce_rate": produce_rate, "consume_rate": consume_rate, "max_live": max_live}
    with transaction.atomic():
        limit = (Limit.objects.select_for_update().filter(namespace=namespace, topic=topic).first()
                 or Limit(namespace=namespace, topic=topic))
        for name, value in changes.items():
            if value is not None:
                setattr(limit, name, value or None)
        if all(getattr(limit, name) is None for name in LIMIT_FIELDS):
            if limit.pk is not None:
                limit.delete()
            return None
        limit.save()
        return limit


def limits_of(*, namespace: str) -> list[Limit]:
    """The namespace's limits: its own first, then its topics' by name."""
    return list(Limit.objects.filter(namespace=namespace).order_by("topic"))


def describe(limit: Limit) -> str:
    """One line: whose limits these are and each one's value."""
    whose = f"topic {limit.topic}" if limit.topic != NAMESPACE else "the namespace"
    values = [f"produce {_rate(limit.produce_rate)}", f"consume {_rate(limit.consume_rate)}",
              f"live cap {f'{limit.max_live} messages' if limit.max_live else 'none'}"]
    return f"{whose} of namespace {limit.namespace}: " + ", ".join(values)


def _rate(value: int | None) -> str:
    return f"{value} messages/s" if value else "no limit"
