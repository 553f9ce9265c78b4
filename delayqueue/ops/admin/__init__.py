"""The Django admin's pages over the message log and the operator data; importing this package
registers them (apps.DelayQueueConfig.ready)."""
from delayqueue.ops.admin import messages, topics  # noqa: F401
