"""The operator console: Django's admin site under the platform's name, with a menu that
puts the operator's pages first and keeps the libraries' own tables for superusers."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest

# The order an on-call operator reads the menu in.
OPERATOR_APPS = ("runs", "jobs", "webhooks")
# Tables that belong to libraries (task results, beat's schedule rows, auth groups):
# useful to a superuser debugging the platform, noise to an operator.
LIBRARY_APPS = frozenset({"django_celery_results", "django_celery_beat", "auth"})


class ConsoleSite(admin.AdminSite):
    site_header = "agentplatform console"
    site_title = "agentplatform console"
    index_title = "Operations"
    # The menu is one click away (Home); its column would take a fifth of a laptop's
    # screen from every list.
    enable_nav_sidebar = False

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[Any]:
        apps = super().get_app_list(request, app_label)
        if not request.user.is_superuser:
            apps = [app for app in apps if app["app_label"] not in LIBRARY_APPS]

        def rank(app: dict[str, Any]) -> tuple[int, str]:
            label = app["app_label"]
            if label in OPERATOR_APPS:
                return (OPERATOR_APPS.index(label), "")
            return (len(OPERATOR_APPS), str(app["name"]))

        return sorted(apps, key=rank)


class ConsoleAdminConfig(AdminConfig):
    """``django.contrib.admin`` with :class:`ConsoleSite` as ``admin.site``."""

    default_site = "agentplatform.console.ConsoleSite"
