import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
# Django runs each ASGI request's sync code in a thread of its own; per-thread persistent
# connections would pile up, so connections come from a per-process pool here.
os.environ.setdefault("DATABASE_POOL", "true")
application = get_asgi_application()
