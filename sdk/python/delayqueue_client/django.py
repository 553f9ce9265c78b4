"""For Django applications: send a message only once the database transaction that decided it
commits (nothing is sent if it rolls back). The only module of delayqueue_client that imports Django."""
import threading
from typing import Any, Callable

from django.db import transaction  # type: ignore[import-untyped]  # Django ships no types

from delayqueue_client._calls import send_body
from delayqueue_client.client import Client
from delayqueue_client.message import new_msg_id

_default_client: Client | None = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The Client send_on_commit uses when given none: made on first use from DELAYQUEUE_URL and
    DELAYQUEUE_TOKEN, then shared by every thread of the process."""
    global _default_client
    with _default_lock:
        if _default_client is None:
            _default_client = Client()
        return _default_client


def send_on_commit(topic: str, msg: str, *, client: Client | None = None, using: str | None = None,
                   robust: bool = False, **send_kwargs: Any) -> str:
    """Sends `client.send(topic, msg, **send_kwargs)` when the transaction open on database `using`
    commits (at once when none is open, as transaction.on_commit does). Answers the msgId, made now
    when not given, so the caller can store it in the same transaction. A send that fails after the
    commit raises from the commit (or, with robust=True, is logged by Django and skipped)."""
    msg_id: str = send_kwargs.get("msg_id") or new_msg_id()
    send_kwargs["msg_id"] = msg_id
    send_body(topic, msg, **send_kwargs)  # a wrong argument fails here, in the caller, not after the commit
    sender = client or default_client()
    transaction.on_commit(lambda: sender.send(topic, msg, **send_kwargs), using=using, robust=robust)
    return msg_id


def run_on_commit(fn: Callable[[], object]) -> None:
    """Runs `fn` when the transaction open on the default database commits (the task layer's
    eager send_on_commit)."""
    transaction.on_commit(fn)
