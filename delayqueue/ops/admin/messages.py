"""The admin over the message log: browse, filter and search messages, see one message's
history beside its live Redis state, restore or delete selected messages through the same
service layer as the API. Built for a log of millions of rows: no full-table COUNT(*), every
filter on an indexed column, sorting only on indexed times."""
from datetime import datetime

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone as django_timezone
from django.utils.functional import cached_property
from redis.exceptions import RedisError

from delayqueue.api.validation import MsgIdField, TopicSerializer, first_error
from delayqueue.core.clock import from_millis, to_millis
from delayqueue.core.constants import MAX_DELAY_MILLIS, Status
from delayqueue.core.exceptions import LogUnavailable, QueueError
from delayqueue.core.names import msg_id_problem
from delayqueue.messagelog.selectors import estimated_count, message_history
from delayqueue.models import Message
from delayqueue.ops import figures
from delayqueue.ops.admin.namespaces import NamespacedAdmin, NamespaceFilter, change_url
from delayqueue.ops.admin.schedules import MomentField
from delayqueue.ops.admin.topics import in_namespace, topic_url
from delayqueue.runtime import run_with_runtime
from delayqueue.services.messages import delete_message, reschedule_message
from delayqueue.services.restore import restore
from delayqueue.services.topics import list_topics
from delayqueue.stores import rows

# The actions work on rows in memory; a "select all" over millions of rows is a job for
# `manage.py restore --topic ...`, not a web request.
ACTION_LIMIT = 10_000


class EstimatedCountPaginator(Paginator):
    @cached_property
    def count(self):
        return estimated_count(self.object_list)


class TopicFilter(admin.SimpleListFilter):
    """Topics from the Redis registries of the served namespaces (a DISTINCT over the log would
    scan it); any valid topic name may be typed into the URL, an invalid one is refused with the
    API's message."""

    title = "topic"
    parameter_name = "topic"

    def lookups(self, request, model_admin):
        namespaces = rows.served_namespaces()

        async def every_registry(rt):
            return [t for ns in namespaces for t in await list_topics(rt.for_namespace(ns))]

        try:
            topics = run_with_runtime(every_registry)
        except RedisError:
            topics = []
        return [(t, t) for t in dict.fromkeys(topics)]  # a topic name used in two namespaces is offered once

    def has_output(self):
        return True  # filter by a typed topic even when none is registered (retired topics)

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        serializer = TopicSerializer(data={"topic": value})
        if not serializer.is_valid():
            messages.error(request, first_error(serializer.errors))
            return queryset.none()
        return queryset.filter(topic=value)


def millis_text(moment: datetime) -> str:
    return django_timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


# The log row of a message changed here is written a moment later, by the scanners' log writer.
LOG_CATCHES_UP = ("the log's row and history catch up within a moment, when the scanners' log writer records "
                  "the change")


class RescheduleForm(forms.Form):
    """A message's new time: a delay from now, or a trigger time (in the admin's time zone, or epoch
    ms), within rescheduleMsg's bounds."""

    delay_millis = forms.IntegerField(required=False, min_value=0, max_value=MAX_DELAY_MILLIS)
    trigger_time = MomentField(required=False)

    def clean(self):
        data = super().clean()
        given = [name for name in ("delay_millis", "trigger_time") if data.get(name) is not None]
        if len(given) != 1 and not self.errors:
            raise forms.ValidationError("give either a delay in ms or a trigger time, not both"
                                        if given else "give a delay in ms or a trigger time")
        return data


@admin.register(Message)
class MessageAdmin(NamespacedAdmin):
    list_display = ("msg_id", "topic", "status", "produced", "triggered", "deliveries", "updated")
    list_filter = (
        NamespaceFilter,
        TopicFilter,
        "status",
        ("produce_time", admin.DateFieldListFilter),
        ("trigger_time", admin.DateFieldListFilter),
    )
    search_fields = ("msg_id",)
    search_help_text = "Exact msgId"
    date_hierarchy = "produce_time"
    ordering = ("-produce_time", "-id")
    sortable_by = ("produced", "triggered")
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a count per filter choice would scan the table
    list_per_page = 50
    actions = ("restore_selected", "delete_selected_messages")
    fields = ("namespace", "topic", "msg_id", "status", "payload", "produced", "triggered", "expires",
              "retry", "max_retry", "updated")
    readonly_fields = fields
    change_form_template = "admin/delayqueue/message/change_form.html"
    change_list_template = "admin/delayqueue/message/change_list.html"

    def get_urls(self):
        return [path("<path:object_id>/queue/", self.admin_site.admin_view(self.queue_action_view),
                     name="delayqueue_message_queue_action"), *super().get_urls()]

    def queue_action_view(self, request, object_id):
        """Run now, change the delay or delete one message, through the queue's services in its
        namespace (POST only; delete after a confirmation page); then back to its page, which
        reads its live state from Redis again."""
        if request.method != "POST" or not self.has_change_permission(request):
            raise PermissionDenied
        message = self.get_object(request, object_id)
        if message is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        page = change_url("admin:delayqueue_message_change", message.pk, message.namespace)
        action, where = request.POST.get("action"), dict(topic=message.topic, msg_id=message.msg_id)
        try:
            if action == "run_now":
                moved = in_namespace(message.namespace, reschedule_message, **where, delay_millis=0)
                done = f"Due now: {Status(moved.status).label}"
            elif action == "reschedule":
                form = RescheduleForm(request.POST)
                if not form.is_valid():
                    errors = [f"{name.replace('_', ' ')}: {' '.join(e)}" if name != "__all__" else " ".join(e)
                              for name, e in form.errors.items()]
                    self.message_user(request, "; ".join(errors), messages.ERROR)
                    return HttpResponseRedirect(page)
                data = form.cleaned_data
                when = {"delay_millis": data["delay_millis"]} if data["delay_millis"] is not None \
                    else {"trigger_time": to_millis(data["trigger_time"])}
                moved = in_namespace(message.namespace, reschedule_message, **where, **when)
                done = (f"Rescheduled: {Status(moved.status).label}, trigger time "
                        f"{millis_text(from_millis(moved.trigger_time))}")
            elif action == "delete":
                if request.POST.get("confirmed") != "on":
                    return TemplateResponse(request, "admin/delayqueue/confirm.html", {
                        **self.admin_site.each_context(request), "opts": self.opts,
                        "title": f"Delete message {message.msg_id}", "action": request.get_full_path(),
                        "namespace": message.namespace, "topic": message.topic,
                        "topic_url": topic_url("topic", message.namespace, message.topic), "back_url": page,
                        "fields": {"action": "delete"},
                        "question": f"Delete message {message.msg_id} of topic {message.topic}? It ends as deleted "
                                    "(status 7) and is never delivered."})
                if not in_namespace(message.namespace, delete_message, **where):
                    self.message_user(request, "Not deleted: it is not live in Redis (already ended, or not "
                                               "restored).", messages.WARNING)
                    return HttpResponseRedirect(page)
                done = "Deleted"
            else:
                self.message_user(request, "action: must be run_now, reschedule or delete", messages.ERROR)
                return HttpResponseRedirect(page)
        except RedisError as exc:
            self.message_user(request, f"Redis unavailable ({exc}): nothing changed, try again", messages.ERROR)
        except QueueError as exc:  # 404 / 409 of the service: ended, unknown or consuming
            self.message_user(request, str(exc), messages.ERROR)
        else:
            self.message_user(request, f"{done}. The live state below is read from Redis; {LOG_CATCHES_UP}.",
                              messages.SUCCESS)
        return HttpResponseRedirect(page)

    @admin.display(description="deliveries")
    def deliveries(self, obj):
        return f"{obj.retry} of {obj.max_retry + 1}"

    # Times to the millisecond, as the API reports them: the admin's default shows minutes.
    @admin.display(description="produce time", ordering="produce_time")
    def produced(self, obj):
        return millis_text(obj.produce_time)

    @admin.display(description="trigger time", ordering="trigger_time")
    def triggered(self, obj):
        return millis_text(obj.trigger_time)

    @admin.display(description="expire time")
    def expires(self, obj):
        return millis_text(obj.expire_time)

    @admin.display(description="logged at")
    def updated(self, obj):
        return millis_text(obj.updated_at)

    def get_search_results(self, request, queryset, search_term):
        """Exact msgId match on its index (the default icontains would scan the table): the term as
        typed, as a msgId keeps its spaces (" a " is not "a"); when no msgId is that, trimmed (an id
        pasted with spaces or a line end around it)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        if term != search_term and msg_id_problem(search_term) is None:
            as_typed = queryset.filter(msg_id=search_term)
            if as_typed.exists():
                return as_typed, False
        try:
            MsgIdField().run_validation(term)
        except Exception as exc:  # DRF's ValidationError, with the API's wording
            messages.error(request, f"msgId: {first_error(getattr(exc, 'detail', str(exc)))}")
            return queryset.none(), False
        return queryset.filter(msg_id=term), False

    def _selected(self, request, queryset) -> dict[str, list[Message]] | None:
        """The selected messages by namespace, each acted on in its own; None (and an error
        shown) when more than an action takes are selected."""
        selected = list(queryset[:ACTION_LIMIT + 1])
        if len(selected) > ACTION_LIMIT:
            self.message_user(request, f"Select at most {ACTION_LIMIT:,} messages at a time (for a whole topic "
                                       "use manage.py restore --topic).", messages.ERROR)
            return None
        by_namespace: dict[str, list[Message]] = {}
        for message in selected:
            by_namespace.setdefault(message.namespace, []).append(message)
        return by_namespace

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # deleting log rows would lose history; delete means the queue's delete
        return actions

    # The log is written by the queue, never edited here: every field is read-only, and a
    # message is added by sending it, not by a form.
    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = dict(extra_context or {}, show_save=False, show_save_and_continue=False,
                             show_save_and_add_another=False, show_delete=False)
        message = self.get_object(request, object_id)
        if message is not None:
            extra_context["title"] = f"Message {message.msg_id} of topic {message.topic}"
            extra_context["topic_page"] = topic_url("topic", message.namespace, message.topic)
            extra_context["can_act"] = self.has_change_permission(request, message)
            extra_context["history"] = list(message_history(message))
            extra_context.update(self._live_state(message))
        return super().change_view(request, object_id, form_url, extra_context)

    @staticmethod
    def _live_state(message: Message) -> dict:
        try:
            live = run_with_runtime(figures.live_state, namespace=message.namespace, topic=message.topic,
                                    msg_id=message.msg_id)
        except RedisError as exc:
            return {"live_error": f"Redis unavailable: {exc}"}
        body = live["message"]
        return {
            "live": live,
            "live_message": body,
            "live_status_label": Status(body["status"]).label if body else None,
            "live_times": {
                name: from_millis(body[name]) if body else None
                for name in ("produceTime", "triggerTime", "expireTime")
            },
            "live_waiting_until": from_millis(live["waiting_until"]),
            "live_ack_deadline": from_millis(live["ack_deadline"]),
            "live_purge_at": from_millis(live["purge_at"]),
            "live_differs": bool(body) and (body["status"], body["retry"]) != (message.status, message.retry),
        }

    @admin.action(description="Restore selected messages into Redis", permissions=["change"])
    def restore_selected(self, request, queryset):
        selected = self._selected(request, queryset)
        if selected is None:
            return
        # The restore's rule, as restoreMsg's for each: one due beyond the hot window stays in the log for the loader.
        async def restore_all(rt):
            return [await restore(rt.for_namespace(ns), ids=[m.pk for m in group]) for ns, group in selected.items()]

        try:
            counts = run_with_runtime(restore_all)
        except RedisError as exc:
            self.message_user(request, f"Redis unavailable ({exc}): some may be left unrestored, run the action again",
                              messages.ERROR)
            return
        except QueueError as exc:  # the log unavailable, another restore of the namespace running
            self.message_user(request, f"{exc}: some may be left unrestored, run the action again", messages.ERROR)
            return
        self.message_user(request, f"Restored {sum(c.restored for c in counts)}; "
                                   f"{sum(c.already_live for c in counts)} already live in Redis; "
                                   f"{sum(c.skipped for c in counts)} skipped (ended or expired); "
                                   f"{sum(c.left_cold for c in counts)} left in the message log for the loader "
                                   "(due beyond the hot window).", messages.SUCCESS)

    @admin.action(description="Delete selected messages from the queue", permissions=["change"])
    def delete_selected_messages(self, request, queryset):
        selected = self._selected(request, queryset)
        if selected is None:
            return
        targets = {ns: [(m.topic, m.msg_id) for m in group] for ns, group in selected.items()}

        async def delete_all(rt):
            return [await delete_message(rt.for_namespace(ns), topic=topic, msg_id=msg_id)
                    for ns, ns_targets in targets.items() for topic, msg_id in ns_targets]

        try:
            deleted = sum(run_with_runtime(delete_all))
        except RedisError as exc:
            self.message_user(request, f"Redis unavailable ({exc}): some may be left undeleted, run the action again", messages.ERROR)
            return
        except LogUnavailable as exc:  # a message Redis lost is deleted in the log too
            self.message_user(request, f"{exc}: some may be left undeleted, run the action again", messages.ERROR)
            return
        total = sum(len(t) for t in targets.values())
        self.message_user(request, f"Deleted {deleted}; {total - deleted} were not live (already ended or not in "
                                   f"Redis). The list shows the message log: {LOG_CATCHES_UP}.", messages.SUCCESS)
