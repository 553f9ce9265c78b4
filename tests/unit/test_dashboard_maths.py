"""The dashboard's arithmetic: one lateness series from many topics, a readable axis top, the
chart's lines broken where nothing fired, and the stuck/busy verdict."""
import pytest

from delayqueue.live.stats import Counter
from delayqueue.ops.dashboard import assess, chart, combine_series, nice_ceiling


def point(minute, count, avg=None, max_=None):
    return {"minute": minute, "count": count, "avg": avg, "max": max_}


def test_combine_series_adds_counts_weights_averages_and_takes_the_largest_maximum():
    a = {"lateness_series": [point(0, 2, 10.0, 15), point(1, 0), point(2, 1, 4.0, 4)]}
    b = {"lateness_series": [point(0, 6, 2.0, 30), point(1, 0), point(2, 0)]}
    assert combine_series([a, b]) == [
        point(0, 8, (2 * 10 + 6 * 2) / 8, 30),
        point(1, 0, None, None),  # nothing fired anywhere: no average, no maximum
        point(2, 1, 4.0, 4),
    ]
    assert combine_series([]) == []


@pytest.mark.parametrize("value, top", [(0, 1), (0.3, 1), (1, 1), (1.01, 2), (2, 2), (3, 5), (5, 5), (6, 10),
                                        (10, 10), (11, 20), (99, 100), (101, 200), (4_999, 5_000), (50_001, 100_000)])
def test_nice_ceiling_is_the_smallest_1_2_5_step_at_or_above(value, top):
    assert nice_ceiling(value) == top


def test_chart_scales_to_the_axis_top_and_breaks_lines_where_nothing_fired():
    series = [point(0, 1, 20.0, 40), point(1, 2, 30.0, 50), point(2, 0), point(3, 1, 10.0, 10), point(4, 0)]
    drawn = chart(series, width=400, height=100)
    assert drawn["top_ms"] == 50 and drawn["promoted"] == 4 and drawn["worst_ms"] == 50
    # x: 100 px per minute; y: 0 at the top (50 ms), 100 at the bottom (0 ms)
    assert drawn["max"]["polylines"] == ["0.0,20.0 100.0,0.0"]
    assert drawn["avg"]["polylines"] == ["0.0,60.0 100.0,40.0"]
    assert drawn["max"]["dots"] == [(300.0, 80.0)] and drawn["avg"]["dots"] == [(300.0, 80.0)]


def test_chart_of_a_quiet_hour_has_no_lines_and_an_axis_of_one():
    drawn = chart([point(m, 0) for m in range(60)], width=720, height=180)
    assert drawn["top_ms"] == 1 and drawn["promoted"] == 0 and drawn["worst_ms"] is None
    assert drawn["avg"] == drawn["max"] == {"polylines": [], "dots": []}


def overview(ready=0, pulled=0, overdue=0, oldest_ready_age_ms=0, interval_seconds=60, paused=False):
    return {"ready": ready, "last_interval": {Counter.PULL: pulled}, "overdue": overdue,
            "oldest_ready_age_ms": oldest_ready_age_ms, "interval_seconds": interval_seconds, "paused": paused}


def test_assess_flags_overdue_messages_as_stuck_first():
    state, why = assess(overview(ready=100, pulled=1, overdue=3))
    assert state == "stuck" and "3 due messages" in why


def test_assess_flags_ready_messages_nobody_pulled_for_an_interval_as_stuck():
    state, why = assess(overview(ready=4, oldest_ready_age_ms=61_000))
    assert state == "stuck" and "4 ready, the oldest for 61 s" in why
    assert assess(overview(ready=4, oldest_ready_age_ms=60_000))[0] == "busy"  # not a whole interval yet


def test_assess_calls_a_backlog_larger_than_the_last_intervals_pulls_busy():
    assert assess(overview(ready=11, pulled=10, oldest_ready_age_ms=120_000)) == (
        "busy", "ready backlog 11 > 10 pulled last interval")
    assert assess(overview(ready=10, pulled=10, oldest_ready_age_ms=120_000)) == ("ok", "")
    assert assess(overview()) == ("ok", "")


def test_assess_takes_a_paused_topics_held_ready_messages_for_neither_stuck_nor_busy():
    """pauseTopic holds them on purpose: no consumer is missing. Due messages not promoted still are
    stuck (a pause does not stop promotions)."""
    assert assess(overview(ready=4, oldest_ready_age_ms=61_000, paused=True)) == (
        "ok", "paused: its 4 ready wait for resumeTopic")
    assert assess(overview(ready=11, pulled=10, paused=True))[0] == "ok"
    assert assess(overview(ready=1, overdue=3, paused=True))[0] == "stuck"
