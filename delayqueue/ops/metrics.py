"""GET /metrics in Prometheus' text format. Every figure is read from Redis at scrape time
(the scripts count there), so it is the same whichever process is scraped and covers every
web and scanner process; no process keeps counters of its own. It covers every served
namespace (tokens.read_served_namespaces), each series labelled with its namespace. Dead letters and
redrive progress live in the message log: read with one connection per database and scrape (two
statements for all its namespaces and topics at once, and one per running redrive), and left out,
with the failure logged, for the namespaces of a database that does not answer."""
import asyncio
from dataclasses import dataclass

from django.http import HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from redis.exceptions import RedisError

from delayqueue.api.wire import WAITING_BUCKET_NAMES
from delayqueue.config.settings import DEFAULT_DATABASE
from delayqueue.core.exceptions import LogUnavailable, log_failure, redis_reason
from delayqueue.messagelog.connection import LogConnection
from delayqueue.messagelog.routing import by_database
from delayqueue.ops import figures
from delayqueue.runtime import Runtime, current
from delayqueue.services.admission import throttled_counts
from delayqueue.services.topics import list_topics
from delayqueue.stores.tokens import read_served_namespaces


@dataclass(frozen=True)
class NamespaceFigures:
    namespace: str
    overviews: list[dict]
    scanner_lags: dict[str, float]
    data_lost_millis: int
    throttled: dict[tuple[str, str], int]  # (limit, topic) -> messages refused or held by it


async def namespace_figures(rt: Runtime) -> NamespaceFigures:
    overviews = await figures.topic_overview(rt, topics=await list_topics(rt))
    lags = await figures.scanner_lags(rt)
    data_lost = int(await rt.redis.get(rt.ns.data_lost) or 0)
    throttled = throttled_counts(await rt.redis.hgetall(rt.ns.throttled))
    return NamespaceFigures(rt.ns.namespace, overviews, lags, data_lost, throttled)


class Snapshot:
    """A prometheus_client collector over figures already read from Redis, every series
    labelled with its namespace."""

    def __init__(self, namespaces: list[NamespaceFigures], dead: dict[tuple[str, str], int],
                 counted: set[str], redrives: list[figures.RunningRedrive] = ()):
        self.namespaces = namespaces
        self.dead = dead
        self.counted = counted  # the namespaces whose dead letters were read (their database answered)
        self.redrives = redrives

    def collect(self):
        requests = CounterMetricFamily(
            "delayqueue_requests", "Requests and scanner events per topic since the topic was registered "
            "(camellia's request types; pullMsg counts messages delivered)", labels=["namespace", "topic", "type"])
        sizes = GaugeMetricFamily("delayqueue_queue_size", "Messages per queue structure (waiting: in Redis and in "
                                  "the message log only; cold: those in the log only)",
                                  labels=["namespace", "topic", "queue"])
        hot_ahead = GaugeMetricFamily("delayqueue_hot_window_ahead_seconds", "The cold tier: how far ahead of now "
                                      "Redis holds every waiting message of the topic (the loader's hot_until)",
                                      labels=["namespace", "topic"])
        waiting = GaugeMetricFamily("delayqueue_waiting_messages", "Waiting messages by time until due "
                                    "(getTopicInfo's buckets)", labels=["namespace", "topic", "due_in"])
        overdue = GaugeMetricFamily("delayqueue_overdue_messages", "Waiting messages more than "
                                    f"{figures.OVERDUE_MILLIS} ms past their triggerTime", labels=["namespace", "topic"])
        oldest = GaugeMetricFamily("delayqueue_oldest_ready_age_seconds", "How long the oldest ready message "
                                   "has been due (0 when none is ready)", labels=["namespace", "topic"])
        backlog = GaugeMetricFamily("delayqueue_log_writer_backlog", "Entries of the topic's event stream not "
                                    "yet written to the PostgreSQL message log (an entry holds the lifecycle events "
                                    "of one script call: one pull, promotion or ack of many)",
                                    labels=["namespace", "topic"])
        lateness = HistogramMetricFamily(
            "delayqueue_fire_lateness_seconds", "Promotion to ready minus triggerTime, per promoted message",
            labels=["namespace", "topic"])
        topics = GaugeMetricFamily("delayqueue_topics", "Registered topics", labels=["namespace"])
        lag = GaugeMetricFamily("delayqueue_scanner_loop_lag_seconds", "Worst event-loop lag of each running "
                                "scanner over its last report period", labels=["namespace", "scanner"])
        lost = GaugeMetricFamily("delayqueue_redis_data_lost_timestamp_seconds", "When a scanner found that Redis "
                                 "had lost its data (0: never, or answered by a full manage.py restore)",
                                 labels=["namespace"])
        throttled = CounterMetricFamily(
            "delayqueue_throttled", "Messages a rate limit or live-message cap refused (code 429), or held (a "
            "long poll over its consume rate), by limit and whose it is (topic \"\": the namespace's own)",
            labels=["namespace", "topic", "limit"])
        paused = GaugeMetricFamily("delayqueue_topic_paused", "1 while the topic is paused (pauseTopic)",
                                   labels=["namespace", "topic"])
        dead = GaugeMetricFamily("delayqueue_dead_letters", "Dead letters (status 5 or 6) of the topic kept in the "
                                 "message log", labels=["namespace", "topic"])
        pushes = CounterMetricFamily("delayqueue_pushes", "Push attempts answered 2xx (the message acked)",
                                     labels=["namespace", "topic"])
        push_failures = CounterMetricFamily(
            "delayqueue_push_failures", "Push attempts that failed, by the answer's HTTP status or \"timeout\", "
            "\"connection\" or \"refused\" (an address DELAYQUEUE_PUSH_ALLOWED_HOSTS does not allow)",
            labels=["namespace", "topic", "status"])
        push_lateness = HistogramMetricFamily(
            "delayqueue_push_lateness_seconds", "A 2xx push answer's arrival minus the message's triggerTime",
            labels=["namespace", "topic"])
        push_in_flight = GaugeMetricFamily("delayqueue_push_in_flight", "Pushes in flight now (every pusher)",
                                           labels=["namespace", "topic"])
        redrive_moved = GaugeMetricFamily("delayqueue_redrive_moved", "Dead letters a running redrive has sent back",
                                          labels=["namespace", "topic", "task"])
        redrive_left = GaugeMetricFamily("delayqueue_redrive_left", "Dead letters a running redrive has still to "
                                         "send back", labels=["namespace", "topic", "task"])
        for task in self.redrives:
            redrive_moved.add_metric([task.namespace, task.topic, str(task.task_id)], task.moved)
            redrive_left.add_metric([task.namespace, task.topic, str(task.task_id)], task.left)
        for figured in self.namespaces:
            ns = figured.namespace
            for (limit, topic), count in sorted(figured.throttled.items()):
                throttled.add_metric([ns, topic, limit], count)
            for o in figured.overviews:
                topic = o["topic"]
                for counter, total in o["totals"].items():
                    requests.add_metric([ns, topic, counter], total)
                sizes.add_metric([ns, topic, "waiting"], o["waiting"])
                sizes.add_metric([ns, topic, "ready"], o["ready"])
                sizes.add_metric([ns, topic, "inflight"], o["consuming"])
                sizes.add_metric([ns, topic, "cold"], o["waiting_cold"])
                if o["hot_ahead_ms"] is not None:
                    hot_ahead.add_metric([ns, topic], o["hot_ahead_ms"] / 1000)
                for name, count in zip(WAITING_BUCKET_NAMES, o["waiting_within"]):
                    waiting.add_metric([ns, topic, name.removeprefix("sizeOf")], count)
                overdue.add_metric([ns, topic], o["overdue"])
                backlog.add_metric([ns, topic], o["log_backlog"])
                oldest.add_metric([ns, topic], o["oldest_ready_age_ms"] / 1000)
                paused.add_metric([ns, topic], int(o["paused"]))
                buckets = cumulative_buckets(o["lateness_buckets"])
                lateness.add_metric([ns, topic], buckets, o["lateness_sum_ms"] / 1000)
                push = o["push"]
                if push is not None:
                    pushes.add_metric([ns, topic], push["pushed"])
                    for status, count in push["failures"]:
                        push_failures.add_metric([ns, topic, status], count)
                    push_lateness.add_metric([ns, topic], cumulative_buckets(push["lateness_buckets"]),
                                             push["lateness_sum_ms"] / 1000)
                    push_in_flight.add_metric([ns, topic], push["in_flight"])
            topics.add_metric([ns], len(figured.overviews))
            for token, millis in sorted(figured.scanner_lags.items()):
                lag.add_metric([ns, token], millis / 1000)
            lost.add_metric([ns], figured.data_lost_millis / 1000)
        # Every registered topic (0 if none), and topics no longer registered that still have some.
        counts = {(f.namespace, o["topic"]): 0 for f in self.namespaces if f.namespace in self.counted
                  for o in f.overviews} | self.dead
        for (ns, topic), count in sorted(counts.items()):
            dead.add_metric([ns, topic], count)
        yield from (requests, sizes, hot_ahead, waiting, overdue, oldest, backlog, lateness, topics, lag, lost, throttled,
                    paused, pushes, push_failures, push_lateness, push_in_flight, redrive_moved, redrive_left, dead)


def cumulative_buckets(buckets: list[tuple[int | None, int]]) -> list[tuple[str, int]]:
    """(bound ms or None, count) pairs as Prometheus' cumulative (le seconds, count) buckets."""
    cumulative, out = 0, []
    for bound, count in buckets:
        cumulative += count
        out.append(("+Inf" if bound is None else repr(bound / 1000), cumulative))
    return out


async def metrics(request):
    rt = current()
    # Not the ORM's served_namespaces: its connection has no timeout, and a PostgreSQL that does not
    # answer would hold the scrape (and the thread every sync_to_async call waits for).
    tokens = LogConnection(rt.config.log_timeout_millis, DEFAULT_DATABASE)
    try:
        namespaces = await read_served_namespaces(rt.config.namespace, tokens)
    finally:
        await tokens.close()
    figured = await asyncio.gather(*(namespace_figures(rt.for_namespace(ns)) for ns in namespaces),
                                   return_exceptions=True)  # every read ended before answering
    try:
        for result in figured:
            if isinstance(result, BaseException):
                raise result
    except RedisError as exc:  # what failed, not where (a scraper may be anyone): the where goes to the log
        log_failure("/metrics", f"Redis unavailable: {exc}")
        return HttpResponse(f"# Redis unavailable: {redis_reason(exc)}\n", status=503, content_type="text/plain")
    dead, counted, redrives = {}, set(), []
    # Database by database: one that does not answer leaves out its namespaces' figures alone.
    for in_database in by_database(namespaces).values():
        try:
            found, running = await figures.log_figures(rt, namespaces=in_database)
        except LogUnavailable as exc:
            log_failure("/metrics' dead letters", str(exc))
            continue
        dead |= found
        counted.update(in_database)
        redrives += running
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Snapshot(list(figured), dead, counted, redrives))
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
