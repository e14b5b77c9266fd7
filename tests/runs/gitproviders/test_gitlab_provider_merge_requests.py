"""The gitlab provider against a local server speaking the GitLab REST endpoints it uses."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import pytest

from runs.gitproviders import git_provider_for
from runs.gitproviders.base import GitProviderError
from runs.gitproviders.gitlab import GitLabProvider, gitlab_project_path
from runs.models import Repository

TOKEN = "glpat-" + "t" * 20


@pytest.fixture(autouse=True)
def driven_inline(monkeypatch):
    """Runs here are driven in this process against the local GitLab; no wake-up message
    may reach a worker process elsewhere, which would not know its address."""
    monkeypatch.setattr("runs.dispatch.run_wake", lambda **kwargs: None)


class FakeGitLab:
    """Just enough of GitLab's API v4: list, create and update merge requests; notes."""

    def __init__(self) -> None:
        self.merge_requests: list[dict[str, Any]] = []
        # Notes posted, by (project, "issues" or "merge_requests", iid).
        self.notes: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.tokens: list[str] = []
        # Create the merge request but answer 502, as a proxy losing the answer would.
        self.lose_next_create = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                url = urlparse(self.path)
                fake.calls.append((method, unquote(url.path), body))
                fake.tokens.append(self.headers.get("private-token", ""))
                status, answer = fake.route(method, url.path, parse_qs(url.query), body)
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PUT(self) -> None:
                self._handle("PUT")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/api/v4"

    def route(
        self, method: str, raw_path: str, query: dict[str, list[str]], body: dict[str, Any]
    ) -> tuple[int, Any]:
        # The project id is one URL-encoded path segment: /projects/group%2Fcalc/...
        parts = raw_path.strip("/").split("/")
        if parts[:3] != ["api", "v4", "projects"] or len(parts) < 5:
            return 404, {"message": "404 Not Found"}
        project = unquote(parts[3])
        if method == "POST" and len(parts) == 7 and parts[6] == "notes" and "/" in project:
            notes = self.notes.setdefault((project, parts[4], int(parts[5])), [])
            note = {"id": 5000 + len(notes), "body": body.get("body", "")}
            notes.append(note)
            return 201, note
        if parts[4] != "merge_requests" or "/" not in project:
            return 404, {"message": "404 Project Not Found"}
        mine = [m for m in self.merge_requests if m["project"] == project]
        if method == "GET" and len(parts) == 5:
            source = query.get("source_branch", [""])[0]
            state = query.get("state", ["all"])[0]
            return 200, [
                m for m in mine if m["source_branch"] == source and state in ("all", m["state"])
            ]
        if method == "POST" and len(parts) == 5:
            if any(m["source_branch"] == body["source_branch"] for m in mine):
                return 409, {
                    "message": [
                        "Another open merge request already exists for this source branch: !1"
                    ]
                }
            iid = len(mine) + 1
            merge_request = {
                "project": project,
                "iid": iid,
                "id": 1000 + iid,
                "state": "opened",
                "title": body["title"],
                "description": body.get("description", ""),
                "source_branch": body["source_branch"],
                "target_branch": body["target_branch"],
                "web_url": f"https://gitlab.example/{project}/-/merge_requests/{iid}",
            }
            self.merge_requests.append(merge_request)
            if self.lose_next_create:
                self.lose_next_create -= 1
                return 502, {"message": "502 Bad Gateway"}
            return 201, merge_request
        if method == "PUT" and len(parts) == 6:
            merge_request = next(m for m in mine if m["iid"] == int(parts[5]))
            merge_request.update({k: v for k, v in body.items() if k in {"title", "description"}})
            return 200, merge_request
        return 404, {"message": "404 Not Found"}


@pytest.fixture
def gitlab() -> Iterator[FakeGitLab]:
    fake = FakeGitLab()
    fake.thread.start()
    yield fake
    fake.httpd.shutdown()
    fake.httpd.server_close()


def _repository(external_id: str = "group/sub/calc") -> Repository:
    return Repository(
        name="calc",
        provider="gitlab",
        external_id=external_id,
        clone_url="https://gitlab.example/group/sub/calc.git",
        default_branch="main",
    )


def _ensure(provider: GitLabProvider, body: str = "first") -> Any:
    return provider.pull_request_ensure(
        repository=_repository(),
        branch="agent/abc",
        base_branch="main",
        title="agent: fix add",
        body=body,
        head_sha="f" * 40,
    )


def _provider(gitlab: FakeGitLab) -> GitLabProvider:
    return GitLabProvider(api_url=gitlab.url, token=TOKEN, backoff_seconds=0.01)


@pytest.mark.no_services
def test_a_draft_merge_request_is_opened_then_updated_never_duplicated(gitlab):
    provider = _provider(gitlab)

    first = _ensure(provider)
    again = _ensure(provider, body="after review")

    assert (first.created, first.number) == (True, 1)
    assert first.url == "https://gitlab.example/group/sub/calc/-/merge_requests/1"
    assert (again.created, again.number) == (False, 1)
    assert len(gitlab.merge_requests) == 1
    assert gitlab.merge_requests[0]["title"] == "Draft: agent: fix add"
    assert gitlab.merge_requests[0]["description"] == "after review"
    assert [(m, p) for m, p, _ in gitlab.calls] == [
        ("GET", "/api/v4/projects/group/sub/calc/merge_requests"),
        ("POST", "/api/v4/projects/group/sub/calc/merge_requests"),
        ("GET", "/api/v4/projects/group/sub/calc/merge_requests"),
        ("PUT", "/api/v4/projects/group/sub/calc/merge_requests/1"),
    ]
    assert set(gitlab.tokens) == {TOKEN}


@pytest.mark.no_services
def test_a_lost_answer_is_reconciled_not_duplicated(gitlab):
    gitlab.lose_next_create = 1

    info = _ensure(_provider(gitlab))

    # GitLab created it but the answer was a 502; the retried create got 409 and the
    # existing merge request was looked up and updated instead.
    assert (info.created, info.number) == (False, 1)
    assert len(gitlab.merge_requests) == 1
    assert [m for m, _, _ in gitlab.calls] == ["GET", "POST", "POST", "GET", "PUT"]


@pytest.mark.no_services
def test_unusable_project_paths_fail_clearly():
    assert gitlab_project_path(_repository("")) == "group/sub/calc"
    with pytest.raises(GitProviderError) as raised:
        gitlab_project_path(
            Repository(name="x", provider="gitlab", external_id="", clone_url="calc")
        )
    assert raised.value.retryable is False
    assert isinstance(git_provider_for("gitlab"), GitLabProvider)


@pytest.mark.django_db(transaction=True)
def test_a_gitlab_task_ends_in_a_merge_request(gitlab, workspace, sample_repo, settings):
    from runs import demo
    from runs.engine import run_drive_inline
    from runs.models import PullRequest
    from runs.services import task_submit
    from tests.factories import RepositoryFactory

    settings.GITLAB_API_URL = gitlab.url
    settings.GITLAB_TOKEN = TOKEN
    repository = RepositoryFactory(
        workspace=workspace, provider="gitlab", external_id="group/calc", clone_url=str(sample_repo)
    )
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )

    run = run_drive_inline(run_id=submission.run.id)

    assert run.status == "completed", (run.failure_reason, run.failure_detail)
    pull = PullRequest.objects.get(task=submission.task)
    assert (pull.provider, pull.number) == ("gitlab", 1)
    assert pull.url.endswith("/group/calc/-/merge_requests/1")
    assert gitlab.merge_requests[0]["source_branch"] == run.branch
    pushed = subprocess.run(
        ["git", "--git-dir", str(sample_repo), "rev-parse", f"refs/heads/{run.branch}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert pushed == pull.head_sha
    assert run.events.filter(type="agent.pr.created", data__provider="gitlab").exists()


@pytest.mark.django_db(transaction=True)
def test_a_labelled_gitlab_issue_leads_to_a_merge_request(
    gitlab, client, workspace, sample_repo, settings
):
    from runs import demo
    from runs.engine import run_drive_inline
    from runs.models import PullRequest, Task
    from tests.factories import RepositoryFactory
    from tests.webhooks.test_webhook_support import REPOSITORY_SECRET, corpus, gitlab_post
    from webhooks.models import WebhookReceipt
    from webhooks.processing import webhook_receipt_process

    settings.GITLAB_API_URL = gitlab.url
    settings.GITLAB_TOKEN = TOKEN
    settings.WEBHOOK_TASK_MODEL_OPTIONS = {"provider": "scripted", "script": demo.fix_script()}
    RepositoryFactory(
        workspace=workspace,
        provider="gitlab",
        external_id="gitlabhq/gitlab-test",
        clone_url=str(sample_repo),
        webhook_secret=REPOSITORY_SECRET,
    )
    issue = corpus("gitlab", "issue")
    issue["changes"]["labels"] = {"previous": [], "current": [{"title": "agent"}]}

    assert gitlab_post(client, issue, token=REPOSITORY_SECRET).status_code == 202
    for receipt in WebhookReceipt.objects.all():
        webhook_receipt_process(receipt_id=receipt.id)
    task = Task.objects.get(source="webhook")
    run = run_drive_inline(run_id=task.runs.get().id)

    assert run.status == "completed", (run.failure_reason, run.failure_detail)
    pull = PullRequest.objects.get(task=task)
    assert (pull.provider, pull.number) == ("gitlab", 1)
    (merge_request,) = gitlab.merge_requests
    assert merge_request["project"] == "gitlabhq/gitlab-test"
    assert merge_request["source_branch"] == run.branch
