"""Push figures per topic, as the pushers count them in the namespace's `pushes` hash and
/metrics and the dashboard read them: pushes answered 2xx, failed attempts by status, and the
lateness of each 2xx answer (its arrival minus the message's triggerTime) in the fire-lateness
buckets (constants.LATENESS_BOUNDS_MS). A pusher adds its counts about once a second
(HINCRBY: any number of pushers on any number of hosts add up)."""
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field

from delayqueue.core.constants import LATENESS_BOUNDS_MS

_PUSHED, _FAILED, _LATE, _LATE_SUM = "pushed", "failed", "late", "late_sum"


def pushed_fields(topic: str, lateness_ms: int) -> list[str]:
    """The fields one 2xx answer adds 1 to; its lateness goes to `lateness_field`."""
    bucket = bisect_left(LATENESS_BOUNDS_MS, lateness_ms)
    return [f"{_PUSHED}\t{topic}", f"{_LATE}\t{topic}\t{bucket}"]


def lateness_field(topic: str) -> str:
    return f"{_LATE_SUM}\t{topic}"


def failed_field(topic: str, status: str) -> str:
    return f"{_FAILED}\t{topic}\t{status}"


@dataclass
class TopicPushFigures:
    pushed: int = 0
    failures: Counter = field(default_factory=Counter)  # status ("500", "timeout", ...) -> failed attempts
    lateness_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENESS_BOUNDS_MS) + 1))
    lateness_sum_ms: int = 0

    @property
    def lateness_buckets(self) -> list[tuple[int | None, int]]:
        """(upper bound in ms, None past the last; count) per bucket, as figures' fire lateness."""
        return list(zip([*LATENESS_BOUNDS_MS, None], self.lateness_counts))


def topic_figures(counts: dict[str, str]) -> dict[str, TopicPushFigures]:
    """Topic -> its figures, from the `pushes` hash."""
    topics: dict[str, TopicPushFigures] = {}
    for name, value in counts.items():
        kind, _, rest = name.partition("\t")
        n = int(value)
        if kind == _PUSHED:
            topics.setdefault(rest, TopicPushFigures()).pushed += n
        elif kind == _LATE_SUM:
            topics.setdefault(rest, TopicPushFigures()).lateness_sum_ms += n
        elif kind in (_FAILED, _LATE):
            topic, _, detail = rest.rpartition("\t")
            figures = topics.setdefault(topic, TopicPushFigures())
            if kind == _FAILED:
                figures.failures[detail] += n
            else:
                figures.lateness_counts[int(detail)] += n
    return topics


def bucket_quantile(buckets: list[tuple[int | None, int]], q: float) -> int | None:
    """The upper bound (ms) of the bucket holding the q-quantile (0 < q <= 1) of a histogram
    given as (bound, count) pairs; None when it is empty or falls past the last bound."""
    total = sum(count for _, count in buckets)
    if not total:
        return None
    seen = 0
    for bound, count in buckets:
        seen += count
        if seen >= q * total:
            return bound
    return None
