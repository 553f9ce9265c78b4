"""camellia's health endpoints' state: whether this process reports itself online, and when it
last served a queue request (so `offline` can tell a load balancer when draining is done)."""
import time

IDLE_SECONDS_BEFORE_OFFLINE = 20  # camellia's: offline answers 200 once no request came for 20 s

online = True
_last_use = float("-inf")


def mark_use() -> None:
    global _last_use
    _last_use = time.monotonic()


def idle() -> bool:
    return time.monotonic() - _last_use >= IDLE_SECONDS_BEFORE_OFFLINE


def set_online(value: bool) -> None:
    global online
    online = value
