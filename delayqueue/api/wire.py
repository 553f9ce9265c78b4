"""The API's wire shapes, in one place: the services answer Messages and typed replies, and the
views render them here into camellia's JSON (and read a validated send into a SendRequest)."""
from delayqueue.core.messages import Message
from delayqueue.core.schedule_rules import RuleError
from delayqueue.core.schedules import ScheduleRow
from delayqueue.live.stats import Gap
from delayqueue.services.dead_letters import DeadLetter, RedriveProgress
from delayqueue.services.restore import RestoreCounts
from delayqueue.services.schedules import ScheduleSpec
from delayqueue.services.send import SendRequest
from delayqueue.services.topics import TopicConfigInForce, TopicCounters, TopicInfo

# getTopicInfo's waiting-delay buckets (camellia's names), one per services.topics.WAITING_WITHIN.
WAITING_BUCKET_NAMES = ("sizeOf0To1min", "sizeOf1minTo10min", "sizeOf10minTo30min", "sizeOf30minTo1hour",
                        "sizeOf1hourTo6hour", "sizeOf6hourTo1day", "sizeOf1dayTo7day", "sizeOf7dayTo30day",
                        "sizeOf30dayToInfinite")
# getMonitorData's list of each gap's figures.
GAP_LISTS = {Gap.PULL: "pullMsgTimeGapStatsList", Gap.READY: "readyQueueTimeGapStatsList"}
# getTopicConfig's and setTopicConfig's names of TopicConfigInForce's fields (all but the topic).
TOPIC_CONFIG_NAMES = {
    "ttlMillis": "ttl_millis", "maxRetry": "max_retry", "ackTimeoutMillis": "ack_timeout_millis",
    "retryBackoffMillis": "retry_backoff_millis", "retryBackoffMaxMillis": "retry_backoff_max_millis",
    "deadLetter": "dead_letter", "paused": "paused", "produceRatePerSecond": "produce_rate",
    "consumeRatePerSecond": "consume_rate", "maxLiveMessages": "max_live", "pushUrl": "push_url",
    "pushConcurrency": "push_concurrency", "pushTimeoutMillis": "push_timeout_millis",
    "pushRatePerSecond": "push_rate", "pushSecretRotating": "push_secret_rotating", "shards": "shards",
}


def send_request(data: dict) -> SendRequest:
    """A sendMsg's validated parameters (api/validation.SendMsgSerializer) as the send service takes them."""
    delay = data["delayMillis"]
    return SendRequest(data["topic"], data["msg"], 0 if delay is None else delay, data.get("msgId") or None,
                       data["ttlMillis"], data["maxRetry"], data["triggerTime"], data["priority"])


def message(m: Message) -> dict:
    """A delayMsg: camellia's CamelliaDelayMsg (what Redis stores, too)."""
    return m.to_wire()


def sent_message(m: Message, *, body_readable: bool) -> dict:
    """A send's delayMsg: the message stored under its msgId, without its body (`msg`) unless the
    caller may read it (it carries the body it sent, or may read messages: scope consume)."""
    wire = m.to_wire()
    if not body_readable:
        del wire["msg"]
    return wire


def messages(found: list[Message]) -> list[dict]:
    return [m.to_wire() for m in found]


def dead_letter(dead: DeadLetter) -> dict:
    return {**dead.message.to_wire(), "deadReason": dead.reason, "deadDetail": dead.detail,
            "deadTime": dead.died_at}


def redrive_progress(progress: RedriveProgress) -> dict:
    return {"moved": progress.moved, "left": progress.left, "state": "done" if progress.done else "running"}


def topic_info(info: TopicInfo) -> dict:
    return {
        "topic": info.topic,
        "waitingQueueSize": info.waiting,
        "waitingQueueInfo": dict(zip(WAITING_BUCKET_NAMES, info.waiting_within)),
        "hotWaitingSize": info.waiting - info.waiting_cold,
        "coldWaitingSize": info.waiting_cold,
        "readyQueueSize": info.ready,
        "ackQueueSize": info.consuming,
    }


def monitor_data(found: list[TopicCounters]) -> dict:
    """getMonitorData's data: a topic is listed where it counted a request, and in a gap's list
    where it had that gap."""
    data = {"requestStatsList": [{"topic": t.topic, **{counter.value: n for counter, n in t.counters.items()}}
                                 for t in found if any(t.counters.values())]}
    for gap, name in GAP_LISTS.items():
        data[name] = [{"topic": t.topic, "count": t.gaps[gap].count, "avg": t.gaps[gap].avg, "max": t.gaps[gap].max}
                      for t in found if gap in t.gaps]
    return data


def topic_config(config: TopicConfigInForce) -> dict:
    return {"topic": config.topic, **{name: getattr(config, field) for name, field in TOPIC_CONFIG_NAMES.items()},
            "drainingShards": list(config.draining_shards)}


def restore_counts(counts: RestoreCounts) -> dict:
    return {"restored": counts.restored, "alreadyLive": counts.already_live, "skipped": counts.skipped,
            "leftCold": counts.left_cold}


# A schedule's wire names -> the fields of services/schedules' ScheduleSpec and core/schedules' ScheduleRow.
SCHEDULE_NAMES = {
    "topic": "topic", "msg": "payload", "cron": "cron", "timezone": "timezone", "everyMillis": "every_millis",
    "startTime": "start_time", "endTime": "end_time", "catchUp": "catch_up", "priority": "priority",
    "ttlMillis": "ttl_millis", "maxRetry": "max_retry", "paused": "paused",
}


def schedule_fields(data: dict) -> dict:
    """A createSchedule's or updateSchedule's validated parameters as ScheduleSpec's fields (those
    given only); a startTime or endTime of 0 is none."""
    fields = {field: data[name] for name, field in SCHEDULE_NAMES.items() if name in data}
    for field in ("start_time", "end_time"):
        if fields.get(field) == 0:
            fields[field] = None
    return fields


def schedule_spec(data: dict) -> ScheduleSpec:
    return ScheduleSpec(schedule_id=data["scheduleId"], **schedule_fields(data))


def schedule(row: ScheduleRow, now: int) -> dict:
    answer = {"scheduleId": row.schedule_id, **{name: getattr(row, field) for name, field in SCHEDULE_NAMES.items()}}
    if row.cron:
        answer["everyMillis"] = None
    else:
        answer["cron"] = answer["timezone"] = None
    try:
        fire_times = row.next_fire_times(now)
    except RuleError:  # a rule this process cannot read (a time zone its tzdata lacks): the rest is still answered
        fire_times = []
    answer.update(nextFireTimes=fire_times, createTime=row.created_at, updateTime=row.updated_at)
    return answer
