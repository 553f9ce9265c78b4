"""Rate limits and live-message caps in the admin, as `manage.py set_limits` sets them."""
from django import forms
from django.contrib import admin

from delayqueue.api.validation import TopicSerializer, first_error
from delayqueue.config.settings import load_config
from delayqueue.core.names import checked_namespace
from delayqueue.models import Limit
from delayqueue.ops.admin.namespaces import NamespacedAdmin, NamespaceFilter


class LimitForm(forms.ModelForm):
    class Meta:
        model = Limit
        fields = ("namespace", "topic", "produce_rate", "consume_rate", "max_live")

    def clean_namespace(self):
        # As set_limits --namespace checks it: a row under a name no namespace can have is never in force.
        try:
            return checked_namespace(self.cleaned_data["namespace"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_topic(self):
        topic = self.cleaned_data["topic"]
        if topic:
            serializer = TopicSerializer(data={"topic": topic})
            if not serializer.is_valid():
                raise forms.ValidationError(first_error(serializer.errors))
        return topic

    def validate_unique(self):
        super().validate_unique()
        # A change page shows the namespace read-only, off the form, so Django skips the (namespace, topic)
        # constraint: a topic that already has a row would be an IntegrityError on save.
        if "namespace" not in self.fields and "topic" in self.cleaned_data:
            row = self.instance
            others = Limit.objects.using(row._state.db).filter(namespace=row.namespace).exclude(pk=row.pk)
            if others.filter(topic=self.cleaned_data["topic"]).exists():
                self.add_error("topic", f"namespace {row.namespace} already has limits for this topic: change them")


@admin.register(Limit)
class LimitAdmin(NamespacedAdmin):
    """Rate limits and live-message caps (services/admission.py), as `manage.py set_limits` sets
    them: an empty topic is the whole namespace, an empty limit is none. Limits saved here are the
    operator's (a tenant's setTopicConfig cannot change them). Every web process applies a change
    within a second."""

    form = LimitForm
    list_display = ("namespace", "whose", "produce_rate", "consume_rate", "max_live", "set_by_operator", "updated_at")
    list_filter = (NamespaceFilter,)
    search_fields = ("=topic",)
    search_help_text = "Exact topic"
    ordering = ("namespace", "topic")

    @admin.display(description="topic", ordering="topic")
    def whose(self, obj):
        return obj.topic or "(the whole namespace)"

    def save_model(self, request, obj, form, change):
        obj.set_by_operator = True  # saved here: the operator's, beyond any tenant's setTopicConfig
        super().save_model(request, obj, form, change)

    def get_readonly_fields(self, request, obj=None):
        # A namespace's rows live in its database (messagelog/routing.py): a row does not move to another.
        return ("namespace",) if obj is not None else ()

    def get_changeform_initial_data(self, request):
        return {"namespace": load_config().namespace, **super().get_changeform_initial_data(request)}
