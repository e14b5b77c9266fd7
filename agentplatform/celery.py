"""The Celery application: configured from Django settings (namespace CELERY_)."""

import os

from celery import Celery

from agentplatform import broker  # noqa: F401  (registers the embedded transport)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")

app = Celery("agentplatform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
