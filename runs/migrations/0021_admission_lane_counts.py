"""PostgreSQL: a function that takes an admission lane and then counts, for a submission
admitted and written by one statement (``runs.services._submission_insert_admitting``).

Within one statement every read shares its snapshot, taken before the lane is held; a
count must see every admission that let go of the lane it waited for. A ``VOLATILE``
PL/pgSQL function takes a new snapshot for each statement it runs, so its count, run
after its lane is taken, sees them: what the lane's statement and a second statement
gave before, in one statement (no pipeline of two). The lane is recorded for the
transaction as ``agentplatform.admission_lane`` (the stripe of the active-run counts,
migration 0020).

Arguments: the lanes to try, in order; the lane key; the workspace's key; the lane to
wait for when every lane is busy; the workspace; the repository whose count is wanted
(NULL: none, 0 answered); the UTC day whose spend is wanted (NULL: none, NULL answered).
"""

from django.db import migrations

FUNCTION = "agentplatform_admission_lane_counts"


def forwards(apps, schema_editor):
    quote = schema_editor.quote_name
    counts = quote(apps.get_model("runs", "ActiveRunCount")._meta.db_table)
    spend = quote(apps.get_model("runs", "WorkspaceSpend")._meta.db_table)
    schema_editor.execute(
        f"CREATE FUNCTION {FUNCTION}(lanes_tried int[], lane_key int, workspace_key int,"
        " lane_waited int, workspace bigint, repository bigint, spend_day date)"
        " RETURNS TABLE (in_workspace bigint, in_repository bigint, spent numeric)"
        " LANGUAGE plpgsql VOLATILE AS $$"
        " BEGIN"
        # The first free lane, in the order given (the filter is evaluated row by row
        # under the LIMIT: one lane is taken), or a wait for the one given.
        " PERFORM set_config('agentplatform.admission_lane', COALESCE("
        "(SELECT lane FROM unnest(lanes_tried) AS lane"
        " WHERE pg_try_advisory_xact_lock(lane_key + lane, workspace_key) LIMIT 1),"
        " (SELECT lane_waited FROM pg_advisory_xact_lock(lane_key + lane_waited, workspace_key))"
        ")::text, true);"
        # A statement of its own: its snapshot is taken with the lane held.
        " RETURN QUERY SELECT"
        " COALESCE(SUM(c.runs) FILTER (WHERE c.repository_id = 0), 0)::bigint,"
        " COALESCE(SUM(c.runs) FILTER (WHERE c.repository_id = repository), 0)::bigint,"
        f" (SELECT s.cost_usd FROM {spend} AS s"
        " WHERE s.workspace_id = workspace AND s.day = spend_day)::numeric"
        f" FROM {counts} AS c WHERE c.workspace_id = workspace"
        " AND c.repository_id IN (0, COALESCE(repository, 0));"
        " END $$"
    )


def backwards(apps, schema_editor):
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}(int[], int, int, int, bigint, bigint, date)")


class Migration(migrations.Migration):
    dependencies = [("runs", "0020_active_run_counts")]

    operations = [migrations.RunPython(forwards, backwards)]
