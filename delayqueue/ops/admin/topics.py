"""The admin's topic pages: a topic's settings form with pause / resume / purge, and its dead
letters with redrive and purge. Any topic can be opened (`?namespace=&topic=`), also one without
a TopicConfig row yet: saving its form creates the row. Every action goes through the same
services as the API (delayqueue/services/) in the topic's namespace, is a POST
(the admin's CSRF check) by a staff user with the change permission on topic settings, and the
broad ones (pause, purge, purging dead letters) first show a confirmation page."""
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from redis.exceptions import RedisError

from delayqueue.api.validation import DEAD_CURSOR, MsgIdField, TopicSerializer, first_error
from delayqueue.config.settings import load_config
from delayqueue.core.clock import from_millis
from delayqueue.core.constants import (MAX_DELAY_MILLIS, MAX_LIMIT, MAX_PUSH_URL_LENGTH, MAX_RETRY, MAX_SHARDS,
                                       PUSH_MAX_CONCURRENCY, PUSH_MAX_TIMEOUT_MILLIS, REDRIVE_DEFAULT_RATE,
                                       REDRIVE_MAX_RATE, RETRY_BACKOFF_MAX_MILLIS)
from delayqueue.core.exceptions import BadRequest, CapReached, LogUnavailable, QueueError
from delayqueue.core.names import checked_namespace
from delayqueue.messagelog.connection import orm_unavailable
from delayqueue.messagelog.routing import database_of
from delayqueue.models import Limit, RedriveTask, TopicConfig
from delayqueue.ops import figures
from delayqueue.ops.admin.namespaces import NamespacedAdmin, NamespaceFilter
from delayqueue.runtime import run_with_runtime
from delayqueue.services.dead_letters import create_redrive, dead_letters, purge_dead_letters, redrive_state
from delayqueue.services.topic_control import pause_topic, resume_topic, set_topic_config
from delayqueue.services.topics import purge_topic, topic_config, topic_info

DEAD_PAGE_SIZE = 50
# Shown once, when made (the topic page answering the save): never read back, nor filtered on.
SECRET_FIELDS = ("push_secret", "push_previous_secret")
# A running redrive's page reloads itself this often.
REDRIVE_REFRESH_SECONDS = 1


class BadTarget(Exception):
    """A namespace, topic or msgId from the request that the API would refuse; its text says why."""


def _target(params) -> tuple[str, str]:
    """The (namespace, topic) a request names, checked as the API checks them."""
    namespace = params.get("namespace") or load_config().namespace
    try:
        checked_namespace(namespace)
    except ValueError as exc:
        raise BadTarget(f"namespace: {exc}") from None
    serializer = TopicSerializer(data={"topic": params.get("topic", "")})
    if not serializer.is_valid():
        raise BadTarget(first_error(serializer.errors))
    return namespace, serializer.validated_data["topic"]


def in_namespace(namespace: str, func, **kwargs):
    """`await func(rt, **kwargs)` with the runtime of `namespace`, from sync code."""
    return run_with_runtime(lambda rt: func(rt.for_namespace(namespace), **kwargs))


def _optional(label: str, minimum: int, maximum: int, help_text: str) -> forms.IntegerField:
    return forms.IntegerField(label=label, required=False, min_value=minimum, max_value=maximum, help_text=help_text)


class TopicSettingsForm(forms.Form):
    """setTopicConfig's settings; an empty field is the default (the service's, or no limit)."""

    ttl_millis = _optional("TTL (ms)", 1, MAX_DELAY_MILLIS, "default ttlMillis of its sends; empty: the service's")
    max_retry = _optional("max retry", 0, MAX_RETRY, "default maxRetry of its sends; empty: the service's")
    ack_timeout_millis = _optional("ack timeout (ms)", 1, MAX_DELAY_MILLIS,
                                   "default ack timeout of its pulls; empty: the service's")
    retry_backoff_millis = forms.IntegerField(
        label="retry backoff (ms)", min_value=0, max_value=MAX_DELAY_MILLIS,
        help_text="wait before a message given back is ready again, doubling per delivery; 0: none")
    retry_backoff_max_millis = forms.IntegerField(label="longest backoff (ms)", min_value=1,
                                                  max_value=MAX_DELAY_MILLIS)
    dead_letter = forms.BooleanField(label="keep dead letters", required=False)
    produce_rate = _optional("produce rate (/s)", 1, MAX_LIMIT, "empty: no limit")
    consume_rate = _optional("consume rate (/s)", 1, MAX_LIMIT, "empty: no limit")
    max_live = _optional("live-message cap", 1, MAX_LIMIT, "empty: none")
    push_url = forms.CharField(label="push URL", required=False, max_length=MAX_PUSH_URL_LENGTH,
                               help_text="due messages are POSTed here instead of being pulled (docs/push.md); "
                                         "empty: push off, its signing secrets forgotten")
    push_concurrency = forms.IntegerField(label="push concurrency", min_value=1, max_value=PUSH_MAX_CONCURRENCY,
                                          help_text="pushes in flight at once, across every pusher")
    push_timeout_millis = forms.IntegerField(label="push timeout (ms)", min_value=1, max_value=PUSH_MAX_TIMEOUT_MILLIS)
    push_rate = forms.IntegerField(label="push rate (/s)", required=False, min_value=0, max_value=MAX_LIMIT,
                                   help_text="pushes started a second; empty or 0: no limit")
    shards = forms.IntegerField(label="shards", min_value=1, max_value=MAX_SHARDS,
                                help_text="Redis key sets its new messages spread over (docs/scaling.md)")
    rotate_push_secret = forms.BooleanField(
        label="rotate push secret", required=False,
        help_text="a new signing secret, shown once; the old one signs too for DELAYQUEUE_PUSH_SECRET_GRACE_SECONDS")

    SETTINGS = ("ttl_millis", "max_retry", "ack_timeout_millis", "retry_backoff_millis", "retry_backoff_max_millis",
                "dead_letter", "push_url", "push_concurrency", "push_timeout_millis", "push_rate", "shards")
    LIMITS = ("produce_rate", "consume_rate", "max_live")

    @classmethod
    def initial_of(cls, namespace: str, topic: str) -> dict:
        """The topic's own values as stored (None: the default), its defaults when it has no row."""
        database = database_of(namespace)
        row = TopicConfig.objects.using(database).filter(namespace=namespace, topic=topic).first() or TopicConfig()
        limit = Limit.objects.using(database).filter(namespace=namespace, topic=topic).first() or Limit()
        return {**{name: getattr(row, name) for name in cls.SETTINGS},
                **{name: getattr(limit, name) for name in cls.LIMITS}}


class ConfirmForm(forms.Form):
    confirmed = forms.BooleanField(required=True)


@admin.register(TopicConfig)
class TopicConfigAdmin(NamespacedAdmin):
    list_display = ("topic", "namespace", "paused", "retry_backoff_millis", "dead_letter", "push_url", "updated_at")
    list_filter = (NamespaceFilter, "paused")
    search_fields = ("=topic",)
    search_help_text = "Exact topic"
    ordering = ("namespace", "topic")
    show_facets = admin.ShowFacets.NEVER
    change_list_template = "admin/delayqueue/topicconfig/change_list.html"

    # A row is created by saving a topic's page; a topic's settings are changed there too.
    def has_add_permission(self, request):
        return False

    def lookup_allowed(self, lookup, value, request=None):
        # The list takes any field's lookup from its query string: on a signing secret
        # (?push_secret__startswith=...) it would answer whether a guess is right, a character at a time.
        if lookup.split(LOOKUP_SEP, 1)[0] in SECRET_FIELDS:
            return False
        return super().lookup_allowed(lookup, value, request)

    def has_delete_permission(self, request, obj=None):
        return False

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, dict(extra_context or {}, default_namespace=load_config().namespace))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        row = self.get_object(request, object_id)
        if row is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        return HttpResponseRedirect(topic_url("topic", row.namespace, row.topic))

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("topic/", view(self.topic_view), name="delayqueue_topic"),
            path("topic/pause/", view(self.pause_view), name="delayqueue_topic_pause"),
            path("topic/resume/", view(self.resume_view), name="delayqueue_topic_resume"),
            path("topic/purge/", view(self.purge_view), name="delayqueue_topic_purge"),
            path("deadletters/", view(self.dead_letters_view), name="delayqueue_dead_letters"),
            path("redrive/<int:task_id>/", view(self.redrive_view), name="delayqueue_redrive"),
            *super().get_urls(),
        ]

    # --- helpers

    def _context(self, request, title: str, namespace: str, topic: str | None, **extra) -> dict:
        return {**self.admin_site.each_context(request), "opts": self.opts, "title": title, "namespace": namespace,
                "topic": topic, "topic_url": topic_url("topic", namespace, topic) if topic is not None else None,
                **extra}

    def _checked(self, request) -> tuple[str, str]:
        """A change's (namespace, topic), from its POST; PermissionDenied without the change permission."""
        if not self.has_change_permission(request) or request.method != "POST":
            raise PermissionDenied
        return _target(request.POST)

    def _bad_target(self, request, exc: BadTarget):
        self.message_user(request, str(exc), messages.ERROR)
        return HttpResponseRedirect(reverse("admin:delayqueue_topicconfig_changelist"))

    def _confirm(self, request, *, title: str, question: str, action: str, namespace: str, topic: str,
                 fields: dict | None = None):
        return TemplateResponse(request, "admin/delayqueue/confirm.html", self._context(
            request, title, namespace, topic, question=question, action=action, fields=fields or {}))

    # --- the topic page

    def topic_view(self, request):
        try:
            namespace, topic = _target(request.POST if request.method == "POST" else request.GET)
        except BadTarget as exc:
            return self._bad_target(request, exc)
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            if not self.has_change_permission(request):
                raise PermissionDenied
            form = TopicSettingsForm(request.POST)
            secret = None
            if form.is_valid():
                data = form.cleaned_data
                try:
                    secret = in_namespace(namespace, set_topic_config, topic=topic,
                                          changes={name: data[name] for name in form.SETTINGS},
                                          limits={name: data[name] or 0 for name in form.LIMITS},
                                          rotate_push_secret=data["rotate_push_secret"], by_operator=True)
                except BadRequest as exc:  # a push URL not allowed, a rotation without one: nothing saved
                    form.add_error("shards" if str(exc).startswith("shards:") else "push_url", str(exc))
                except CapReached as exc:  # a namespace's cap (settings rows, push concurrency): nothing saved either
                    form.add_error(None, str(exc))
                except LogUnavailable as exc:  # the namespace's PostgreSQL down (its ORM save too): nothing saved
                    form.add_error(None, f"Not saved: {exc}")
                except (RedisError, QueueError) as exc:
                    self.message_user(request, f"Settings saved in PostgreSQL, but their Redis copy could not be "
                                               f"written ({exc}): the scanners write it once Redis takes writes, "
                                               f"or save again", messages.ERROR)
                    return HttpResponseRedirect(topic_url("topic", namespace, topic))
                else:
                    self.message_user(request, "Settings saved; in force on every process within a second.",
                                      messages.SUCCESS)
                    if secret is None:
                        return HttpResponseRedirect(topic_url("topic", namespace, topic))
                    # Shown on this page only: a redirect would carry it through the session's messages.
                    form = self._settings_form(request, namespace, topic)
        else:
            form, secret = self._settings_form(request, namespace, topic), None
        return TemplateResponse(request, "admin/delayqueue/topicconfig/topic.html", self._context(
            request, f"Topic {topic}", namespace, topic, form=form, state=self._state(namespace, topic),
            new_push_secret=secret,
            can_change=self.has_change_permission(request),
            dead_letters_url=topic_url("deadletters", namespace, topic),
            pause_url=reverse("admin:delayqueue_topic_pause"), resume_url=reverse("admin:delayqueue_topic_resume"),
            purge_url=reverse("admin:delayqueue_topic_purge"),
            messages_url=(reverse("admin:delayqueue_message_changelist") + "?"
                          + urlencode({"namespace": namespace, "topic": topic}))))

    def _settings_form(self, request, namespace: str, topic: str) -> TopicSettingsForm | None:
        """The form with the topic's stored settings; None, and why shown, when PostgreSQL does not answer
        (a form of defaults would save them over the topic's own)."""
        try:
            return TopicSettingsForm(initial=TopicSettingsForm.initial_of(namespace, topic))
        except DatabaseError as exc:
            self.message_user(request, f"Settings not read: {orm_unavailable(exc)}", messages.ERROR)
            return None

    @staticmethod
    def _state(namespace: str, topic: str) -> dict:
        """What the topic page shows of the topic now: settings in force, queue sizes and
        messages waiting after a delivery (Redis), dead letters and running redrives (the log)."""
        async def read(rt):
            config = await topic_config(rt, topic=topic)
            info = await topic_info(rt, topic=topic)
            after_delivery, capped = await figures.waiting_after_delivery(
                rt, topic=topic, within_millis=config.retry_backoff_max_millis or RETRY_BACKOFF_MAX_MILLIS)
            dead, redrives = await figures.log_figures(rt, namespaces=[namespace], topic=topic)
            return {"config": config, "info": info, "after_delivery": after_delivery, "capped": capped,
                    "dead": dead.get((namespace, topic), 0), "redrives": redrives}

        try:
            return in_namespace(namespace, read)
        except RedisError as exc:
            return {"error": f"Redis unavailable: {exc}"}
        except QueueError as exc:
            return {"error": str(exc)}

    def pause_view(self, request):
        return self._topic_action(request, "pause", confirm="Pause topic {topic}? Pulls hand out nothing and long "
                                  "polls are held until it is resumed; its messages still fall due and sends still "
                                  "go in.")

    def resume_view(self, request):
        return self._topic_action(request, "resume", confirm=None)

    def purge_view(self, request):
        return self._topic_action(request, "purge", confirm="Purge topic {topic}? Every waiting, ready and consuming "
                                  "message ({live} now) ends as deleted. This cannot be undone.")

    def _topic_action(self, request, action: str, confirm: str | None):
        if request.method == "GET" and confirm is not None:
            # The confirmation page: a GET changes nothing.
            if not self.has_change_permission(request):
                raise PermissionDenied
            try:
                namespace, topic = _target(request.GET)
            except BadTarget as exc:
                return self._bad_target(request, exc)
            try:
                info = in_namespace(namespace, topic_info, topic=topic)
                live = info.waiting + info.ready + info.consuming
            except RedisError:
                live = "?"
            return self._confirm(request, title=f"{action.capitalize()} topic {topic}", action=request.path,
                                 question=confirm.format(topic=topic, live=live), namespace=namespace, topic=topic)
        try:
            namespace, topic = self._checked(request)
        except BadTarget as exc:
            return self._bad_target(request, exc)
        if confirm is not None and not ConfirmForm(request.POST).is_valid():
            return self._confirm(request, title=f"{action.capitalize()} topic {topic}", action=request.path,
                                 question=confirm.format(topic=topic, live="?"), namespace=namespace, topic=topic)
        try:
            if action == "pause":
                in_namespace(namespace, pause_topic, topic=topic)
                done = "Paused: pulls hand out nothing until it is resumed."
            elif action == "resume":
                in_namespace(namespace, resume_topic, topic=topic)
                done = "Resumed: pulls hand out its ready messages again."
            else:
                done = f"Purged: {in_namespace(namespace, purge_topic, topic=topic)} messages ended as deleted."
        except (RedisError, QueueError) as exc:
            self.message_user(request, f"{action} failed ({exc}): try again", messages.ERROR)
        else:
            self.message_user(request, done, messages.SUCCESS)
        return HttpResponseRedirect(topic_url("topic", namespace, topic))

    # --- dead letters

    def dead_letters_view(self, request):
        try:
            namespace, topic = _target(request.POST if request.method == "POST" else request.GET)
        except BadTarget as exc:
            return self._bad_target(request, exc)
        if request.method == "POST":
            return self._dead_letter_action(request, namespace, topic)
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        cursor = request.GET.get("cursor") or None
        if cursor is not None and not DEAD_CURSOR.match(cursor):
            self.message_user(request, "cursor: not a cursor a page of dead letters gave", messages.ERROR)
            cursor = None
        try:
            page, next_cursor = in_namespace(namespace, dead_letters, topic=topic, limit=DEAD_PAGE_SIZE,
                                             cursor=cursor)
            dead, redrives = in_namespace(namespace, figures.log_figures, namespaces=[namespace], topic=topic)
            error = None
        except QueueError as exc:
            page, next_cursor, dead, redrives, error = [], None, {}, [], str(exc)
        rows = [{"message": dead.message, "reason": dead.reason, "detail": dead.detail,
                 "died_at": from_millis(dead.died_at)} for dead in page]
        return TemplateResponse(request, "admin/delayqueue/topicconfig/dead_letters.html", self._context(
            request, f"Dead letters of topic {topic}", namespace, topic, page=rows, error=error,
            count=dead.get((namespace, topic), 0), redrives=redrives,
            next_url=topic_url("deadletters", namespace, topic, cursor=next_cursor) if next_cursor else None,
            first_url=topic_url("deadletters", namespace, topic) if cursor else None,
            default_rate=min(REDRIVE_DEFAULT_RATE, load_config().max_redrive_rate),
            max_rate=load_config().max_redrive_rate,
            can_change=self.has_change_permission(request)))

    def _dead_letter_action(self, request, namespace: str, topic: str):
        if not self.has_change_permission(request):
            raise PermissionDenied
        action = request.POST.get("action")
        everything = request.POST.get("scope") == "all"
        msg_ids = None if everything else request.POST.getlist("msg_id")
        back = HttpResponseRedirect(topic_url("deadletters", namespace, topic))
        if action not in ("redrive", "purge"):
            self.message_user(request, "action: must be redrive or purge", messages.ERROR)
            return back
        if not everything:
            if not msg_ids:
                self.message_user(request, "Select dead letters first (or act on all of them).", messages.WARNING)
                return back
            try:
                msg_ids = [MsgIdField().run_validation(msg_id) for msg_id in msg_ids]
            except Exception as exc:  # DRF's ValidationError, with the API's wording
                self.message_user(request, f"msgId: {first_error(getattr(exc, 'detail', str(exc)))}", messages.ERROR)
                return back
        if action == "redrive":
            rate = forms.IntegerField(min_value=1, max_value=REDRIVE_MAX_RATE, required=False)
            try:  # none given: create_redrive's default
                max_per_second = rate.clean(request.POST.get("rate"))
            except forms.ValidationError as exc:
                self.message_user(request, f"rate: {' '.join(exc.messages)}", messages.ERROR)
                return back
            try:
                task_id = in_namespace(namespace, create_redrive, topic=topic, msg_ids=msg_ids,
                                       max_per_second=max_per_second)
            except QueueError as exc:
                self.message_user(request, f"redrive failed ({exc}): try again", messages.ERROR)
                return back
            if task_id is None:
                self.message_user(request, "No such dead letter: nothing to redrive.", messages.WARNING)
                return back
            return HttpResponseRedirect(reverse("admin:delayqueue_redrive", args=[task_id]) + "?"
                                        + urlencode({"namespace": namespace}))
        if not ConfirmForm(request.POST).is_valid():
            which = "every dead letter" if everything else f"{len(msg_ids)} selected dead letter(s)"
            return self._confirm(
                request, title=f"Purge dead letters of topic {topic}", action=request.path, namespace=namespace,
                topic=topic, question=f"Remove {which} of topic {topic} and their history from the message log? "
                                      "This cannot be undone.",
                fields={"action": "purge", "scope": "all" if everything else "selected", "msg_id": msg_ids or []})
        try:
            count = in_namespace(namespace, purge_dead_letters, topic=topic, msg_ids=msg_ids)
        except QueueError as exc:
            self.message_user(request, f"purge failed ({exc}): try again", messages.ERROR)
        else:
            self.message_user(request, f"Purged {count} dead letter(s).", messages.SUCCESS)
        return back

    def redrive_view(self, request, task_id: int):
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        namespace = request.GET.get("namespace") or load_config().namespace
        try:
            checked_namespace(namespace)
        except ValueError as exc:
            return self._bad_target(request, BadTarget(f"namespace: {exc}"))
        try:
            task = RedriveTask.objects.using(database_of(namespace)).filter(pk=task_id, namespace=namespace).first()
        except DatabaseError as exc:  # the namespace's own PostgreSQL down
            self.message_user(request, f"Redrive task {task_id} not read: {orm_unavailable(exc)}", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:delayqueue_topicconfig_changelist"))
        if task is None:
            self.message_user(request, f"redrive task {task_id} not found in namespace {namespace}", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:delayqueue_topicconfig_changelist"))
        try:
            progress, error = in_namespace(namespace, redrive_state, task_id=task_id), None
        except QueueError as exc:
            progress, error = None, str(exc)
        return TemplateResponse(request, "admin/delayqueue/topicconfig/redrive.html", self._context(
            request, f"Redrive {task_id} of topic {task.topic}", namespace, task.topic, task=task, progress=progress,
            error=error, refresh=REDRIVE_REFRESH_SECONDS,
            dead_letters_url=topic_url("deadletters", namespace, task.topic)))


def topic_url(view: str, namespace: str, topic: str, **params) -> str:
    """The admin URL of a topic's page ("topic") or dead letters ("deadletters")."""
    name = {"topic": "admin:delayqueue_topic", "deadletters": "admin:delayqueue_dead_letters"}[view]
    return reverse(name) + "?" + urlencode({"namespace": namespace, "topic": topic, **params})
