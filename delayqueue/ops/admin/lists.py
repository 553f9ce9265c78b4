"""The admin's lists take their filters from the query string: a value Django passes on unchecked
is refused there as a bad filter (the list again, with Django's "?e=1"), never a server error."""
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters


class CheckedListAdmin(admin.ModelAdmin):
    def get_changelist_instance(self, request):
        # PostgreSQL refuses a NUL byte in text (a DataError when the list is counted), and Django's
        # date drill-down computes the next year, month or day past its own checks (year 9999).
        if any("\x00" in value for values in request.GET.lists() for value in values[1]):
            raise IncorrectLookupParameters("a NUL byte in a filter")
        try:
            return super().get_changelist_instance(request)
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc
