import asyncio
import gc
import logging
import signal

import uvloop
from django.core.management.base import BaseCommand

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
        # The event loop uvicorn serves the API on. Redis or PostgreSQL down, at start or later: it waits.
        uvloop.run(self._run(options.get("name")))

    async def _run(self, name):
        rt = Runtime(load_config())
        scanner = Scanner(rt, name)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, scanner.stop)
        log.info("scanner %s started (namespace %s)", scanner.token, rt.config.namespace)
        try:
            await scanner.run()
        finally:
            await rt.close()
        written = scanner.log_writer.written if scanner.log_writer else 0
        log.info("scanner %s stopped: %s, history rows written %d", scanner.token, scanner.counts, written)
