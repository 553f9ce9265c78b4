from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from delayqueue.config.arguments import utf8_text
from delayqueue.core.exceptions import QueueError
from delayqueue.messagelog.connection import first_line
from delayqueue.stores.rows import revoke_token


class Command(BaseCommand):
    help = "Revoke an API token by name: every web process refuses it within a second."

    def add_arguments(self, parser):
        parser.add_argument("name", type=utf8_text)

    def handle(self, *args, **options):
        try:
            row = revoke_token(name=options["name"])
        except QueueError as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:
            raise CommandError(f"tokens unavailable: {first_line(exc)}") from None
        self.stdout.write(f"revoked token {row.name} (namespace {row.namespace})")
