"""Settings, read from the environment.

With nothing set, agentplatform runs embedded: the same PostgreSQL and Redis (Valkey)
as production, started for you from pip-installed wheels with their data in ``var/``
(agentplatform.embedded). With ``DATABASE_URL=postgres://...`` and
``CELERY_BROKER_URL=redis://...`` (or ``amqp://``) it uses those servers (production
mode). Every variable is listed in the README.

One module per part, read in this order (each imports what it needs from the ones
before it): ``environment`` (how a variable is read), ``core`` (Django's own),
``services`` (database, broker, Celery), ``platform`` (runs, sandboxes, git, models,
webhooks) and ``web`` (console, API, observability).
"""

from agentplatform.settings.core import *  # noqa: F403
from agentplatform.settings.environment import *  # noqa: F403
from agentplatform.settings.platform import *  # noqa: F403
from agentplatform.settings.services import *  # noqa: F403
from agentplatform.settings.web import *  # noqa: F403
