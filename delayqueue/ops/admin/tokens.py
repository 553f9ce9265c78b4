"""API tokens in the admin: created (shown once), listed and revoked."""
from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers

from delayqueue.core.constants import Scope
from delayqueue.core.exceptions import QueueError
from delayqueue.models import ApiToken
from delayqueue.ops.admin.lists import CheckedListAdmin
from delayqueue.stores import rows


class ApiTokenForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(choices=Scope.choices, widget=forms.CheckboxSelectMultiple)
    name = forms.CharField(required=False, max_length=100, help_text="unique; generated if left empty")

    class Meta:
        model = ApiToken
        fields = ("name", "namespace", "scopes")

    def clean(self):
        data = super().clean()
        try:
            rows.token_namespace(data.get("namespace") or "")
        except QueueError as exc:
            self.add_error("namespace", str(exc))
        if data.get("name") and ApiToken.objects.filter(name=data["name"]).exists():
            self.add_error("name", f"a token named {data['name']!r} already exists")
        return data


@admin.register(ApiToken)
class ApiTokenAdmin(CheckedListAdmin):
    """Tokens are created here (the token is shown once, on the page answering the save, never
    through messages, the session or a cookie), listed and revoked (with the change permission);
    a token cannot be edited or read back, only its sha256 is stored."""

    list_display = ("name", "namespace", "scopes", "created_at", "revoked_at")
    list_filter = ("namespace",)
    search_fields = ("name",)
    actions = ["revoke_selected"]
    form = ApiTokenForm
    readonly_fields = ("name", "namespace", "scopes", "created_at", "revoked_at")

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj is not None else ()

    def get_fields(self, request, obj=None):
        return self.readonly_fields if obj is not None else ApiTokenForm.Meta.fields

    def has_delete_permission(self, request, obj=None):
        return False  # revoke instead: the row says when a token stopped working

    def save_model(self, request, obj, form, change):
        if change:
            return
        data = form.cleaned_data  # checked by the form's clean()
        row, token = rows.create_token(namespace=data["namespace"], scopes=data["scopes"], name=data["name"] or None)
        obj.pk, obj.name, obj.namespace, obj.scopes = row.pk, row.name, row.namespace, row.scopes
        obj.shown_once = token  # for response_add, on this object alone: nothing stores it

    def response_add(self, request, obj, post_url_continue=None):
        """The new token on the answer's own page (not cached): Django's messages would carry it in
        a cookie."""
        response = TemplateResponse(request, "admin/delayqueue/apitoken/created.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "title": "API token created",
            "name": obj.name, "namespace": obj.namespace, "scopes": obj.scopes, "token": obj.shown_once})
        add_never_cache_headers(response)
        return response

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke_selected(self, request, queryset):
        names = list(queryset.filter(revoked_at__isnull=True).values_list("name", flat=True))
        for name in names:
            rows.revoke_token(name=name)
        messages.success(request, f"Revoked {len(names)} token(s).")
