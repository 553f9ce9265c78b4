from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from delayqueue.api.edge import metrics_token_required
from delayqueue.ops.dashboard import dashboard
from delayqueue.ops.metrics import metrics

urlpatterns = [
    # Before admin/ so the admin's catch-all does not take it; staff login required all the same.
    path("admin/dashboard/", dashboard, name="delayqueue-dashboard"),
    path("admin/", admin.site.urls),
    # Open unless DELAYQUEUE_METRICS_TOKEN is set.
    path("metrics", metrics_token_required(metrics), name="metrics"),
    path("api/schema/", metrics_token_required(SpectacularAPIView.as_view()), name="api-schema"),
    path("api/docs/", metrics_token_required(SpectacularSwaggerView.as_view(url_name="api-schema")), name="api-docs"),
    path("api/redoc/", metrics_token_required(SpectacularRedocView.as_view(url_name="api-schema")), name="api-redoc"),
    path("", include("delayqueue.api.urls")),
]
