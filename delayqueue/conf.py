"""The queue's settings as one immutable object, read from settings.DELAYQUEUE."""
from dataclasses import dataclass, fields, replace

from django.conf import settings


@dataclass(frozen=True)
class QueueConfig:
    namespace: str = "default"
    ttl_millis: int = 3_600_000
    max_retry: int = 10
    ack_timeout_millis: int = 30_000
    pull_batch: int = 1
    max_pull_batch: int = 1000
    long_polling_timeout_millis: int = 10_000
    max_long_polling_timeout_millis: int = 60_000
    ended_retention_millis: int = 300_000
    max_msg_bytes: int = 65_536
    max_batch_send: int = 1000
    monitor_interval_seconds: int = 60
    scanner_lock_ttl_millis: int = 5_000
    scanner_batch: int = 1000
    topic_idle_seconds: int = 1800
    topic_check_seconds: int = 600
    message_log: bool = True
    log_writer_interval_millis: int = 100
    log_writer_batch: int = 5000
    log_retention_days: int = 7
    log_timeout_millis: int = 30_000
    redis_url: str = "redis://127.0.0.1:16379/0"
    redis_timeout_millis: int = 10_000

    @property
    def redis_timeout(self) -> float:
        return self.redis_timeout_millis / 1000

    @property
    def monitor_interval_millis(self) -> int:
        return self.monitor_interval_seconds * 1000

    def with_overrides(self, **changes) -> "QueueConfig":
        return replace(self, **changes)


def load_config() -> QueueConfig:
    names = {f.name for f in fields(QueueConfig)}
    values = {key.lower(): value for key, value in settings.DELAYQUEUE.items() if key.lower() in names}
    return QueueConfig(redis_url=settings.REDIS_URL, **values)
