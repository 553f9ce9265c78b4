"""Dead letters in the message log: status-5 and 6 rows (sql.DEAD) of a topic that keeps them, in
the order they died (updated_at, id), and the redrive tasks that send them back (sql.py has the
statements; services/dead_letters.py lists, purges and starts redrives, workers/redriver.py runs
them)."""
from dataclasses import dataclass
from datetime import datetime

from delayqueue.core.constants import Status
from delayqueue.messagelog import sql


def parse_cursor(cursor: str | None) -> tuple[int | None, int]:
    """A page's position from the nextCursor an earlier page answered (validated by the API:
    digits, a dot, digits); none: the first page."""
    if not cursor:
        return None, 0
    micros, _, row_id = cursor.partition(".")
    return int(micros), int(row_id)


@dataclass
class Task:
    id: int
    topic: str
    msg_ids: list[str] | None
    max_per_second: int
    created_at: datetime
    after_time: datetime | None
    after_id: int
    moved: int
    sending: list | None
    done: bool

    def bounds(self, namespace: str, limit: int | None) -> dict:
        return {"namespace": namespace, "topic": self.topic, "msg_ids": self.msg_ids, "created_at": self.created_at,
                "after_time": self.after_time, "after_id": self.after_id, "limit": limit, "ready": Status.READY}


async def left_to_move(conn, *, namespace: str, task: Task) -> int:
    """How many dead letters an unfinished task has still to move."""
    counted = await conn.execute(sql.REDRIVE_LEFT, task.bounds(namespace, None))
    return (await counted.fetchone())[0]
