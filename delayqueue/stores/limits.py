"""Rate limits and live-message caps as each process holds them in force: the operator sets them
in PostgreSQL (the Limit model: the admin, `manage.py set_limits`, stores/rows.py), and each
Runtime reads its namespace's on first use and every refreshed.REFRESH_SECONDS after (LimitCache),
so a change takes effect on every web process within a second, and a namespace without limits
costs a send or a pull one empty-table test. services/admission.py enforces them.

Reading fails open: while PostgreSQL cannot be read, the last limits read stay in force (none,
in a process that has not read them yet) and the log says so once."""
from dataclasses import dataclass

from delayqueue.messagelog import sql
from delayqueue.stores.refreshed import RefreshedTable

# The `topic` of a namespace's own limits (a topic name is never empty).
NAMESPACE = ""


@dataclass(frozen=True)
class Limits:
    produce_rate: int = 0  # messages/s sent; 0: no limit
    consume_rate: int = 0  # messages/s handed out; 0: no limit
    max_live: int = 0  # live messages (waiting, ready, consuming); 0: no cap


class LimitCache(RefreshedTable):
    """One namespace's limits: topic -> its Limits, and NAMESPACE -> the namespace's; empty when none is set."""

    what = "limits"
    reads = sql.LIMIT_READS
    unread = "none are in force"

    def entry(self, values: tuple) -> Limits | None:
        return Limits(*values) if any(values) else None
