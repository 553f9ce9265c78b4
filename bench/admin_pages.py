"""Admin page load times over a big message log: 1,000,000 messages and 5,000,000 history rows.

    .venv/bin/python -m bench.admin_pages

Starts PostgreSQL and Redis (unless DATABASE_URL / REDIS_URL are set; the data stays in
.local/bench-admin/ so a second run skips the fill), fills the log with generate_series
inserts, then times each admin page with a logged-in test client (Django and PostgreSQL, no
network): a warm-up, then the median and the worst of ROUNDS loads.
"""
import os
import statistics
import time

from tools.stack import LOCAL, Services, free_port, stored_secret

MESSAGES = 1_000_000
EVENTS_PER_MESSAGE = 5
TOPICS = 50
ROUNDS = 7

FILL_MESSAGES = f"""
INSERT INTO delayqueue_message (namespace, topic, msg_id, payload, produce_time, trigger_time, expire_time,
                                max_retry, retry, status, updated_at)
SELECT 'default', 'topic-' || (g % {TOPICS}), md5(g::text), 'payload of message ' || g,
       now() - g * interval '2.592 seconds',                      -- 30 days of traffic
       now() - g * interval '2.592 seconds' + (g % 600) * interval '1 second',
       now() - g * interval '2.592 seconds' + interval '1 hour',
       10, CASE WHEN g % 10 = 0 THEN 0 ELSE 1 END,
       CASE WHEN g <= 3000 THEN 1 + g % 3 WHEN g % 100 < 90 THEN 4 ELSE 5 + g % 3 END,
       now() - g * interval '2.592 seconds'
FROM generate_series(1, {MESSAGES}) g
"""

FILL_EVENTS = f"""
INSERT INTO delayqueue_messageevent (namespace, topic, msg_id, event_id, at, from_status, to_status, retry,
                                     reason, process, host)
SELECT m.namespace, m.topic, m.msg_id, (extract(epoch FROM m.produce_time) * 1000)::int8 || '-' || e,
       m.produce_time + e * interval '1 second', (ARRAY[0, 1, 2, 3, 2])[e + 1], (ARRAY[1, 2, 3, 2, 3])[e + 1],
       CASE WHEN e >= 2 THEN 1 ELSE 0 END, (ARRAY['sent', 'due', 'pulled', 'nacked', 'pulled'])[e + 1],
       'web pid 4242@bench', 'bench'
FROM delayqueue_message m, generate_series(0, {EVENTS_PER_MESSAGE - 1}) e
"""


def start_servers() -> Services:
    base = LOCAL / "bench-admin"
    base.mkdir(parents=True, exist_ok=True)
    # The filled log is kept for the next run, and with it the password it was made with.
    services = Services(base, durable=False, pg_password=stored_secret(base / "postgres.password"))
    if not os.environ.get("DATABASE_URL"):
        os.environ["DATABASE_URL"] = services.postgres(free_port())
    if not os.environ.get("REDIS_URL"):
        os.environ["REDIS_URL"] = services.single_redis()
    return services


def fill() -> None:
    from django.db import connection

    from delayqueue.messagelog.selectors import table_estimate
    from delayqueue.models import Message

    if table_estimate(Message, "default") >= MESSAGES * 0.9:
        print(f"message log already filled ({table_estimate(Message, 'default'):,} messages)")
        return
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE delayqueue_message, delayqueue_messageevent")
        for what, sql in (("messages", FILL_MESSAGES), ("history rows", FILL_EVENTS)):
            started = time.monotonic()
            cursor.execute(sql)
            print(f"inserted {cursor.rowcount:,} {what} in {time.monotonic() - started:.0f} s", flush=True)
        cursor.execute("VACUUM ANALYZE delayqueue_message")
        cursor.execute("VACUUM ANALYZE delayqueue_messageevent")


def register_topics() -> None:
    """The topic filter lists the Redis topic registry."""
    import redis

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    client.zadd("dq:ns:default:topics", {f"topic-{i}": i for i in range(TOPICS)})
    client.close()


def pages() -> list[tuple[str, str]]:
    from django.utils import timezone

    from delayqueue.models import Message

    target = Message.objects.filter(msg_id="c4ca4238a0b923820dcc509a6f75849b").only("pk", "produce_time").get()  # md5('1')
    day = timezone.localtime(target.produce_time)
    base = "/admin/delayqueue/message/"
    week = (timezone.now() - timezone.timedelta(days=7)).strftime("%Y-%m-%d+00:00:00%%2B00:00")
    return [
        ("list, newest first", base),
        ("list, page 200", base + "?p=200"),
        ("filter status=waiting (3,000 rows)", base + "?status__exact=1"),
        ("filter status=acked (~900,000 rows)", base + "?status__exact=4"),
        ("filter topic", base + "?topic=topic-7"),
        ("filter topic + status", base + "?topic=topic-7&status__exact=4"),
        ("filter produced in the past 7 days", base + f"?produce_time__gte={week}"),
        ("filter trigger time today", base + "?trigger_time__gte=" + day.strftime("%Y-%m-%d") + "+00%3A00%3A00%2B00%3A00"),
        ("date hierarchy: one day", base + f"?produce_time__day={day.day}&produce_time__month={day.month}"
                                           f"&produce_time__year={day.year}"),
        ("date hierarchy: one month", base + f"?produce_time__month={day.month}&produce_time__year={day.year}"),
        ("search msgId", base + "?q=c4ca4238a0b923820dcc509a6f75849b"),
        ("message page with history", f"{base}{target.pk}/change/"),
        ("topic dashboard", "/admin/dashboard/"),
    ]


def measure() -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.filter(username="bench").first() or User.objects.create_superuser("bench", "", "bench")
    client = Client()
    client.force_login(user)
    print(f"\n{'page':45} {'median ms':>10} {'worst ms':>10}")
    for name, url in pages():
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        timings = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            response = client.get(url)
            timings.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        print(f"{name:45} {statistics.median(timings):10.1f} {max(timings):10.1f}", flush=True)


def main() -> None:
    services = start_servers()
    try:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
        os.environ["ALLOWED_HOSTS"] = "testserver"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        fill()
        register_topics()
        measure()
    finally:
        services.stop()


if __name__ == "__main__":
    main()
