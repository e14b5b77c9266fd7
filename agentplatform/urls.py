from django.contrib import admin
from django.urls import include, path

from agentplatform import dashboard, health

urlpatterns = [
    # Before admin.site.urls, whose catch-all would otherwise claim the path.
    path("admin/dashboard/", dashboard.dashboard_view, name="ops-dashboard"),
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("webhooks/", include("webhooks.urls")),
]
