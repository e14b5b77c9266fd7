"""A clone URL that would reach the platform's own network is refused where it is
registered: the API (a 400 problem body naming the reason), the admin and
``repository_add``, unless the operator allows that host or network."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from runs.models import Membership, Repository
from tests.factories import RepositoryFactory, UserFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db

REFUSED = [
    ("https://127.0.0.1/octo/x.git", "loopback"),
    ("https://127.0.0.1:8000/octo/x.git", "loopback"),
    ("https://[::1]/octo/x.git", "loopback"),
    ("ssh://git@127.0.0.1:6379/octo/x.git", "loopback"),
    ("git@localhost:octo/x.git", "loopback"),
    ("https://localhost/octo/x.git", "loopback"),
    ("https://2130706433/octo/x.git", "loopback"),
    ("https://0x7f.1/octo/x.git", "loopback"),
    ("https://[::ffff:127.0.0.1]/octo/x.git", "loopback"),
    ("https://0.0.0.0/octo/x.git", "unspecified"),
    ("https://10.1.2.3/octo/x.git", "private"),
    ("https://172.16.0.1/octo/x.git", "private"),
    ("https://192.168.1.10/octo/x.git", "private"),
    ("https://100.64.0.1/octo/x.git", "non-global"),
    ("https://169.254.169.254/latest/meta-data/", "metadata"),
    ("https://[fd00:ec2::254]/latest/", "metadata"),
    ("https://100.100.100.200/latest/", "metadata"),
    ("https://[64:ff9b::a9fe:a9fe]/latest/", "metadata"),
    ("https://[fe80::1]/octo/x.git", "link-local"),
    ("https://[fd12:3456::1]/octo/x.git", "private"),
]


@pytest.fixture
def production_rules(settings):
    """The production defaults (the test settings allow the tests' own servers)."""
    settings.GIT_INTERNAL_HOSTS = []
    settings.GIT_INTERNAL_NETWORKS = []
    settings.GIT_ALLOWED_SCHEMES = ["https", "ssh"]
    return settings


@pytest.fixture
def admin_client(production_rules):
    workspace = WorkspaceFactory(slug="ours")
    user = UserFactory()
    Membership.objects.create(workspace=workspace, user=user, role="admin")
    client = APIClient()
    client.force_authenticate(user)
    return client


def _register(client: APIClient, clone_url: str, name: str = "r"):
    return client.post(
        "/api/repositories/",
        {"workspace": "ours", "name": name, "provider": "github", "clone_url": clone_url},
        format="json",
    )


@pytest.mark.parametrize(("url", "kind"), REFUSED)
def test_an_internal_clone_url_is_refused_with_a_problem_body(admin_client, url, kind):
    response = _register(admin_client, url)

    assert response.status_code == 400, response.content
    assert response["content-type"] == "application/problem+json"
    (reason,) = response.json()["errors"]["clone_url"]
    assert kind in reason
    # Says how an operator would allow it, except where nothing can.
    assert ("GIT_INTERNAL_NETWORKS" in reason) == (kind != "metadata"), reason
    assert not Repository.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com\\@127.0.0.1/octo/x.git",
        "https://%31%32%37.0.0.1/octo/x.git",
        "https://github.com%2f@127.0.0.1/octo/x.git",
        "https://127.0.0.1 /octo/x.git",
        "https://[::1/octo/x.git",
        "https://-oProxyCommand/octo/x.git",
    ],
)
def test_a_host_that_another_parser_could_read_differently_is_refused(admin_client, url):
    response = _register(admin_client, url)

    assert response.status_code == 400, response.content
    assert not Repository.objects.exists()


def test_changing_the_clone_url_to_an_internal_one_is_refused(admin_client):
    created = _register(admin_client, "https://github.com/octo/x.git")
    assert created.status_code == 201, created.content

    response = admin_client.patch(
        f"/api/repositories/{created.json()['id']}/",
        {"clone_url": "https://169.254.169.254/latest/"},
        format="json",
    )

    assert response.status_code == 400
    assert "metadata" in response.json()["errors"]["clone_url"][0]
    assert Repository.objects.get().clone_url == "https://github.com/octo/x.git"


def test_the_operator_allows_an_internal_host_or_network(admin_client, settings):
    settings.GIT_INTERNAL_HOSTS = ["localhost"]
    settings.GIT_INTERNAL_NETWORKS = ["10.0.0.0/8", "169.254.0.0/16"]

    assert _register(admin_client, "https://localhost/octo/x.git", "a").status_code == 201
    assert _register(admin_client, "https://10.1.2.3/octo/x.git", "b").status_code == 201
    # Not the loopback address by another name, and never a metadata service.
    assert _register(admin_client, "https://127.0.0.1/octo/x.git", "c").status_code == 400
    metadata = _register(admin_client, "https://169.254.169.254/latest/", "d")
    assert metadata.status_code == 400
    assert "metadata" in metadata.json()["errors"]["clone_url"][0]


def test_a_name_that_does_not_resolve_yet_may_be_registered(admin_client):
    # Every clone resolves it again (tests/runs/agent/test_platform_git_addresses.py).
    assert _register(admin_client, "https://git.example.invalid/octo/x.git").status_code == 201


@pytest.mark.parametrize("url", ["https://127.0.0.1/x.git", "https://localhost/x.git"])
def test_repository_add_refuses_an_internal_clone_url(production_rules, url):
    WorkspaceFactory(slug="ops")

    with pytest.raises(CommandError, match="loopback"):
        call_command("repository_add", "--workspace", "ops", "--name", "r", "--clone-url", url)

    assert not Repository.objects.exists()


def test_the_admin_refuses_an_internal_clone_url(production_rules, client):
    workspace = WorkspaceFactory()
    staff = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(staff)
    existing = RepositoryFactory(workspace=workspace, clone_url="https://github.com/octo/x.git")

    page = client.get(f"/admin/runs/repository/{existing.pk}/change/")
    form = page.context["adminform"].form
    data = {
        name: form[name].value() if form[name].value() is not None else "" for name in form.fields
    }
    for name, value in data.items():
        if isinstance(value, (list, dict)):
            data[name] = form.fields[name].prepare_value(value)
    data["clone_url"] = "https://169.254.169.254/latest/"
    response = client.post(f"/admin/runs/repository/{existing.pk}/change/", data)

    assert response.status_code == 200  # the form again, with the error
    assert "metadata" in str(response.context["adminform"].form.errors["clone_url"])
    existing.refresh_from_db()
    assert existing.clone_url == "https://github.com/octo/x.git"
