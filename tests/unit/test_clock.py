"""How long a scanner sleeps on Redis' "µs until the next is due": until the due time by Redis'
clock, never later than waiting that long from the answer, never earlier than the round trip
allows."""
from delayqueue.core.clock import wait_seconds

SENT = 1_000.0  # this process' time.time() when the call left


def test_a_slow_answer_is_not_added_to_the_wait():
    # Redis ran the script 1 ms after the call left; its answer took 5 ms more to be read.
    ran = SENT + 0.001
    wait = wait_seconds(due_in_us=10_000, server_now_us=int(ran * 1_000_000), sent_at=SENT, received_at=ran + 0.005)
    assert abs(wait - 0.005) < 1e-6  # due at ran + 10 ms, which is 5 ms after the answer
    # Waiting the 10 ms from the answer, as a sleep on the reply alone would, wakes 5 ms late.


def test_a_due_time_passed_while_the_answer_came_back_is_due_now():
    ran = SENT + 0.0001
    wait = wait_seconds(due_in_us=200, server_now_us=int(ran * 1_000_000), sent_at=SENT, received_at=ran + 0.003)
    assert wait <= 0


def test_a_server_clock_behind_ours_wakes_no_earlier_than_the_round_trip_allows():
    # Redis' clock runs 60 s behind: read as ours, the due time would look long past.
    wait = wait_seconds(due_in_us=50_000, server_now_us=int((SENT - 60) * 1_000_000), sent_at=SENT,
                        received_at=SENT + 0.002)
    assert abs(wait - 0.048) < 1e-6  # as if the script ran as the call left: 2 ms early at most


def test_a_server_clock_ahead_of_ours_wakes_no_later_than_the_answer_allows():
    wait = wait_seconds(due_in_us=50_000, server_now_us=int((SENT + 60) * 1_000_000), sent_at=SENT,
                        received_at=SENT + 0.002)
    assert abs(wait - 0.05) < 1e-6  # the wait from the answer, as before


def test_one_clock_and_an_instant_answer_wait_exactly_what_redis_said():
    wait = wait_seconds(due_in_us=1_234_567, server_now_us=int(SENT * 1_000_000), sent_at=SENT, received_at=SENT)
    assert abs(wait - 1.234567) < 1e-6
