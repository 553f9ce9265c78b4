from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from delayqueue.config.arguments import limit_value, namespace_name, topic_name
from delayqueue.config.settings import load_config
from delayqueue.messagelog.connection import first_line
from delayqueue.models import Limit
from delayqueue.stores.limits import NAMESPACE
from delayqueue.stores.rows import limits_of, set_limits


class Command(BaseCommand):
    help = ("Set the rate limits and the live-message cap of a namespace or of one of its topics (0 removes a "
            "limit; a limit not given stays as it is), or list them with --show. Every web process applies a "
            "change within a second. A topic's limits set here are the operator's: a tenant's setTopicConfig "
            "cannot change them until they are all removed.")

    def add_arguments(self, parser):
        parser.add_argument("--namespace", type=namespace_name,
                            help="the namespace (default DELAYQUEUE_NAMESPACE)")
        parser.add_argument("--topic", type=topic_name, help="a topic of the namespace (default: the namespace itself)")
        parser.add_argument("--produce-rate", type=limit_value, metavar="N",
                            help="messages per second sent (sendMsg, each message of sendMsgBatch)")
        parser.add_argument("--consume-rate", type=limit_value, metavar="N",
                            help="messages per second handed out (pullMsg, longPollingMsg)")
        parser.add_argument("--max-live", type=limit_value, metavar="N",
                            help="most messages waiting, ready or consuming at once")
        parser.add_argument("--show", action="store_true", help="list the namespace's limits (after any change)")

    def handle(self, *args, **options):
        namespace = options["namespace"] or load_config().namespace
        topic = options["topic"] or NAMESPACE
        values = {name: options[name] for name in ("produce_rate", "consume_rate", "max_live")}
        changing = any(value is not None for value in values.values())
        if not changing and not options["show"]:
            raise CommandError("nothing to set: give --produce-rate, --consume-rate or --max-live (0 removes "
                               "one), or --show to list the limits")
        try:
            if changing:
                limit = set_limits(namespace=namespace, topic=topic, **values)
                whose = f"topic {topic}" if topic != NAMESPACE else "the namespace"
                self.stdout.write("now in force (on every web process within 1 s): " + (
                    describe(limit) if limit else f"{whose} of namespace {namespace}: no limits"))
            if options["show"]:
                limits = limits_of(namespace=namespace)
                if not limits:
                    self.stdout.write(f"namespace {namespace} has no limits")
                for limit in limits:
                    self.stdout.write(describe(limit))
        except DatabaseError as exc:
            raise CommandError(f"limits unavailable: {first_line(exc)}") from None


def describe(limit: Limit) -> str:
    """One line: whose limits these are and each one's value."""
    whose = f"topic {limit.topic}" if limit.topic != NAMESPACE else "the namespace"
    values = [f"produce {_rate(limit.produce_rate)}", f"consume {_rate(limit.consume_rate)}",
              f"live cap {f'{limit.max_live} messages' if limit.max_live else 'none'}"]
    return f"{whose} of namespace {limit.namespace}: " + ", ".join(values)


def _rate(value: int | None) -> str:
    return f"{value} messages/s" if value else "no limit"
