import asyncio
import sys
import time
from argparse import ArgumentTypeError

from django.core.management.base import BaseCommand, CommandError

from delayqueue.config.arguments import msg_id, namespace_name, positive_int, topic_name
from delayqueue.config.settings import load_config
from delayqueue.core.constants import REDRIVE_DEFAULT_RATE, REDRIVE_MAX_RATE
from delayqueue.core.exceptions import LogUnavailable, QueueError
from delayqueue.runtime import Runtime
from delayqueue.services.dead_letters import create_redrive, redrive_state

POLL_SECONDS = 0.2
PLAIN_LINE_SECONDS = 5  # not a terminal: a line this often


def rate(text: str) -> int:
    value = positive_int(text)
    if value > REDRIVE_MAX_RATE:
        raise ArgumentTypeError(f"must be at most {REDRIVE_MAX_RATE}, got {value}")
    return value


class Command(BaseCommand):
    help = ("Send a topic's dead letters (all, or those of --msg-id) back as new lives (ready now, retry 0) at a "
            "rate, and show the progress until done. The scanners (manage.py run_scanners) do the work; "
            "interrupted, the redrive goes on in them.")

    def add_arguments(self, parser):
        parser.add_argument("--topic", type=topic_name, required=True, help="the topic whose dead letters go back")
        parser.add_argument("--msg-id", dest="msg_ids", action="append", type=msg_id,
                            help="only this dead letter (repeatable); default: all of the topic's")
        parser.add_argument("--rate", type=rate,
                            help=f"most messages per second ({REDRIVE_DEFAULT_RATE}, or DELAYQUEUE_MAX_REDRIVE_RATE "
                                 "when that is lower)")
        parser.add_argument("--namespace", type=namespace_name, help="default DELAYQUEUE_NAMESPACE")

    def handle(self, *args, **options):
        try:
            asyncio.run(self._run(options))
        except KeyboardInterrupt:
            raise CommandError("interrupted: the redrive goes on in the scanners", returncode=130) from None
        except LogUnavailable as exc:
            raise CommandError(f"{exc} ({exc.detail})" if exc.detail else str(exc)) from None
        except QueueError as exc:  # CapReached: over DELAYQUEUE_MAX_REDRIVE_RATE
            raise CommandError(str(exc)) from None

    async def _run(self, options) -> None:
        config = load_config()
        rt = Runtime(config, "manage.py redrive", namespace=options["namespace"] or config.namespace)
        try:
            topic, msg_ids = options["topic"], options["msg_ids"]
            task_id = await create_redrive(rt, topic=topic, msg_ids=msg_ids,
                                                       max_per_second=options["rate"])
            if task_id is None:
                raise CommandError(f"topic {topic} has no such dead letter" if msg_ids
                                   else f"topic {topic} has no dead letters")
            self.stdout.write(f"redrive task {task_id} started (run by the scanners)")
            self.stdout.flush()
            await self._follow(rt, task_id)
        finally:
            await rt.close()

    async def _follow(self, rt, task_id: int) -> None:
        out = sys.stderr
        tty, last = out.isatty(), 0.0
        while True:
            progress = await redrive_state(rt, task_id=task_id)
            total = progress.moved + progress.left
            now = time.monotonic()
            if tty or progress.done or now - last >= PLAIN_LINE_SECONDS:
                last = now
                share = progress.moved / total if total else 1.0
                filled = int(share * 30)
                line = f"redrive [{'#' * filled}{'.' * (30 - filled)}] {share:6.1%} {progress.moved:,}/{total:,}"
                out.write(("\r" + line) if tty else line + "\n")
                out.flush()
            if progress.done:
                if tty:
                    out.write("\n")
                self.stdout.write(f"redriven {progress.moved}")
                return
            await asyncio.sleep(POLL_SECONDS)
