"""Admin template helpers."""
from datetime import datetime

from django import template
from django.contrib.admin.templatetags.admin_list import date_hierarchy
from django.contrib.admin.templatetags.base import InclusionAdminNode
from django.db.models import Max, Min
from django.utils import timezone

register = template.Library()


class _SpanQuerySet:
    """Stands in for the change list's queryset in Django's date hierarchy. Django lists the
    years, months or days that have rows with SELECT DISTINCT date_trunc(...), a scan of every
    row in range; this lists each one between the first and the last row (MIN and MAX come off
    the time index), so a day without messages may show up as a link to an empty page."""

    def __init__(self, queryset):
        self._queryset = queryset

    def aggregate(self, *args, **kwargs):
        return self._queryset.aggregate(*args, **kwargs)

    def datetimes(self, field_name, kind):
        span = self._queryset.aggregate(first=Min(field_name), last=Max(field_name))
        if span["first"] is None:
            return []
        first, last = timezone.localtime(span["first"]), timezone.localtime(span["last"])
        moments = []
        if kind == "year":
            moments = [datetime(year, 1, 1) for year in range(first.year, last.year + 1)]
        elif kind == "month":
            month = datetime(first.year, first.month, 1)
            while (month.year, month.month) <= (last.year, last.month):
                moments.append(month)
                month = datetime(month.year + month.month // 12, month.month % 12 + 1, 1)
        else:
            day = first.date()
            while day <= last.date():
                moments.append(datetime(day.year, day.month, day.day))
                day = day.fromordinal(day.toordinal() + 1)
        return moments


class _SpanChangeList:
    def __init__(self, cl):
        self._cl = cl
        self.queryset = _SpanQuerySet(cl.queryset)

    def __getattr__(self, name):
        return getattr(self._cl, name)


def span_date_hierarchy(cl):
    return date_hierarchy(_SpanChangeList(cl))


@register.tag(name="span_date_hierarchy")
def span_date_hierarchy_tag(parser, token):
    return InclusionAdminNode(
        parser, token, func=span_date_hierarchy, template_name="date_hierarchy.html", takes_context=False
    )
