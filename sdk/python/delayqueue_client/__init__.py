"""delayqueue's Python client: Client, AsyncClient, the batching producer (Client.producer), one
exception class per answer code (and Unavailable / MaybeApplied / NotTheAPI for calls that got no
answer of the API), the Worker that consumes topics, the task layer (App), and schedules (recurring
messages)."""
from delayqueue_client._calls import DeadLetterPage
from delayqueue_client.app import App, EagerHandle, Task, TaskHandle, TaskStatus, schedule_id_for
from delayqueue_client.client import AsyncClient, Client
from delayqueue_client.errors import (BadRequest, Conflict, DeadLetter, DelayQueueError, Forbidden, MaybeApplied,
                                      NotFound, NotTheAPI, RateLimited, Retry, ServerError, Unauthorized,
                                      Unavailable)
from delayqueue_client.envelope import EnvelopeError, TaskTooLarge
from delayqueue_client.message import Message
from delayqueue_client.producer import AsyncProducer, Producer, ProducerFull, ProducerTimeout
from delayqueue_client.schedule import Schedule, SchedulePage
from delayqueue_client.signature import InvalidSignature, verify_signature
from delayqueue_client.worker import Worker

__all__ = ["App", "AsyncClient", "AsyncProducer", "BadRequest", "Client", "Conflict", "DeadLetter", "DeadLetterPage",
           "DelayQueueError", "EagerHandle", "EnvelopeError", "Forbidden", "InvalidSignature", "MaybeApplied", "Message",
           "NotFound", "NotTheAPI", "Producer", "ProducerFull", "ProducerTimeout", "RateLimited", "Retry",
           "Schedule", "SchedulePage", "ServerError", "Task", "TaskHandle", "TaskStatus", "TaskTooLarge",
           "Unauthorized", "Unavailable", "Worker", "schedule_id_for", "verify_signature"]
