"""Schedules in the admin (docs/schedules.md): listed with their rule and next fire time; added
and changed with the next five fire times shown before saving ("Preview", which saves nothing);
paused, resumed, sent once at once ("run now") and deleted (after a confirmation page). A
schedule's page shows its saved next five fire times, its recent ticks (their messages in the log,
with outcome and lateness) and the ticks it missed (ScheduleGap).

Every change goes through the same services as the API (services/schedules.py) in the
schedule's namespace, never by saving the model here: the cap, the rule's checks and the
planner's row lock hold as for createSchedule and updateSchedule, and a service's error is shown
on the form. The actions are POSTs (the admin's CSRF check) by a staff user with the change
permission on schedules."""
import collections
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone as django_timezone
from redis.exceptions import RedisError

from delayqueue.api.validation import MAX_TRIGGER_TIME_MILLIS, SCHEDULE_ID, TopicSerializer, checked_msg, first_error
from delayqueue.config.settings import load_config
from delayqueue.core.clock import from_millis, now_millis, to_millis
from delayqueue.core.constants import (MAX_DELAY_MILLIS, MAX_PRIORITY, MAX_RETRY, MAX_SCHEDULE_ID_LENGTH,
                                       SCHEDULE_LEAD_MILLIS, CatchUp, Status)
from delayqueue.core.exceptions import BadRequest, Conflict, QueueError, redis_unavailable
from delayqueue.core.schedule_rules import CronRule, EveryRule, RuleError
from delayqueue.core.schedules import FIELDS, ScheduleRow, tick_msg_id
from delayqueue.messagelog.routing import database_of
from delayqueue.messagelog.selectors import LoggedTick, schedule_gaps, tick_messages
from delayqueue.models import Schedule
from delayqueue.ops.admin.namespaces import NamespacedAdmin, NamespaceFilter, change_url
from delayqueue.ops.admin.topics import in_namespace, topic_url
from delayqueue.runtime import run_with_runtime
from delayqueue.services.schedules import (SETTABLE, ScheduleSpec, create_schedule, delete_schedule, pause_schedule,
                                           resume_schedule, run_schedule_now, update_schedule)
from delayqueue.stores.rows import served_namespaces

FIRE_TIMES = 5  # the next fire times shown, as the API's nextFireTimes
HISTORY_TICKS = 20  # a schedule's recent ticks shown on its page
# A tick's message is looked up under the schedule's current generation and this many before it
# (a pause, a resume or a change starts a new one; the older ones' ticks are read by today's rule).
HISTORY_GENERATIONS = 5
HISTORY_GAPS = 20
# The first lookback of a cron rule's recent ticks; widened fourfold until it holds enough.
FIRST_LOOKBACK_MILLIS = 3_600_000
WALK_TICKS = 10_000  # ticks per step of the walk forward through a lookback window

OUTCOMES = {Status.WAITING: "waiting", Status.READY: "ready", Status.CONSUMING: "consuming", Status.ACKED: "acked",
            Status.EXPIRED: "dead: expired", Status.EXHAUSTED: "dead: exhausted", Status.DELETED: "deleted"}


# --- a schedule's times, as the pages show them

def row_of(obj: Schedule) -> ScheduleRow:
    """The stored schedule as core/schedules reads it (times in epoch ms)."""
    return ScheduleRow(**{name: to_millis(getattr(obj, name)) if name in ("created_at", "updated_at")
                          else getattr(obj, name) for name in FIELDS})


def zone_of(row) -> str:
    """The time zone a schedule's ticks are shown in: its cron's; UTC for an interval."""
    return row.timezone if row.cron else "UTC"


def moment_text(millis: int, zone: str = "UTC") -> str:
    """A time in a time zone, to the second (and the ms when it has any), with the zone's abbreviation."""
    try:
        moment = from_millis(millis).astimezone(ZoneInfo(zone))
    except (ValueError, KeyError):  # a zone this machine does not know (ZoneInfoNotFoundError is a KeyError)
        moment = from_millis(millis)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if millis % 1000:
        text += f".{millis % 1000:03d}"
    return f"{text} {moment.strftime('%Z')}"


def fire_times(times: list[int], zone: str) -> list[dict]:
    """Each time in the schedule's zone and in UTC."""
    return [{"millis": t, "local": moment_text(t, zone), "utc": moment_text(t)} for t in times]


def duration_text(millis: int) -> str:
    if millis < 1000:
        return f"{millis} ms"
    return f"{millis // 1000} s" if millis % 1000 == 0 else f"{millis / 1000:.3f} s"


def rule_text(row) -> str:
    if row.cron:
        return f"{row.cron} ({row.timezone})"
    return f"every {duration_text(row.every_millis)}" if row.every_millis is not None else "?"


# --- the form

class MomentField(forms.DateTimeField):
    """A moment to the millisecond: a date and time in the admin's time zone (seconds and ms
    optional), an ISO 8601 time with its offset, or epoch ms (as the API takes it)."""

    widget = forms.TextInput

    def to_python(self, value):
        text = value.strip() if isinstance(value, str) else ""
        if text.isascii() and text.isdigit():
            if len(text) > len(str(MAX_TRIGGER_TIME_MILLIS)) or int(text) > MAX_TRIGGER_TIME_MILLIS:
                raise forms.ValidationError(f"epoch ms must be at most {MAX_TRIGGER_TIME_MILLIS} (2100-01-01)")
            return from_millis(int(text))
        return super().to_python(value)

    def validate(self, value):
        super().validate(value)
        if value is not None and not 0 <= to_millis(value) <= MAX_TRIGGER_TIME_MILLIS:
            raise forms.ValidationError("must be from 1970-01-01 to 2100-01-01")

    def prepare_value(self, value):
        if hasattr(value, "astimezone"):  # shown to the ms: an interval's start is its anchor
            millis = to_millis(value)
            local = django_timezone.localtime(value)
            text = local.strftime("%Y-%m-%d %H:%M:%S")
            return text + (f".{millis % 1000:03d}" if millis % 1000 else "")
        return value


class ScheduleForm(forms.ModelForm):
    """createSchedule's and updateSchedule's fields. Once its own checks pass, the service saves
    it (in `_post_clean`, so that the service's error lands on the form). With
    `preview_requested` nothing is saved: `preview` holds the next fire times of the rule entered."""

    namespace = forms.ChoiceField(label="namespace", help_text="one of the namespaces the service serves")
    schedule_id = forms.CharField(
        label="scheduleId", max_length=MAX_SCHEDULE_ID_LENGTH,
        help_text=f"unique in the namespace: 1 to {MAX_SCHEDULE_ID_LENGTH} letters, digits, '.', '_', ':' or '-'")
    topic = forms.CharField(label="topic", strip=False, help_text="each tick is one message of this topic")
    payload = forms.CharField(label="msg", strip=False, widget=forms.Textarea(attrs={"rows": 3}),
                              help_text="the body of each tick's message")
    cron = forms.CharField(label="cron", required=False, max_length=200,
                           help_text="5 fields: minute hour day-of-month month day-of-week, e.g. '30 2 * * *' or "
                                     "'*/5 * * * 1-5' (docs/schedules.md); empty for an interval")
    timezone = forms.CharField(label="time zone", required=False, max_length=64, initial="UTC",
                               help_text="the cron's IANA time zone, e.g. Europe/Berlin; empty: UTC")
    # No min_value: clean() names DELAYQUEUE_SCHEDULE_MIN_INTERVAL_MILLIS for every value below it.
    every_millis = forms.IntegerField(label="every (ms)", required=False, max_value=MAX_DELAY_MILLIS,
                                      help_text="a tick every this many ms, in place of a cron rule")
    start_time = MomentField(label="start", required=False,
                             help_text="an interval's first tick (empty: one interval after saving), a cron's "
                                       "earliest; YYYY-MM-DD HH:MM[:SS[.mmm]] in the admin's time zone, or epoch ms")
    end_time = MomentField(label="end", required=False, help_text="no tick after it; empty: none")
    catch_up = forms.ChoiceField(label="catch-up", choices=CatchUp.choices, initial=CatchUp.LATEST,
                                 help_text="ticks missed while no scanner ran: the latest fires once, all of them "
                                           "each once, or none")
    priority = forms.IntegerField(label="priority", min_value=0, max_value=MAX_PRIORITY, initial=0,
                                  help_text=f"each tick's priority, 0 to {MAX_PRIORITY}")
    ttl_millis = forms.IntegerField(label="TTL (ms)", min_value=0, max_value=MAX_DELAY_MILLIS, initial=0,
                                    help_text="each tick's TTL; 0: the topic's default")
    max_retry = forms.IntegerField(label="max retry", min_value=-1, max_value=MAX_RETRY, initial=-1,
                                   help_text="each tick's maxRetry; -1: the topic's default")
    paused = forms.BooleanField(label="paused", required=False, help_text="no tick fires until it is resumed")

    class Meta:
        model = Schedule
        fields = ("namespace", "schedule_id", *SETTABLE)

    preview_requested = False  # ScheduleAdmin.get_form sets it from the request

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.preview: list[dict] | None = None
        if "namespace" in self.fields:
            self.fields["namespace"].choices = [(ns, ns) for ns in served_namespaces()]
        for name in ("start_time", "end_time"):
            if name in self.fields and isinstance(self.initial.get(name), int):
                self.initial[name] = from_millis(self.initial[name])

    def clean_schedule_id(self):
        value = self.cleaned_data["schedule_id"]
        if not SCHEDULE_ID.match(value):
            raise forms.ValidationError(f"must be 1 to {MAX_SCHEDULE_ID_LENGTH} letters, digits, '.', '_', ':' or '-'")
        return value

    def clean_topic(self):
        serializer = TopicSerializer(data={"topic": self.cleaned_data["topic"]})
        if not serializer.is_valid():
            raise forms.ValidationError(first_error(serializer.errors["topic"]))
        return serializer.validated_data["topic"]

    def clean_payload(self):
        try:
            return checked_msg(self.cleaned_data["payload"])
        except Exception as exc:  # DRF's ValidationError, with the API's wording
            raise forms.ValidationError(first_error(getattr(exc, "detail", str(exc)))) from None

    def clean(self):
        # Not ModelForm.clean(): the model's unique check would run; the service's Conflict decides.
        data = self.cleaned_data
        if self.errors:
            return data
        cron, every = data["cron"].strip(), data["every_millis"]
        data["cron"], data["timezone"] = cron, (data["timezone"].strip() or "UTC") if cron else "UTC"
        minimum = load_config().schedule_min_interval_millis
        if cron and every is not None:
            self.add_error("cron", "give either a cron rule or an interval (every), not both")
        elif not cron and every is None:
            self.add_error("cron", "give a cron rule or an interval (every)")
        elif every is not None and every < minimum:
            self.add_error("every_millis", f"must be at least {minimum} (DELAYQUEUE_SCHEDULE_MIN_INTERVAL_MILLIS)")
        elif cron:
            try:
                CronRule.parse(cron, data["timezone"])
            except RuleError as exc:
                self.add_error("timezone" if str(exc).startswith("unknown time zone") else "cron", str(exc))
        start, end = data["start_time"], data["end_time"]
        if start is not None and end is not None and end < start:
            self.add_error("end_time", "must not be before the start")
        if not self.errors:
            now = now_millis()
            draft = self.draft(now)
            self.preview = fire_times(draft.next_fire_times(now, FIRE_TIMES), zone_of(draft))
        return data

    def service_fields(self) -> dict:
        """The cleaned fields as the services take them (times in epoch ms)."""
        data = self.cleaned_data
        fields = {name: data[name] for name in SETTABLE}
        for name in ("start_time", "end_time"):
            fields[name] = None if data[name] is None else to_millis(data[name])
        return fields

    def draft(self, now: int) -> ScheduleRow:
        """The schedule as the service would store it, active: an interval without a start
        first fires one interval from now."""
        fields = self.service_fields()
        if fields["every_millis"] is not None and fields["start_time"] is None:
            fields["start_time"] = now + fields["every_millis"]
        return ScheduleRow(**{**fields, "paused": False}, id=0, namespace="", schedule_id="", generation=0,
                           planned_until=now, plan_at=None, created_at=now, updated_at=now)

    def is_valid(self):
        """Never for a preview: the admin then shows the form again (without errors, the
        preview beside it) instead of saving and logging a change."""
        return super().is_valid() and not self.preview_requested

    def _post_clean(self):
        """In place of the model's checks and save: a preview writes nothing; a save is the
        service's call, which checks again (under its lock and the namespace's cap) and writes
        the row; its error is shown on the form, nothing saved."""
        if self.errors or self.preview_requested:
            return
        if self.instance.pk is not None and not self.has_changed():
            return  # nothing to change: the schedule is not planned anew
        fields = self.service_fields()
        try:
            if self.instance.pk is None:
                row = in_namespace(self.cleaned_data["namespace"], create_schedule, spec=ScheduleSpec(
                    schedule_id=self.cleaned_data["schedule_id"], **fields))
            else:  # the fields changed only, as an API caller gives them: an ended schedule's times are not judged
                row = in_namespace(self.instance.namespace, update_schedule, schedule_id=self.instance.schedule_id,
                                   changes={name: fields[name] for name in self.changed_data if name in fields})
        except Conflict as exc:
            self.add_error("schedule_id" if "schedule_id" in self.fields else None, str(exc))
        except BadRequest as exc:
            self.add_error(self._field_of(str(exc)), str(exc))
        except QueueError as exc:  # the cap (429), a schedule deleted meanwhile (404), the log or Redis down
            self.add_error(None, f"Not saved: {exc}")
        except RedisError as exc:
            self.add_error(None, f"Not saved: {redis_unavailable(exc)}; save again")
        else:
            self.instance = Schedule.objects.using(database_of(row.namespace)).get(pk=row.id)

    def _field_of(self, message: str) -> str | None:
        """The form field a service's BadRequest is about (its text starts with the API's name)."""
        for start, name in (("cron", "cron"), ("unknown time zone", "timezone"), ("everyMillis", "every_millis"),
                            ("endTime", "end_time"), ("catchUp", "catch_up")):
            if message.startswith(start) and name in self.fields:
                return name
        return None


def problem(form: forms.Form, name: str, text: str) -> str:
    """A form error as one line naming its field (unless its text does already, as a cron's does)."""
    field = form.fields.get(name)
    if field is None or text.lower().startswith(name.lower()):
        return text
    return f"{field.label or name}: {text}"


# --- the recent ticks

def recent_ticks(row: ScheduleRow, until: int, count: int) -> list[int]:
    """The schedule's last `count` ticks up to `until` by its rule (within its start and end,
    none before it was created): walked forward through a lookback window that is widened until
    it holds `count` ticks or reaches the schedule's creation. The window ends at the endTime if
    that came first: widened from a later `until`, it would be walked tick by tick across the gap."""
    floor = row.created_at
    if row.end_time is not None:
        until = min(until, row.end_time)
    rule = row.rule
    window = count * rule.every if isinstance(rule, EveryRule) else FIRST_LOOKBACK_MILLIS
    while True:
        after = max(until - window, floor)
        found: collections.deque[int] = collections.deque(maxlen=count)
        cursor = after
        while chunk := row.ticks(cursor, until, WALK_TICKS):
            found.extend(chunk)
            cursor = chunk[-1]
        if len(found) >= count or after == floor:  # the widening ends at the schedule's creation
            return list(found)
        window *= 4


def outcome(logged: LoggedTick | None, ahead: bool) -> tuple[str, str]:
    """(what became of a tick's message, a CSS class for it)."""
    if logged is None:
        return ("not sent yet", "ahead") if ahead else ("not in the log", "missing")
    text = OUTCOMES.get(logged.status, str(logged.status))
    retried = logged.retry - 1
    if retried > 0:
        text += f", retried {retried} time{'s' if retried > 1 else ''}"
    kind = {Status.ACKED: "acked", Status.EXPIRED: "dead", Status.EXHAUSTED: "dead", Status.DELETED: "deleted"}
    return text, kind.get(logged.status, "live")


def tick_history(row: ScheduleRow, now: int) -> list[dict]:
    """The schedule's recent ticks, newest first (with those already sent ahead), each with its
    message in the log under the latest of the recent generations that has one, its outcome and
    its lateness (when it first became ready minus the tick)."""
    until = max(now, min(row.planned_until, now + SCHEDULE_LEAD_MILLIS))
    ticks = recent_ticks(row, until, HISTORY_TICKS)
    generations = range(row.generation, max(row.generation - HISTORY_GENERATIONS, 0) - 1, -1)
    candidates = {tick: [tick_msg_id(row.schedule_id, tick, g) for g in generations] for tick in ticks}
    logged = tick_messages(row.namespace, row.topic, [m for ids in candidates.values() for m in ids])
    zone = zone_of(row)
    history = []
    for tick in reversed(ticks):
        found = next((logged[msg_id] for msg_id in candidates[tick] if msg_id in logged), None)
        text, kind = outcome(found, tick > now)
        lateness = None if found is None or found.ready_at is None else found.ready_at - tick
        history.append({
            "tick": tick, "local": moment_text(tick, zone), "utc": moment_text(tick),
            "msg_id": found.msg_id if found else candidates[tick][0], "outcome": text, "kind": kind,
            "deliveries": found.retry if found else None,
            "lateness": None if lateness is None else duration_text(lateness) if lateness >= 0
            else f"-{duration_text(-lateness)}",
            "url": change_url("admin:delayqueue_message_change", found.id, row.namespace) if found else None,
        })
    return history


# --- the admin

class KindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    def lookups(self, request, model_admin):
        return [("cron", "cron"), ("interval", "interval")]

    def queryset(self, request, queryset):
        if self.value() == "cron":
            return queryset.exclude(cron="")
        if self.value() == "interval":
            return queryset.filter(cron="")
        return queryset


RULE_FIELDS = ("cron", "timezone", "every_millis", "start_time", "end_time", "catch_up")
PLANNER_FIELDS = ("generation", "planned", "plan_next", "created_at", "updated_at")


@admin.register(Schedule)
class ScheduleAdmin(NamespacedAdmin):
    form = ScheduleForm
    list_display = ("schedule_id", "namespace", "topic", "rule", "paused", "next_fire", "catch_up")
    list_filter = (NamespaceFilter, "paused", KindFilter)
    search_fields = ("schedule_id", "topic")
    search_help_text = "Part of a scheduleId or topic"
    ordering = ("namespace", "schedule_id")
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100
    actions = ("pause_selected", "resume_selected", "delete_selected_schedules")
    change_form_template = "admin/delayqueue/schedule/change_form.html"

    # Deleted through the service (its ticks sent ahead go too), after a confirmation page: not
    # Django's delete, which would delete the row alone.
    def has_delete_permission(self, request, obj=None):
        return False

    def get_fieldsets(self, request, obj=None):
        rule = RULE_FIELDS
        if obj is not None and not self.has_change_permission(request, obj):  # read-only: times as times
            rule = tuple({"start_time": "start", "end_time": "end"}.get(name, name) for name in rule)
        fieldsets = [
            (None, {"fields": ("namespace", "schedule_id", "topic", "payload", "paused")}),
            ("Rule", {"fields": rule}),
            ("Each tick's message", {"fields": ("priority", "ttl_millis", "max_retry")}),
        ]
        if obj is not None:
            fieldsets.append(("Planner", {"fields": PLANNER_FIELDS}))
        return fieldsets

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else ("namespace", "schedule_id", *PLANNER_FIELDS)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)  # a class of its own per call
        form.preview_requested = request.method == "POST" and "_preview" in request.POST
        return form

    def get_changeform_initial_data(self, request):
        return {"namespace": load_config().namespace, **super().get_changeform_initial_data(request)}

    def save_model(self, request, obj, form, change):
        """Nothing: the form's service call wrote the row."""

    def get_urls(self):
        return [path("<path:object_id>/act/", self.admin_site.admin_view(self.act_view),
                     name="delayqueue_schedule_act"), *super().get_urls()]

    # --- columns and read-only fields

    @admin.display(description="rule")
    def rule(self, obj):
        return rule_text(obj)

    @admin.display(description="next fire time")
    def next_fire(self, obj):
        try:
            times = row_of(obj).next_fire_times(now_millis(), 1)
        except RuleError as exc:
            return f"rule error: {exc}"
        if times:
            return moment_text(times[0], zone_of(obj))
        return "— (paused)" if obj.paused else "— (no more ticks)"

    @admin.display(description="start")
    def start(self, obj):
        return "—" if obj.start_time is None else moment_text(obj.start_time, zone_of(obj))

    @admin.display(description="end")
    def end(self, obj):
        return "—" if obj.end_time is None else moment_text(obj.end_time, zone_of(obj))

    @admin.display(description="planned until")
    def planned(self, obj):
        return f"{moment_text(obj.planned_until)} ({obj.planned_until} ms): every tick up to it was sent or passed"

    @admin.display(description="next planned at")
    def plan_next(self, obj):
        if obj.plan_at is None:
            return "— (paused or no more ticks)"
        return f"{moment_text(obj.plan_at)} ({obj.plan_at} ms)"

    # --- the form's page

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        form = context["adminform"].form
        previewed = getattr(form, "preview_requested", False)
        context.update(
            can_preview=self.has_add_permission(request) if obj is None else self.has_change_permission(request, obj),
            previewed=previewed, preview=form.preview if previewed and not form.errors else None)
        if previewed and not form.errors:
            context.update(preview_zone=form.cleaned_data["timezone"],
                           preview_paused=form.cleaned_data["paused"])
        elif previewed:
            context["preview_errors"] = [problem(form, name, " ".join(errors)) for name, errors in form.errors.items()]
        if obj is not None:
            now = now_millis()
            row = row_of(obj)
            try:
                saved = fire_times(row.next_fire_times(now, FIRE_TIMES), zone_of(row))
                history, history_error = tick_history(row, now), None
            except RuleError as exc:
                saved, history, history_error = [], [], f"rule error: {exc}"
            context.update(
                saved_fire_times=saved, history=history, history_error=history_error, saved_zone=zone_of(row),
                saved_none="None: paused." if row.paused else "None: no tick after now (past its end).",
                gaps=[{"gap": gap, "first": moment_text(gap.first_tick, zone_of(row)),
                       "last": moment_text(gap.last_tick, zone_of(row))}
                      for gap in schedule_gaps(namespace=obj.namespace, schedule_pk=obj.pk, limit=HISTORY_GAPS)],
                can_act=self.has_change_permission(request, obj),
                act_url=(f"{reverse('admin:delayqueue_schedule_act', args=[obj.pk])}"
                         f"?{urlencode({'namespace': obj.namespace})}"),
                topic_page=topic_url("topic", obj.namespace, obj.topic),
                history_ticks=HISTORY_TICKS)
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    # --- actions on one schedule

    def act_view(self, request, object_id):
        """Pause, resume, run now or delete one schedule through the services in its namespace
        (POST only; delete after a confirmation page); then back to its page."""
        if request.method != "POST" or not self.has_change_permission(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        page = change_url("admin:delayqueue_schedule_change", obj.pk, obj.namespace)
        action, where = request.POST.get("action"), {"schedule_id": obj.schedule_id}
        try:
            if action == "pause":
                in_namespace(obj.namespace, pause_schedule, **where)
                done = "Paused: no tick fires until it is resumed; the ticks sent ahead were deleted."
            elif action == "resume":
                in_namespace(obj.namespace, resume_schedule, **where)
                done = "Resumed: its ticks fire again from now (those that fell while it was paused do not)."
            elif action == "run_now":
                sent = in_namespace(obj.namespace, run_schedule_now, **where)
                done = (f"Sent once now: message {sent.msg_id} of topic {sent.topic}, "
                        f"{Status(sent.status).label}. Its ticks go on as before.")
            elif action == "delete":
                if request.POST.get("confirmed") != "on":
                    return self._confirm(
                        request, title=f"Delete schedule {obj.schedule_id}", action=request.get_full_path(),
                        back_url=page,
                        fields=[("action", "delete")],
                        question=f"Delete schedule {obj.schedule_id} of namespace {obj.namespace}? No tick of it "
                                 "fires any more: the ticks it sent ahead are deleted. Its messages already "
                                 "delivered stay in the log.")
                in_namespace(obj.namespace, delete_schedule, **where)
                self.message_user(request, f"Deleted schedule {obj.schedule_id} and the ticks it had sent ahead.",
                                  messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:delayqueue_schedule_changelist"))
            else:
                self.message_user(request, "action: must be pause, resume, run_now or delete", messages.ERROR)
                return HttpResponseRedirect(page)
        except QueueError as exc:
            self.message_user(request, f"{action} failed: {exc}", messages.ERROR)
        except RedisError as exc:
            self.message_user(request, f"{action} failed: {redis_unavailable(exc)}; try again", messages.ERROR)
        else:
            self.message_user(request, done, messages.SUCCESS)
        return HttpResponseRedirect(page)

    def _confirm(self, request, *, title: str, question: str, action: str, back_url: str, fields: list):
        return TemplateResponse(request, "admin/delayqueue/schedule/confirm.html", {
            **self.admin_site.each_context(request), "opts": self.opts, "title": title, "question": question,
            "action": action, "back_url": back_url, "fields": fields})

    # --- actions on the selected schedules

    @staticmethod
    def _each(targets: list[tuple[str, str]], service) -> tuple[int, list[str]]:
        """service(schedule_id=...) for each (namespace, scheduleId), each in its namespace:
        (how many were done, the failures' texts)."""
        async def each(rt):
            done, failures = 0, []
            for namespace, schedule_id in targets:
                try:
                    await service(rt.for_namespace(namespace), schedule_id=schedule_id)
                    done += 1
                except QueueError as exc:
                    failures.append(f"{schedule_id}: {exc}")
                except RedisError as exc:
                    failures.append(f"{schedule_id}: {redis_unavailable(exc)}")
            return done, failures

        return run_with_runtime(each)

    def _report(self, request, text: str, failures: list[str]) -> None:
        self.message_user(request, text, messages.SUCCESS)
        if failures:
            self.message_user(request, f"{len(failures)} failed, try again: " + "; ".join(failures[:10]),
                              messages.ERROR)

    @admin.action(description="Pause selected schedules", permissions=["change"])
    def pause_selected(self, request, queryset):
        targets = list(queryset.filter(paused=False).values_list("namespace", "schedule_id"))
        done, failures = self._each(targets, pause_schedule)
        self._report(request, f"Paused {done} schedule(s); {queryset.count() - len(targets)} were paused already.",
                     failures)

    @admin.action(description="Resume selected schedules", permissions=["change"])
    def resume_selected(self, request, queryset):
        targets = list(queryset.filter(paused=True).values_list("namespace", "schedule_id"))
        done, failures = self._each(targets, resume_schedule)
        self._report(request, f"Resumed {done} schedule(s); {queryset.count() - len(targets)} were not paused.",
                     failures)

    @admin.action(description="Delete selected schedules…", permissions=["change"])
    def delete_selected_schedules(self, request, queryset):
        targets = list(queryset.values_list("namespace", "schedule_id"))
        if request.POST.get("confirmed") != "on":
            return self._confirm(
                request, title="Delete schedules", action=reverse("admin:delayqueue_schedule_changelist"),
                back_url=reverse("admin:delayqueue_schedule_changelist"),
                fields=[("action", "delete_selected_schedules"),
                        *(("_selected_action", pk) for pk in queryset.values_list("pk", flat=True))],
                question=f"Delete {len(targets)} schedule(s) ({', '.join(sid for _, sid in targets[:20])}"
                         f"{', ...' if len(targets) > 20 else ''})? No tick of them fires any more: the ticks "
                         "they sent ahead are deleted.")
        done, failures = self._each(targets, delete_schedule)
        self._report(request, f"Deleted {done} schedule(s) and the ticks they had sent ahead.", failures)
        return None
