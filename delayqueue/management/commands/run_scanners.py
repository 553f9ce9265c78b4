import asyncio
import gc
import logging
import signal

import uvloop
from django.core.management.base import BaseCommand

from delayqueue.config.arguments import non_empty
from delayqueue.config.settings import DEFAULT_DATABASE, load_config
from delayqueue.messagelog.connection import LogConnection
from delayqueue.runtime import Runtime
from delayqueue.stores.tokens import read_served_namespaces
from delayqueue.workers.log_process import LogProcess
from delayqueue.workers.pusher import Pusher
from delayqueue.workers.scanner import Scanner

log = logging.getLogger("delayqueue.scanner")

# How often the token table is read for namespaces that need a scanner.
NAMESPACE_CHECK_SECONDS = 3


class Command(BaseCommand):
    help = (
        "Run the scanners: promote due messages, requeue ack timeouts, expire TTLs, purge ended "
        "messages, retire idle topics, prune monitor stats; push the due messages of topics with a push URL "
        "(docs/push.md); and, in a child process, write the held topics' history to the message log and plan "
        "the schedules' ticks. One scanner and one pusher per namespace: DELAYQUEUE_NAMESPACE's and every API "
        "token's (new ones are picked up within seconds). Run as many as you like; SIGTERM stops cleanly."
    )

    def add_arguments(self, parser):
        parser.add_argument("--name", type=non_empty, help="this scanner's lock token (default host:pid:random)")

    def handle(self, *args, **options):
        gc.freeze()  # Django's startup objects live as long as the process: no full GC passes over them
        # The event loop uvicorn serves the API on. Redis or PostgreSQL down, at start or later: it waits.
        uvloop.run(self._run(options.get("name")))

    async def _run(self, name):
        root = Runtime(load_config())
        stopping = asyncio.Event()
        scanners: dict[str, tuple[Scanner, asyncio.Task]] = {}
        pushers: dict[str, tuple[Pusher, asyncio.Task]] = {}
        log_process = LogProcess()
        telling: list[asyncio.Task] = []  # each scanner's held topics, to the log process

        def stop():
            stopping.set()
            for scanner, _task in scanners.values():
                scanner.stop()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)
        tokens = LogConnection(root.config.log_timeout_millis, DEFAULT_DATABASE)
        logging_task = loop.create_task(log_process.run(stopping), name="log process")
        try:
            while not stopping.is_set():
                # No Django ORM on the scanners' loop; the others are asked again at the next check.
                for namespace in await read_served_namespaces(root.config.namespace, tokens):
                    if namespace in scanners:
                        continue
                    scanner = Scanner(root.for_namespace(namespace), name)
                    scanners[namespace] = (scanner, loop.create_task(scanner.run(), name=f"scanner {namespace}"))
                    pusher = Pusher(scanner.rt)
                    pushers[namespace] = (pusher, loop.create_task(pusher.run(stopping), name=f"pusher {namespace}"))
                    telling.append(loop.create_task(tell_held(log_process, namespace, scanner)))
                    log.info("scanner %s started (namespace %s)", scanner.token, namespace)
                waiting = {logging_task, *(task for _worker, task in (*scanners.values(), *pushers.values()))}
                stopped = loop.create_task(stopping.wait())
                done, _ = await asyncio.wait({stopped, *waiting}, timeout=NAMESPACE_CHECK_SECONDS,
                                             return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                for task in done & waiting:
                    task.result()  # a scanner or pusher that failed ends the process, as a lone scanner does
        finally:
            stop()
            await asyncio.gather(logging_task, *(task for _worker, task in (*scanners.values(), *pushers.values())),
                                 return_exceptions=True)
            for task in telling:
                task.cancel()
            await tokens.close()
            await root.close()
        for namespace, (scanner, _task) in sorted(scanners.items()):
            log.info("scanner %s stopped (namespace %s): %s, pushes %s", scanner.token, namespace, scanner.counts,
                     dict(pushers[namespace][0].counts))


async def tell_held(log_process: LogProcess, namespace: str, scanner: Scanner) -> None:
    """Tells the log process the topics `scanner` holds, each time they change (many changes
    at once, as at start, are told once)."""
    while True:
        await scanner.held_changed.wait()
        scanner.held_changed.clear()
        log_process.hold(namespace=namespace, owner=scanner.token, topics=scanner.workers)
