from django.contrib import admin
from django.urls import include, path

from agentplatform import console_stream, dashboard, health, metrics_endpoint, workers_page

urlpatterns = [
    # Before admin.site.urls, whose catch-all would otherwise claim the path.
    path("admin/dashboard/", dashboard.dashboard_view, name="ops-dashboard"),
    path("admin/workers/", workers_page.workers_view, name="ops-workers"),
    path(
        "admin/runs/run/<uuid:pk>/live/", console_stream.console_run_stream, name="ops-run-stream"
    ),
    path("admin/live/", console_stream.console_activity_stream, name="ops-activity-stream"),
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics_endpoint.metrics_view, name="metrics"),
    path("webhooks/", include("webhooks.urls")),
    path("api/", include("agentplatform.api.urls")),
]

# Under /api/ even Django's own 404 and 500 answer as problem details.
handler404 = "agentplatform.api.errors.page_not_found"
handler500 = "agentplatform.api.errors.server_error"
