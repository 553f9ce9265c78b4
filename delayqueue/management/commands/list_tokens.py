from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from delayqueue.messagelog.connection import first_line
from delayqueue.stores.rows import list_tokens


class Command(BaseCommand):
    help = "List the API tokens (never the tokens themselves: only their hashes are stored)."

    def handle(self, *args, **options):
        try:
            tokens = list_tokens()
        except DatabaseError as exc:
            raise CommandError(f"tokens unavailable: {first_line(exc)}") from None
        rows = [("NAME", "NAMESPACE", "SCOPES", "CREATED", "REVOKED")]
        for t in tokens:
            rows.append((t.name, t.namespace, ",".join(t.scopes), f"{t.created_at:%Y-%m-%d %H:%M:%S}",
                         f"{t.revoked_at:%Y-%m-%d %H:%M:%S}" if t.revoked_at else "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            self.stdout.write("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
