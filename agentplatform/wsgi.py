import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
application = get_wsgi_application()

from agentplatform.celery import result_backend_load  # noqa: E402  (after Django's set-up)
from agentplatform.startup import loaded_objects_freeze  # noqa: E402

result_backend_load()
loaded_objects_freeze()
