"""The message log's tables as the models declare them (delayqueue/models.py) and every statement
names them (sql.py, the Spark jobs), without Django: their names, and the conditions of the
partial indexes, which a query must state in the same words for the planner to use the index."""
from dataclasses import dataclass

from delayqueue.core.constants import DEAD_STATUSES, LIVE_STATUSES, Status

MESSAGE = "delayqueue_message"
EVENT = "delayqueue_messageevent"
STATS = "delayqueue_topichourstats"
HISTORY_PRUNED = "delayqueue_historypruned"
LIMIT = "delayqueue_limit"
TOKEN = "delayqueue_apitoken"
TOPIC_CONFIG = "delayqueue_topicconfig"
REDRIVE = "delayqueue_redrivetask"
SCHEDULE = "delayqueue_schedule"
SCHEDULE_GAP = "delayqueue_schedulegap"
# Deleted limit and topic-settings rows, for the processes that read only what changed (no model: sql.SETTINGS_CHANGES).
SETTINGS_DELETION = "delayqueue_settingsdeletion"


@dataclass(frozen=True)
class StatusCondition:
    """A partial index's condition on a message's status: the model's index takes it as a Q's
    keywords, the statements as SQL, both rendered from these constants."""

    lookup: str  # Django's: "in", "gte" or "exact"
    value: int | tuple[int, ...]

    def q_keywords(self) -> dict:
        return {"status" if self.lookup == "exact" else f"status__{self.lookup}": self.value}

    def sql(self) -> str:
        if self.lookup == "in":
            return f"status IN ({', '.join(str(int(s)) for s in self.value)})"
        return f"status {'>=' if self.lookup == 'gte' else '='} {int(self.value)}"


# message_live: the restore's scan; message_ended: retention; message_dead: dead letters;
# message_waiting: the cold tier's loader.
LIVE = StatusCondition("in", tuple(int(s) for s in LIVE_STATUSES))
WAITING = StatusCondition("exact", int(Status.WAITING))
ENDED = StatusCondition("gte", int(Status.ACKED))
DEAD = StatusCondition("in", tuple(int(s) for s in DEAD_STATUSES))
