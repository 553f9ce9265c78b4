"""A namespace's push topics as its pushers use them: each one's push settings and signing
secrets, read from PostgreSQL on first use and every refreshed.REFRESH_SECONDS after (a
RefreshedTable, as the topic settings and limits are). Only pushers hold the secrets: the web
processes' topic settings (topic_settings.py) leave them out."""
from dataclasses import dataclass, field, replace

from delayqueue.core.constants import PUSH_MAX_CONCURRENCY, PUSH_MAX_TIMEOUT_MILLIS
from delayqueue.messagelog import sql
from delayqueue.stores.refreshed import RefreshedTable


@dataclass(frozen=True)
class PushTopic:
    push_url: str
    push_concurrency: int
    push_timeout_millis: int
    push_rate: int  # pushes started per second; 0: no limit
    # Kept out of reprs, and so out of any log line showing the settings.
    push_secret: str = field(repr=False)
    push_previous_secret: str = field(repr=False)
    push_previous_until: int  # epoch ms: the previous secret signs too until then
    push_secret_id: str  # which secret push_secret is (sql.PUSH_SECRET_ID): pull.lua matches the topic's

    def signing_secrets(self, now_millis: int) -> list[str]:
        """The secrets a push made at `now_millis` is signed with: the current one, and the
        previous one during a rotation's grace period."""
        secrets = [self.push_secret]
        if self.push_previous_secret and now_millis < self.push_previous_until:
            secrets.append(self.push_previous_secret)
        return secrets


class PushTopicCache(RefreshedTable):
    """Topic -> its PushTopic, for the topics with a push URL."""

    what = "push topics"
    reads = sql.PUSH_TOPIC_READS
    unread = "no topic is pushed"

    def entry(self, values: tuple) -> PushTopic | None:
        if not values[0]:  # no push URL: not pushed
            return None
        topic = PushTopic(*values)
        return replace(topic, push_concurrency=min(topic.push_concurrency, PUSH_MAX_CONCURRENCY),
                       push_timeout_millis=min(topic.push_timeout_millis, PUSH_MAX_TIMEOUT_MILLIS))
