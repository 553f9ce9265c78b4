"""The Spark stats job's figures per topic and hour, read-only in the admin."""
from django.contrib import admin

from delayqueue.models import TopicHourStats
from delayqueue.ops.admin.namespaces import NamespacedAdmin, NamespaceFilter


@admin.register(TopicHourStats)
class TopicHourStatsAdmin(NamespacedAdmin):
    """The figures the Spark stats job (spark/stats.py) computes from the log, per topic and
    hour; empty until the job has run. Read-only: the job replaces them."""

    list_display = ("topic", "hour", "sent", "delivered", "acked", "nacked", "timed_out", "expired", "exhausted",
                    "deleted", "fire_lateness_p50", "fire_lateness_p90", "fire_lateness_p99",
                    "latency_p50", "latency_p90", "latency_p99")
    list_filter = (NamespaceFilter, "topic")
    search_fields = ("=topic",)  # exact: on the unique index, not an icontains scan
    search_help_text = "Exact topic"
    date_hierarchy = "hour"
    ordering = ("-hour", "topic")
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
