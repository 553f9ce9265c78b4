from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from delayqueue.config.arguments import utf8_text
from delayqueue.core.exceptions import QueueError
from delayqueue.messagelog.connection import first_line
from delayqueue.stores.rows import create_token


class Command(BaseCommand):
    help = ("Create an API token for a namespace with the given scopes. The token is printed once, alone on the "
            "last line; only its hash is stored.")

    def add_arguments(self, parser):
        parser.add_argument("--namespace", required=True, help="the namespace its requests work in")
        parser.add_argument("--scopes", required=True, help="comma-separated: produce, consume, manage, monitor")
        parser.add_argument("--name", type=utf8_text,
                            help="a unique name to list and revoke it by (generated if absent)")

    def handle(self, *args, **options):
        scopes = [s.strip() for s in options["scopes"].split(",") if s.strip()]
        try:
            row, token = create_token(namespace=options["namespace"], scopes=scopes, name=options["name"])
        except QueueError as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:
            raise CommandError(f"tokens unavailable: {first_line(exc)}") from None
        self.stdout.write(f"created token {row.name} (namespace {row.namespace}, scopes {row.scopes});"
                          " it is shown only now:")
        self.stdout.write(token)
