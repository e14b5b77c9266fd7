"""A JSON field edited in the admin answers bad JSON (too deep, NUL) with a form error,
not a server error, and the row is unchanged."""

from __future__ import annotations

import json

import pytest

from tests.factories import RepositoryFactory, UserFactory

pytestmark = pytest.mark.django_db


def _form(repository, forbidden_paths: str) -> dict[str, str]:
    return {
        "workspace": str(repository.workspace_id),
        "name": repository.name,
        "provider": repository.provider,
        "external_id": "",
        "clone_url": repository.clone_url,
        "default_branch": "main",
        "test_command": repository.test_command,
        "setup_command": "",
        "setup_cache_paths": json.dumps(repository.setup_cache_paths),
        "setup_lock_files": json.dumps(repository.setup_lock_files),
        "webhook_secret": "",
        "forbidden_paths": forbidden_paths,
        "allowed_commands": json.dumps(repository.allowed_commands),
        "max_active_runs": "3",
        "model_profile": "",
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [("[" * 100_000 + "]" * 100_000, "nests deeper"), ('["\\u0000"]', "NUL")],
)
def test_bad_json_in_an_admin_json_field_is_a_form_error(client, value, message):
    repository = RepositoryFactory(forbidden_paths=[".git/*"])
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))

    response = client.post(
        f"/admin/runs/repository/{repository.pk}/change/", _form(repository, value)
    )

    assert response.status_code == 200
    assert message in response.content.decode()
    repository.refresh_from_db()
    assert repository.forbidden_paths == [".git/*"]
