"""PostgreSQL tells every web process when who may do what through the API changed.

A statement-level trigger on tokens, users, memberships, repositories and workspaces
notifies ``agentplatform_access`` (delivered when the transaction commits, once per
transaction). The web processes' memory of tokens and repositories
(``agentplatform/api/access_cache.py``) is dropped when it arrives. Only the columns
that decide access count for tokens and users, so the bookkeeping writes of every
request (``last_used_at``) and of every login (``last_login``) notify nobody.
"""

from django.conf import settings
from django.db import migrations

CHANNEL = "agentplatform_access"
FUNCTION = "agentplatform_access_changed"
TRIGGER = "agentplatform_access_changed"

# (model, the events that change access to it)
WATCHED = (
    ("runs.ApiToken", "UPDATE OF user_id, prefix, key_hash, revoked_at OR DELETE OR TRUNCATE"),
    (
        settings.AUTH_USER_MODEL,
        "UPDATE OF id, username, is_active, is_staff, is_superuser OR DELETE OR TRUNCATE",
    ),
    ("runs.Membership", "INSERT OR UPDATE OR DELETE OR TRUNCATE"),
    ("runs.Repository", "UPDATE OR DELETE OR TRUNCATE"),
    ("runs.Workspace", "UPDATE OR DELETE OR TRUNCATE"),
)


def _tables(apps):
    for label, events in WATCHED:
        yield apps.get_model(label)._meta.db_table, events


def forwards(apps, schema_editor):
    quote = schema_editor.quote_name
    schema_editor.execute(
        f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN PERFORM pg_notify('{CHANNEL}', TG_TABLE_NAME); RETURN NULL; END $$"
    )
    for table, events in _tables(apps):
        schema_editor.execute(
            f"CREATE TRIGGER {TRIGGER} AFTER {events} ON {quote(table)}"
            f" FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()"
        )


def backwards(apps, schema_editor):
    quote = schema_editor.quote_name
    for table, _ in _tables(apps):
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {quote(table)}")
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0018_time_ordered_ids"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
