"""The topic dashboard (staff only, linked from the admin index): every topic's queue sizes,
waiting-delay buckets, request rates, and a drawn chart of fire lateness over the last hour,
for one served namespace at a time (`?namespace=`, DELAYQUEUE_NAMESPACE by default). A stuck
or busy topic is flagged and sorted to the top. Each topic's dead letters (counted in the log)
and pause are shown with it, and the namespace's running redrives with their progress.

What the topic pages show, so for staff with the view (or change) permission on topic settings
alone; the Spark job's hourly figures only with the one on them, as their admin list."""
import hashlib

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.shortcuts import render
from redis.exceptions import RedisError

from delayqueue.api.validation import TopicSerializer, first_error
from delayqueue.config.settings import load_config
from delayqueue.core.clock import from_millis
from delayqueue.core.constants import CHART_MINUTES, LATENESS_BOUNDS_MS
from delayqueue.core.exceptions import LogUnavailable
from delayqueue.core.names import checked_namespace
from delayqueue.live.stats import Counter
from delayqueue.messagelog.connection import orm_unavailable
from delayqueue.messagelog.selectors import recent_topic_hours
from delayqueue.models import TopicConfig, TopicHourStats
from delayqueue.ops import figures
from delayqueue.ops.admin.topics import topic_url
from delayqueue.runtime import run_with_runtime
from delayqueue.services.topics import list_topics
from delayqueue.stores.rows import served_namespaces

CHART_WIDTH, CHART_HEIGHT = 720, 180
# getTopicInfo's nine buckets (services.topics.WAITING_WITHIN), as column headings: due in ...
BUCKET_LABELS = ("≤1m", "1–10m", "10–30m", "30m–1h", "1–6h", "6h–1d", "1–7d", "7–30d", ">30d")
SPARK_WIDTH, SPARK_HEIGHT = 180, 36
# The page's Redis figures (every topic scanned) are shared for this long: several staff reloading
# it cost one scan. /metrics reads Redis at every scrape.
FIGURES_SECONDS = 2


def combine_series(overviews: list[dict]) -> list[dict]:
    """All topics' per-minute lateness as one series: counts and sums add up, maxima take the max."""
    combined = []
    for points in zip(*(o["lateness_series"] for o in overviews)):
        count = sum(p["count"] for p in points)
        total = sum(p["avg"] * p["count"] for p in points if p["count"])
        combined.append({
            "minute": points[0]["minute"],
            "count": count,
            "avg": total / count if count else None,
            "max": max((p["max"] for p in points if p["count"]), default=None),
        })
    return combined


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^n at or above value (an axis top people can read)."""
    step = 1.0
    while step * 10 <= value:
        step *= 10
    for factor in (1, 2, 5, 10):
        if value <= step * factor:
            return step * factor
    return step * 10


def chart(series: list[dict], width: int, height: int) -> dict:
    """SVG polylines of per-minute average and maximum lateness; minutes without promotions
    break the lines (nothing fired, so nothing was late)."""
    top = nice_ceiling(max([p["max"] for p in series if p["max"] is not None] + [1]))
    step = width / max(len(series) - 1, 1)

    def lines(key):
        segments, current = [], []
        for i, point in enumerate(series):
            if point[key] is None:
                if current:
                    segments.append(current)
                current = []
                continue
            current.append((round(i * step, 1), round(height - point[key] / top * height, 1)))
        if current:
            segments.append(current)
        # A minute alone between gaps is drawn as a dot: a one-point polyline shows nothing.
        return {
            "polylines": [" ".join(f"{x},{y}" for x, y in s) for s in segments if len(s) > 1],
            "dots": [s[0] for s in segments if len(s) == 1],
        }

    return {
        "width": width, "height": height, "top_ms": top,
        "avg": lines("avg"), "max": lines("max"),
        "promoted": sum(p["count"] for p in series),
        "worst_ms": max((p["max"] for p in series if p["max"] is not None), default=None),
    }


def assess(overview: dict) -> tuple[str, str]:
    """('stuck' | 'busy' | 'ok', why). Stuck: due messages are not promoted (no scanner holds
    the topic), or a ready message has waited a whole monitor interval with nothing pulled
    meanwhile (no consumers). Busy: the ready backlog is more than consumers took in the last
    interval. A paused topic's ready messages are held on purpose: neither."""
    last = overview["last_interval"]
    ready, pulled = overview["ready"], last[Counter.PULL]
    if overview["overdue"]:
        return "stuck", f"{overview['overdue']} due messages still waiting (is a scanner running?)"
    if overview["paused"]:
        return "ok", f"paused: its {ready} ready wait for resumeTopic" if ready else ""
    if ready and not pulled and overview["oldest_ready_age_ms"] > overview["interval_seconds"] * 1000:
        waited = overview["oldest_ready_age_ms"] // 1000
        return "stuck", f"{ready} ready, the oldest for {waited} s, none pulled in the last interval (no consumers?)"
    if ready > pulled:
        return "busy", f"ready backlog {ready} > {pulled} pulled last interval"
    return "ok", ""


SEVERITY = {"stuck": 0, "busy": 1, "ok": 2}


@staff_member_required
def dashboard(request):
    if not admin.site.get_model_admin(TopicConfig).has_view_or_change_permission(request):
        raise PermissionDenied
    config = load_config()
    served = served_namespaces()
    errors, namespace, wanted = [], request.GET.get("namespace", config.namespace), request.GET.get("topic")
    try:
        checked_namespace(namespace)
    except ValueError as exc:
        errors.append(f"namespace: {exc}")
        namespace = config.namespace
    if wanted is not None:
        serializer = TopicSerializer(data={"topic": wanted})
        if not serializer.is_valid():
            errors.append(first_error(serializer.errors))
            wanted = None

    async def load(root):
        # Keyed by namespace and by topic: its digest, as a topic may be up to 255 bytes of any
        # text, more than a portable cache key takes (every topic: "all"). The data-lost mark is
        # one cheap read, and news that must not wait.
        rt = root.for_namespace(namespace)
        topic_key = f"topic:{hashlib.sha256(wanted.encode()).hexdigest()}" if wanted else "all"
        key = f"dashboard:{rt.ns.namespace}:{topic_key}"
        overviews = await cache.aget(key)
        if overviews is None:
            topics = [wanted] if wanted else await list_topics(rt)
            overviews = await figures.topic_overview(rt, topics=topics)
            await cache.aset(key, overviews, FIGURES_SECONDS)
        return overviews, await rt.redis.get(rt.ns.data_lost)

    data_lost_at = None
    try:
        overviews, data_lost = run_with_runtime(load)
    except RedisError as exc:
        overviews = []
        errors.append(f"Redis unavailable: {exc}")
    else:
        if data_lost:  # a scanner found Redis had lost its data, and no full restore has run since
            data_lost_at = from_millis(int(data_lost))
    try:
        dead, redrives = run_with_runtime(figures.log_figures, namespaces=[namespace], topic=wanted)
    except LogUnavailable as exc:
        dead, redrives = None, []
        errors.append(f"dead letters not counted: {exc}")
    hourly = []
    if admin.site.get_model_admin(TopicHourStats).has_view_or_change_permission(request):
        try:
            hourly = recent_topic_hours(namespace, wanted)
        except DatabaseError as exc:  # the namespace's PostgreSQL (its own: DELAYQUEUE_NAMESPACE_DATABASES) down
            errors.append(f"hourly stats not read: {orm_unavailable(exc)}")
    rows = []
    for overview in overviews:
        state, why = assess(overview)
        seconds = overview["interval_seconds"]
        rows.append({
            **overview,
            "state": state,
            "why": why,
            "buckets": overview["waiting_within"],
            "rates": {counter: overview["last_interval"][counter] / seconds
                      for counter in (Counter.SEND, Counter.PULL, Counter.ACK)},
            "spark": chart(overview["lateness_series"], SPARK_WIDTH, SPARK_HEIGHT),
            "dead": None if dead is None else dead.get((namespace, overview["topic"]), 0),
            "page": topic_url("topic", namespace, overview["topic"]),
            "dead_page": topic_url("deadletters", namespace, overview["topic"]),
        })
    rows.sort(key=lambda r: (SEVERITY[r["state"]], r["topic"]))
    context = {
        **admin.site.each_context(request),
        "title": f"Topic dashboard: namespace {namespace}",
        "rows": rows,
        "bucket_names": BUCKET_LABELS,
        "chart": chart(combine_series(overviews), CHART_WIDTH, CHART_HEIGHT) if overviews else None,
        "chart_minutes": CHART_MINUTES,
        "namespace": namespace,
        # A namespace typed into the URL that no token serves is still shown (its Redis keys may hold messages).
        "namespaces": served if namespace in served else [*served, namespace],
        "topic": wanted,
        "errors": errors,
        "data_lost_at": data_lost_at,
        "stuck": sum(r["state"] == "stuck" for r in rows),
        "paused": sum(r["paused"] for r in rows),
        "redrives": redrives,
        "pushes": [r for r in rows if r["push"] is not None],
        "last_lateness_bound_ms": LATENESS_BOUNDS_MS[-1],
        "busy": sum(r["state"] == "busy" for r in rows),
        "hourly": hourly,
        "open_namespace": config.namespace if config.auth == "open" else None,
    }
    return render(request, "delayqueue/dashboard.html", context)
