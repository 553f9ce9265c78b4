"""One Redis pub/sub subscription kept alive: subscribe, hand each message on, and after a lost
connection back off, subscribe again and let the owner rescan what it may have missed."""
import asyncio
import logging
from collections.abc import Callable

from delayqueue.live.client import connect_pubsub_node

log = logging.getLogger(__name__)

FIRST_BACKOFF, MAX_BACKOFF = 0.05, 2.0


async def subscribe_forever(url: str, timeout: float, *, what: str, channels: tuple[str, ...] = (),
                            patterns: tuple[str, ...] = (), on_message: Callable[[dict], None],
                            on_subscribed: Callable[[bool], None], on_lost: Callable[[], None]) -> None:
    """Runs until cancelled. `on_subscribed(rescan)` follows every (re)subscription; rescan is
    True after an earlier attempt, when messages may have been missed. `on_lost()` follows every
    failure, before the back-off. Waiting for the next message has no timeout: `timeout` bounds
    connecting and subscribing."""
    backoff, attempts = FIRST_BACKOFF, 0
    while True:
        client = connect_pubsub_node(url, timeout)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        attempts += 1
        try:
            if channels:
                await pubsub.subscribe(*channels)
            if patterns:
                await pubsub.psubscribe(*patterns)
            on_subscribed(attempts > 1)
            backoff = FIRST_BACKOFF
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is not None:
                    on_message(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s lost its subscription (%s); retrying in %.2fs", what, exc, backoff)
            on_lost()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
        finally:
            try:
                await pubsub.aclose()
                await client.aclose()
            except Exception:
                pass
