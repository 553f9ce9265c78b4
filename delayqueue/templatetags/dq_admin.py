"""Admin template helpers."""
from datetime import date, datetime

from django import template
from django.contrib.admin.templatetags.admin_list import date_hierarchy
from django.contrib.admin.templatetags.base import InclusionAdminNode
from django.db.models import Max, Min
from django.utils import timezone

register = template.Library()


class _SpanQuerySet:
    """Stands in for the change list's queryset in Django's date hierarchy. Django finds the
    years, months or days that have rows with SELECT DISTINCT date_trunc(...) over the filtered
    list, and MIN/MAX over it, which scan every matching row when another filter is on. This
    offers every year, month or day between the table's first and last row instead (MIN and
    MAX straight off the time index): a navigation aid, where a day may lead to an empty page."""

    def __init__(self, cl):
        self._model = cl.model
        self._field = cl.date_hierarchy
        self._params = cl.params
        self._span = None

    def _first_last(self):
        if self._span is None:
            span = self._model._default_manager.aggregate(first=Min(self._field), last=Max(self._field))
            self._span = (span["first"], span["last"])
        return self._span

    def aggregate(self, **_lookups):
        first, last = self._first_last()
        return {"first": first, "last": last}

    def _param(self, part: str, default: int) -> int:
        """The drilled-down year or month; absent when Django picked the level itself because
        every row falls in one year (or month), which is then the first row's."""
        return int(self._params.get(f"{self._field}__{part}") or default)

    def datetimes(self, _field_name, kind):
        first, last = self._first_last()
        if first is None:
            return []
        first, last = timezone.localtime(first), timezone.localtime(last)
        if kind == "year":
            return [datetime(year, 1, 1) for year in range(first.year, last.year + 1)]
        year = self._param("year", first.year)
        if kind == "month":
            return [datetime(year, month, 1) for month in range(1, 13)
                    if (first.year, first.month) <= (year, month) <= (last.year, last.month)]
        month = self._param("month", first.month)
        days = []
        day = date(year, month, 1)
        while day.month == month:
            if first.date() <= day <= last.date():
                days.append(datetime(year, month, day.day))
            day = date.fromordinal(day.toordinal() + 1)
        return days


class _SpanChangeList:
    def __init__(self, cl):
        self._cl = cl
        self.queryset = _SpanQuerySet(cl)

    def __getattr__(self, name):
        return getattr(self._cl, name)


def span_date_hierarchy(cl):
    return date_hierarchy(_SpanChangeList(cl))


@register.tag(name="span_date_hierarchy")
def span_date_hierarchy_tag(parser, token):
    return InclusionAdminNode(
        parser, token, func=span_date_hierarchy, template_name="date_hierarchy.html", takes_context=False
    )
