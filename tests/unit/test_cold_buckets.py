"""getTopicInfo's waiting buckets for cold messages, from their counts per hour (services/topics.py)."""
from delayqueue.core.constants import COLD_HOUR_MILLIS
from delayqueue.services.topics import WAITING_WITHIN, cold_buckets

HOUR, DAY = COLD_HOUR_MILLIS, 24 * COLD_HOUR_MILLIS
NOW = 1_000 * DAY  # on an hour's edge


def bucket(name_index: int, count: int) -> list[int]:
    counts = [0] * len(WAITING_WITHIN)
    counts[name_index] = count
    return counts


def test_an_hour_counts_where_its_middle_falls():
    hour = (NOW + 2 * HOUR) // HOUR  # 2:00-3:00 ahead: its middle 2.5 h ahead, in "1 to 6 hours"
    assert cold_buckets(hours={hour: 7}, now=NOW, after=None) == bucket(4, 7)
    hour = (NOW + 6 * HOUR) // HOUR  # 6:00-7:00 ahead: "6 hours to 1 day"
    assert cold_buckets(hours={hour: 2}, now=NOW, after=None) == bucket(5, 2)


def test_an_hour_that_began_before_the_window_ended_counts_after_it():
    """Every cold message is due after the loader's loaded_to: the hour 0:15-1:15 ahead, loaded
    to 1:10, counts in "1 to 6 hours", not where its middle (0:45, "30 minutes to 1 hour") falls."""
    now = NOW - 15 * 60_000
    assert cold_buckets(hours={NOW // HOUR: 3}, now=now, after=None) == bucket(3, 3)
    assert cold_buckets(hours={NOW // HOUR: 3}, now=now, after=now + 70 * 60_000) == bucket(4, 3)


def test_beyond_thirty_days_and_several_hours_at_once():
    hours = {(NOW + 45 * DAY) // HOUR: 4, (NOW + 3 * DAY) // HOUR: 1, (NOW + 3 * DAY + HOUR) // HOUR: 2}
    assert cold_buckets(hours=hours, now=NOW, after=NOW + HOUR) == [0, 0, 0, 0, 0, 0, 3, 0, 4]
    assert cold_buckets(hours={}, now=NOW, after=None) == [0] * len(WAITING_WITHIN)
