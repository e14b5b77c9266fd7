"""Ids of the rows written at the platform's rate: tasks, runs, their timeline and the
outbox's events.

UUIDv7 (RFC 9562): a millisecond timestamp, then random bits, increasing within a
process. A B-tree index over random UUIDv4 takes each new key on a random leaf page, so
every insert dirties a page of its own, and the first change to a page after a
checkpoint writes the whole page (8 kB) to the WAL. Keys in time order go to the few
pages where the newest keys end (``make bench``, figure 6: the WAL a submission writes
after a checkpoint, against the same with UUIDv4 ids). What the ids give away is when
their row was made, as its ``created_at`` does; they name workspace-scoped rows and are
never a credential.

Their first characters are the time: two ids made in the same millisecond share twelve
of them, and ids of the same weeks share eight. Anything that names a row by part of
its id takes the end (``short_id``), which is random in these ids and in older UUIDv4
ones alike.
"""

from __future__ import annotations

import uuid

from django.db.models import Q
from uuid_utils.compat import uuid7


def new_id() -> uuid.UUID:
    """A new time-ordered id (UUIDv7, a ``uuid.UUID``)."""
    return uuid7()


def short_id(value: uuid.UUID | str, length: int = 8) -> str:
    """The last ``length`` hex digits of an id: its random end, for display and names."""
    return uuid.UUID(str(value)).hex[-length:]


_HEX = frozenset("0123456789abcdef")


def id_fragment_q(field: str, fragment: str) -> Q | None:
    """Rows whose id in ``field`` starts or ends with ``fragment`` (4 to 32 hex digits,
    dashes ignored), or None when the fragment cannot be part of an id.

    The start is a range over the id's index; the end (what ``short_id`` shows) is a
    suffix match on the id's text, hyphenated as PostgreSQL prints a uuid.
    """
    digits = fragment.replace("-", "").lower()
    if not 4 <= len(digits) <= 32 or not set(digits) <= _HEX:
        return None
    spare = 4 * (32 - len(digits))
    low = int(digits, 16) << spare
    starts = Q(**{f"{field}__gte": uuid.UUID(int=low)})
    if low + (1 << spare) < 1 << 128:
        starts &= Q(**{f"{field}__lt": uuid.UUID(int=low + (1 << spare))})
    printed = str(uuid.UUID(digits.rjust(32, "0")))
    tail, seen = len(printed), 0
    while seen < len(digits):
        tail -= 1
        seen += printed[tail] != "-"
    return starts | Q(**{f"{field}__endswith": printed[tail:]})
