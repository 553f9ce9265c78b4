"""Endpoints on topics: their counters, sizes and settings, pause, resume and purge."""

from delayqueue.api import wire
from delayqueue.api.schema import (MonitorDataResultSerializer, PurgeResultSerializer, ResultSerializer,
                                   SetTopicConfigResultSerializer, TopicConfigResultSerializer,
                                   TopicInfoListResultSerializer, TopicInfoResultSerializer, answer, queue_endpoint)
from delayqueue.api.validation import SetTopicConfigSerializer, TopicSerializer
from delayqueue.api.views.base import QueueAPIView, reply
from delayqueue.config.settings import setting_text
from delayqueue.core.constants import RETRY_BACKOFF_JITTER, Scope
from delayqueue.services.topic_control import pause_topic, resume_topic, set_topic_config
from delayqueue.services.topics import list_topics, monitor_data, purge_topic, topic_config, topic_info, topic_infos


@queue_endpoint(
    "Request counters and delivery delays",
    "Per topic, the number of requests of each kind and of messages becoming ready, ending or timing out, "
    "and the average and longest delays (ms) between a message's trigger time and its pull or its move to "
    "the ready queue, over the last complete monitor interval (DELAYQUEUE_MONITOR_INTERVAL_SECONDS), "
    "summed over all server processes. Empty lists before the first interval completes.",
    answer("GetMonitorDataAnswer", MonitorDataResultSerializer), method="GET")
class GetMonitorDataView(QueueAPIView):
    needs_scope = Scope.MONITOR
    marks_use = False

    async def handle(self):
        return reply(data=wire.monitor_data(await monitor_data(self.rt)))


@queue_endpoint(
    "Queue sizes of a topic",
    "How many of the topic's messages are waiting (and how far off they are, in nine buckets), ready, "
    "and pulled but not yet acked. A topic never used answers zeros.",
    answer("GetTopicInfoAnswer", TopicInfoResultSerializer), TopicSerializer, method="GET")
class GetTopicInfoView(QueueAPIView):
    needs_scope = Scope.MONITOR
    marks_use = False

    async def handle(self):
        data = self.validated(TopicSerializer)
        return reply(data=wire.topic_info(await topic_info(self.rt, topic=data["topic"])))


@queue_endpoint(
    "Queue sizes of every topic",
    "getTopicInfo for every topic in use, in the order topics were first used.",
    answer("GetTopicInfoListAnswer", TopicInfoListResultSerializer), method="GET")
class GetTopicInfoListView(QueueAPIView):
    needs_scope = Scope.MONITOR
    marks_use = False

    async def handle(self):
        rt = self.rt
        return reply(data=[wire.topic_info(info) for info in await topic_infos(rt, topics=await list_topics(rt))])

# setTopicConfig's parameters that are limits (set_limits' keywords); the others are TopicConfig fields.
TOPIC_LIMITS = ("produceRatePerSecond", "consumeRatePerSecond", "maxLiveMessages")


def topic_setting(name: str, value):
    """A setTopicConfig value as TopicConfig stores it: None (the default) for "use the default"."""
    if name == "maxRetry":
        return value if value >= 0 else None
    if name in ("ttlMillis", "ackTimeoutMillis", "retryBackoffMaxMillis"):
        return value if value > 0 else None
    return value


@queue_endpoint(
    "A topic's settings",
    "Every setting of the topic in force: the defaults of its sends and pulls (its own, else the server's), "
    "its retry backoff, dead letters on or off, whether it is paused, and its rate limits and live-message cap "
    "(0: none).",
    answer("GetTopicConfigAnswer", TopicConfigResultSerializer), TopicSerializer, method="GET")
class GetTopicConfigView(QueueAPIView):
    needs_scope = (Scope.MONITOR, Scope.MANAGE)
    marks_use = False

    async def handle(self):
        data = self.validated(TopicSerializer)
        return reply(data=wire.topic_config(await topic_config(self.rt, topic=data["topic"])))


@queue_endpoint(
    "Change a topic's settings",
    "Sets the settings given; the others stay as they are. Defaults for the topic's sends and pulls that give "
    "none (ttlMillis, maxRetry, ackTimeoutMillis; 0, or below 0 for maxRetry: back to the server's), the retry "
    "backoff after an ack timeout (min(retryBackoffMaxMillis, retryBackoffMillis * 2^(retry-1)), less up to "
    f"{RETRY_BACKOFF_JITTER:.0%} at random), deadLetter (false: the topic's status-5 and 6 messages, earlier ones "
    "included, are not dead letters while it stays false), the topic's limits (0: none), and push delivery (pushUrl and its "
    "settings, docs/push.md). In force on every server process within a second. Answers the topic's settings, as "
    "getTopicConfig, with pushSecret when this call made a signing secret. Code 429 when it would give the "
    f"namespace more topics with their own settings than {setting_text('max_topic_configs')}, or its push topics "
    f"more pushes in flight at once than {setting_text('max_push_concurrency')}.",
    answer("SetTopicConfigAnswer", SetTopicConfigResultSerializer), SetTopicConfigSerializer,
    example={"topic": "orders", "maxRetry": 5, "retryBackoffMillis": 1000, "retryBackoffMaxMillis": 60000})
class SetTopicConfigView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated(SetTopicConfigSerializer)
        topic = data["topic"]
        secret = await set_topic_config(
            self.rt, topic=topic,
            changes={field: topic_setting(name, data[name]) for name, field in wire.TOPIC_CONFIG_NAMES.items()
                     if name in data and name not in TOPIC_LIMITS},
            limits={wire.TOPIC_CONFIG_NAMES[name]: data[name] for name in TOPIC_LIMITS if name in data},
            rotate_push_secret=data.get("rotatePushSecret", False))
        answered = wire.topic_config(await topic_config(self.rt, topic=topic))
        return reply(data=answered if secret is None else {**answered, "pushSecret": secret})


@queue_endpoint(
    "Pause a topic",
    "Until resumeTopic, pulls of the topic answer an empty list and long polls are held (until resumed or "
    "their timeout); its messages still fall due and sends still go in.",
    answer("PauseTopicAnswer", ResultSerializer), TopicSerializer, example={"topic": "orders"})
class PauseTopicView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        await pause_topic(self.rt, topic=self.validated(TopicSerializer)["topic"])
        return reply()


@queue_endpoint(
    "Resume a paused topic",
    "Pulls hand out the topic's messages again; held long polls are woken.",
    answer("ResumeTopicAnswer", ResultSerializer), TopicSerializer, example={"topic": "orders"})
class ResumeTopicView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        await resume_topic(self.rt, topic=self.validated(TopicSerializer)["topic"])
        return reply()


@queue_endpoint(
    "Delete every live message of a topic",
    "Every waiting, ready or consuming message of the topic ends as deleted (status 7, history reason purged), "
    "in bounded batches. Answers how many. It ends while producers keep sending: it purges about as many as the "
    "topic held when it started (messages sent meanwhile may go in place of older ones, which a second call takes).",
    answer("PurgeTopicAnswer", PurgeResultSerializer), TopicSerializer, example={"topic": "orders"})
class PurgeTopicView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        return reply(count=await purge_topic(self.rt, topic=self.validated(TopicSerializer)["topic"]))
