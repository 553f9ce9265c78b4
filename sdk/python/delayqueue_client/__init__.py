"""delayqueue's Python client: Client, AsyncClient, the batching producer (Client.producer) and
one exception class per answer code, and the Worker that consumes a topic."""
from delayqueue_client._calls import DeadLetterPage
from delayqueue_client.client import AsyncClient, Client
from delayqueue_client.errors import (BadRequest, Conflict, DeadLetter, DelayQueueError, Forbidden, NotFound,
                                      RateLimited, Retry, ServerError, Unauthorized)
from delayqueue_client.message import Message
from delayqueue_client.producer import AsyncProducer, Producer
from delayqueue_client.signature import InvalidSignature, verify_signature
from delayqueue_client.worker import Worker

__all__ = ["AsyncClient", "AsyncProducer", "BadRequest", "Client", "Conflict", "DeadLetter", "DeadLetterPage", "DelayQueueError",
           "Forbidden", "InvalidSignature", "Message", "NotFound", "Producer", "RateLimited", "Retry", "ServerError",
           "Unauthorized", "Worker", "verify_signature"]
