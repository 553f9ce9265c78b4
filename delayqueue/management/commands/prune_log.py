from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from delayqueue.config.arguments import age_in_days, prune_batch
from delayqueue.config.settings import load_config, setting_text
from delayqueue.messagelog.connection import first_line
from delayqueue.messagelog.retention import prune_log


class Command(BaseCommand):
    help = ("Delete ended messages (acked, expired, exhausted, deleted) and their history from the message log "
            "once they are older than the retention age; dead letters (status 5 or 6) once older than their own "
            f"days ({setting_text('dead_letter_retention_days')}) plus that age. Live messages are never touched.")

    def add_arguments(self, parser):
        parser.add_argument("--older-than-days", type=age_in_days,
                            help=f"age in days ({setting_text('log_retention_days')})")
        parser.add_argument("--batch", type=prune_batch, default=5000,
                            help="messages per transaction (5000, at most 1000000)")

    def handle(self, *args, **options):
        days = options["older_than_days"] or load_config().log_retention_days
        try:
            messages, events = prune_log(timedelta(days=days), options["batch"])
        except DatabaseError as exc:
            raise CommandError(f"message log unavailable: {first_line(exc)}") from None
        self.stdout.write(f"deleted {messages} ended messages and {events} history rows older than {days} days")
