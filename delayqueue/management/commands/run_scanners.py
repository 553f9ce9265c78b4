import asyncio
import gc
import logging
import signal

import uvloop
from django.core.management.base import BaseCommand, CommandError
from redis.exceptions import RedisError

from delayqueue.arguments import non_empty
from delayqueue.conf import load_config
from delayqueue.runtime import Runtime
from delayqueue.scanner.scanner import Scanner

log = logging.getLogger("delayqueue.scanner")


class Command(BaseCommand):
    help = (
        "Run the scanners: promote due messages, requeue ack timeouts, expire TTLs, purge ended "
        "messages, retire idle topics, prune monitor stats, and write the held topics' history to the message "
        "log. Run as many as you like; SIGTERM stops cleanly."
    )

    def add_arguments(self, parser):
        parser.add_argument("--name", type=non_empty, help="this scanner's lock token (default host:pid:random)")

    def handle(self, *args, **options):
        gc.freeze()  # Django's startup objects live as long as the process: no full GC passes over them
        try:
            uvloop.run(self._run(options.get("name")))  # the event loop uvicorn serves the API on
        except RedisError as exc:  # once running, a scanner rides out Redis restarts; it cannot start without it
            raise CommandError(f"redis unavailable: {exc}") from None

    async def _run(self, name):
        rt = Runtime(load_config())
        scanner = Scanner(rt, name)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, scanner.stop)
        log.info("scanner %s started (namespace %s)", scanner.token, rt.ns.namespace)
        try:
            await scanner.run()
        finally:
            await rt.close()
        written = scanner.log_writer.written if scanner.log_writer else 0
        log.info("scanner %s stopped: %s, history rows written %d", scanner.token, scanner.counts, written)
