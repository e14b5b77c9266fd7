"""Operator views of the delivery tables, and the pieces every console page shares.

The queue tables (outbox, processed events, dead letters) are read-only here: rows change
only through actions, and every action goes through a service and leaves a LogEntry with
the operator's name. ``console`` holds what every console page shares (other apps'
admins import it); ``delivery`` and ``dead_letters`` register the pages of jobs' tables.
"""

from jobs.admin import dead_letters, delivery  # noqa: F401  (each registers its pages)
