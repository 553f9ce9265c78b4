import asyncio
import sys
import time

from django.core.management.base import BaseCommand, CommandError
from redis.exceptions import RedisError

from delayqueue.config.arguments import msg_id, namespace_name, topic_name
from delayqueue.config.settings import load_config
from delayqueue.core.exceptions import LogUnavailable, Throttled
from delayqueue.runtime import Runtime
from delayqueue.services.restore import RestoreCounts, nothing_matches, restore


class ProgressBar:
    """A bar on a terminal; on anything else a line every few seconds."""

    WIDTH = 30

    def __init__(self, stream):
        self.stream = stream
        self.tty = stream.isatty()
        self.last = 0.0

    def __call__(self, counts: RestoreCounts, total: int) -> None:
        now = time.monotonic()
        done = counts.seen
        if not self.tty and now - self.last < 5 and done < total:
            return
        self.last = now
        share = done / total if total else 1.0
        filled = int(share * self.WIDTH)
        line = (f"restore [{'#' * filled}{'.' * (self.WIDTH - filled)}] {share:6.1%} {done:,}/{total:,}"
                f"  restored {counts.restored:,}, already live {counts.already_live:,}")
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")


class Command(BaseCommand):
    help = (
        "Bring back into Redis every message the message log says is live (after Redis lost data): waiting if "
        "not yet due, ready otherwise, with its triggerTime, retry count and TTL. Skips what Redis already holds, "
        "so it is safe to run twice and while the service runs."
    )

    def add_arguments(self, parser):
        parser.add_argument("--namespace", type=namespace_name,
                            help="the namespace to restore (default DELAYQUEUE_NAMESPACE)")
        parser.add_argument("--topic", type=topic_name, help="only this topic")
        parser.add_argument("--msg-id", type=msg_id, help="only this message id")
        parser.add_argument("--include-expired", action="store_true",
                            help="also bring back messages whose TTL ran out before delivery, with their TTL anew")
        parser.add_argument("--dry-run", action="store_true", help="count what would be restored, change nothing")

    def handle(self, *args, **options):
        bar = ProgressBar(sys.stderr)
        try:
            counts = asyncio.run(self._restore(options, bar))
        except KeyboardInterrupt:
            bar.finish()
            raise CommandError("interrupted: what was restored stays restored; run the command again to finish",
                               returncode=130) from None
        except Throttled as exc:  # another restore of the namespace is running
            raise CommandError(str(exc)) from None
        except LogUnavailable as exc:  # an operator's console: where it failed too
            raise CommandError(f"{exc} ({exc.detail})" if exc.detail else str(exc)) from None
        except RedisError as exc:
            raise CommandError(f"redis unavailable: {exc}") from None
        bar.finish()
        if not counts.seen and (problem := nothing_matches(options["topic"], options["msg_id"])):
            raise CommandError(problem)
        verb = "would restore" if options["dry_run"] else "restored"
        self.stdout.write(f"{verb} {counts.restored}, already live {counts.already_live}, "
                          f"skipped (ended or expired) {counts.skipped}"
                          + (f", left cold (in the message log, for the loader) {counts.left_cold}"
                             if counts.left_cold else ""))

    async def _restore(self, options, bar) -> RestoreCounts:
        config = load_config()
        rt = Runtime(config, process="restore", namespace=options["namespace"] or config.namespace)
        try:
            return await restore(rt, topic=options["topic"], msg_id=options["msg_id"],
                                 include_expired=options["include_expired"], dry_run=options["dry_run"],
                                 progress=bar)
        finally:
            await rt.close()
