"""The operator console for tenants, tasks and runs.

Lists never query per row (related rows come with ``list_select_related``, large
columns are deferred) and never count huge tables. Operators act through actions that
call ``runs.services``; each action is recorded on the run's timeline
(``agent.run.operator_action``, with the operator as actor) and in the admin's history.

Each module registers its own pages: ``tenants`` (workspaces, repositories, tokens),
``task``, ``run`` (list, actions, run page) with ``run_page`` (what that page shows),
``identities`` (webhook secrets, linked accounts) and ``runs.replay.admin``.
"""

from runs.admin import identities, run, task, tenants  # noqa: F401  (each registers its pages)
from runs.replay import admin as replay_admin  # noqa: F401  (registers its page)
