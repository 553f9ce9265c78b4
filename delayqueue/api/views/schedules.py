"""Endpoints on schedules: recurring messages the service sends, one per tick (docs/schedules.md)."""
from django.http import HttpResponse

from delayqueue.api import wire
from delayqueue.api.schema import (ResultSerializer, ScheduleListResultSerializer, ScheduleResultSerializer, answer,
                                   queue_endpoint)
from delayqueue.api.validation import (CreateScheduleSerializer, ListSchedulesSerializer, ScheduleRefSerializer,
                                       UpdateScheduleSerializer)
from delayqueue.api.views.base import QueueAPIView, reply
from delayqueue.config.settings import setting_text
from delayqueue.core.clock import now_millis
from delayqueue.core.constants import Scope
from delayqueue.core.schedules import ScheduleRow
from delayqueue.services.schedules import (create_schedule, delete_schedule, get_schedule, list_schedules,
                                           pause_schedule, resume_schedule, update_schedule)


def schedule_reply(row: ScheduleRow) -> HttpResponse:
    return reply(schedule=wire.schedule(row, now_millis()))


@queue_endpoint(
    "Create a schedule",
    "A recurring message: each tick of `cron` (in `timezone`) or of `everyMillis` becomes one message of `topic` "
    "with body `msg`, the tick as its triggerTime and msgId `<scheduleId>@<tick>`, sent ahead of the tick so it "
    "fires with the queue's precision; exactly one per tick, whichever scanner plans it. Answers the schedule with "
    "its next five fire times. Code 409 if the namespace has a schedule under scheduleId; 429 beyond "
    f"{setting_text('max_schedules')} schedules.",
    answer("CreateScheduleAnswer", ScheduleResultSerializer), CreateScheduleSerializer,
    example={"scheduleId": "nightly-report", "topic": "reports", "msg": "{\"kind\": \"nightly\"}",
             "cron": "0 2 * * *", "timezone": "Europe/Berlin"})
class CreateScheduleView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        return schedule_reply(await create_schedule(self.rt, spec=wire.schedule_spec(
            self.validated(CreateScheduleSerializer))))


@queue_endpoint(
    "A schedule", "The schedule and its next five fire times. Code 404 if there is none under scheduleId.",
    answer("GetScheduleAnswer", ScheduleResultSerializer), ScheduleRefSerializer, method="GET")
class GetScheduleView(QueueAPIView):
    needs_scope = (Scope.MONITOR, Scope.MANAGE)
    marks_use = False

    async def handle(self):
        return schedule_reply(await get_schedule(
            self.rt, schedule_id=self.validated(ScheduleRefSerializer)["scheduleId"]))


@queue_endpoint(
    "The schedules of the namespace",
    "In scheduleId order, `limit` per page, of one topic if given. Pass the answer's nextCursor as `cursor` for the "
    "next page; the last page has none.",
    answer("ListSchedulesAnswer", ScheduleListResultSerializer), ListSchedulesSerializer, method="GET")
class ListSchedulesView(QueueAPIView):
    needs_scope = (Scope.MONITOR, Scope.MANAGE)
    marks_use = False

    async def handle(self):
        data = self.validated(ListSchedulesSerializer)
        rows, next_cursor = await list_schedules(self.rt, topic=data.get("topic"), limit=data["limit"],
                                                 cursor=data.get("cursor"))
        now = now_millis()
        return reply(schedules=[wire.schedule(row, now) for row in rows],
                     **({"nextCursor": next_cursor} if next_cursor else {}))


@queue_endpoint(
    "Change a schedule",
    "Changes the fields given (cron makes it a cron schedule, everyMillis an interval one; startTime or endTime 0: "
    "none). The ticks already sent ahead and not yet due are deleted, and the schedule is planned anew from now. "
    "Answers the schedule.",
    answer("UpdateScheduleAnswer", ScheduleResultSerializer), UpdateScheduleSerializer,
    example={"scheduleId": "nightly-report", "cron": "30 2 * * *"})
class UpdateScheduleView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        data = self.validated(UpdateScheduleSerializer)
        return schedule_reply(await update_schedule(self.rt, schedule_id=data["scheduleId"],
                                                    changes=wire.schedule_fields(data)))


@queue_endpoint(
    "Pause a schedule",
    "No tick fires until resumeSchedule; the ticks already sent ahead and not yet due are deleted. Answers the schedule.",
    answer("PauseScheduleAnswer", ScheduleResultSerializer), ScheduleRefSerializer,
    example={"scheduleId": "nightly-report"})
class PauseScheduleView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        return schedule_reply(await pause_schedule(
            self.rt, schedule_id=self.validated(ScheduleRefSerializer)["scheduleId"]))


@queue_endpoint(
    "Resume a schedule",
    "Ticks fire again from now; those that fell while it was paused do not. Answers the schedule.",
    answer("ResumeScheduleAnswer", ScheduleResultSerializer), ScheduleRefSerializer,
    example={"scheduleId": "nightly-report"})
class ResumeScheduleView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        return schedule_reply(await resume_schedule(
            self.rt, schedule_id=self.validated(ScheduleRefSerializer)["scheduleId"]))


@queue_endpoint(
    "Delete a schedule",
    "The schedule and the ticks it sent ahead that are not yet due. Code 404 if there is none under scheduleId.",
    answer("DeleteScheduleAnswer", ResultSerializer), ScheduleRefSerializer, example={"scheduleId": "nightly-report"})
class DeleteScheduleView(QueueAPIView):
    needs_scope = Scope.MANAGE

    async def handle(self):
        await delete_schedule(self.rt, schedule_id=self.validated(ScheduleRefSerializer)["scheduleId"])
        return reply()
