"""The admin's pages over a namespace's rows read the database that holds them
(messagelog/routing.py): the one of the namespace the page is filtered on, kept through its change
pages by the admin's preserved filters; without a namespace chosen, DATABASE_URL's."""
from urllib.parse import parse_qs, urlencode

from django.contrib import admin, messages
from django.db import DatabaseError
from django.http import HttpResponseRedirect
from django.urls import reverse

from delayqueue.config.settings import DEFAULT_DATABASE, load_config
from delayqueue.core.names import checked_namespace
from delayqueue.messagelog.connection import orm_unavailable
from delayqueue.messagelog.routing import database_of
from delayqueue.ops.admin.lists import CheckedListAdmin
from delayqueue.stores import rows

PARAMETER = "namespace"


def page_namespace(request) -> str | None:
    """The namespace a page is about: its list's filter, or the filter of the list it came from."""
    namespace = request.GET.get(PARAMETER)
    if namespace is None:
        namespace = (parse_qs(request.GET.get("_changelist_filters", "")).get(PARAMETER) or [None])[0]
    try:
        return checked_namespace(namespace) if namespace else None
    except ValueError:
        return None


def page_database(request) -> str:
    namespace = page_namespace(request)
    return database_of(namespace) if namespace else DEFAULT_DATABASE


def change_url(viewname: str, pk: int, namespace: str) -> str:
    """A row's change page, in the database of its namespace."""
    return f"{reverse(viewname, args=[pk])}?{urlencode({'_changelist_filters': urlencode({PARAMETER: namespace})})}"


class NamespaceFilter(admin.SimpleListFilter):
    """The served namespaces and those routed to a database of their own (choosing one reads its
    database)."""

    title = "namespace"
    parameter_name = PARAMETER

    def lookups(self, request, model_admin):
        return [(ns, ns) for ns in dict.fromkeys([*rows.served_namespaces(), *load_config().log_routes])]

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset
        namespace = page_namespace(request)
        return queryset.none() if namespace is None else queryset.filter(namespace=namespace)


class NamespacedAdmin(CheckedListAdmin):
    """A ModelAdmin of rows kept in their namespace's database. Saves and deletes follow the row
    (routing.NamespaceRouter); lists and change pages read the page's namespace's database."""

    def get_queryset(self, request):
        return super().get_queryset(request).using(page_database(request))

    def changelist_view(self, request, extra_context=None):
        try:
            return super().changelist_view(request, extra_context)
        except DatabaseError as exc:  # the namespace's PostgreSQL (its own: DELAYQUEUE_NAMESPACE_DATABASES) down
            self.message_user(request, f"{self.opts.verbose_name_plural.capitalize()} not read: "
                                       f"{orm_unavailable(exc)}", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:index"))
