"""The github provider against a local server speaking the GitHub REST endpoints it uses."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from runs import demo
from runs.agent import platform_git
from runs.agent.sandbox import LocalSandbox
from runs.gitproviders.base import GitProviderError
from runs.gitproviders.github import GitHubProvider
from runs.models import Repository

pytestmark = pytest.mark.no_services

TOKEN = "ghp_" + "t" * 36


class FakeGitHub:
    """Just enough of api.github.com: list, create and update pull requests."""

    def __init__(self) -> None:
        self.pulls: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.auth: list[str] = []
        # Hooks for tests: answers to force before the normal behaviour.
        self.fail_next: list[int] = []
        self.hide_from_next_list = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: Any) -> None:
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                url = urlparse(self.path)
                fake.calls.append((method, url.path, body))
                fake.auth.append(self.headers.get("authorization", ""))
                if fake.fail_next:
                    self._send(fake.fail_next.pop(0), {"message": "try again"})
                    return
                status, answer = fake.route(method, url.path, parse_qs(url.query), body)
                self._send(status, answer)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def add_pull(
        self, owner: str, name: str, head: str, base: str = "main", title: str = "t"
    ) -> dict[str, Any]:
        number = len(self.pulls) + 1
        pull = {
            "number": number,
            "state": "open",
            "draft": True,
            "title": title,
            "head": {"ref": head, "label": f"{owner}:{head}"},
            "base": {"ref": base},
            "html_url": f"https://github.com/{owner}/{name}/pull/{number}",
            "body": "",
        }
        self.pulls.append(pull)
        return pull

    def route(
        self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any]
    ) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if parts[:1] != ["repos"] or len(parts) < 4 or parts[3] != "pulls":
            return 404, {"message": "Not Found"}
        owner, name = parts[1], parts[2]
        if method == "GET" and len(parts) == 4:
            head = query.get("head", [""])[0]
            state = query.get("state", ["open"])[0]
            if self.hide_from_next_list:
                self.hide_from_next_list -= 1
                return 200, []
            return 200, [
                p for p in self.pulls if p["head"]["label"] == head and state in ("all", p["state"])
            ]
        if method == "POST" and len(parts) == 4:
            if any(p["head"]["ref"] == body["head"] and p["state"] == "open" for p in self.pulls):
                return 422, {
                    "message": "Validation Failed",
                    "errors": [
                        {
                            "resource": "PullRequest",
                            "code": "custom",
                            "message": f"A pull request already exists for {owner}:{body['head']}.",
                        }
                    ],
                }
            pull = self.add_pull(owner, name, body["head"], body["base"], body["title"])
            pull.update(draft=body.get("draft", False), body=body.get("body", ""))
            return 201, pull
        if method == "PATCH" and len(parts) == 5:
            pull = next(p for p in self.pulls if p["number"] == int(parts[4]))
            pull.update({k: v for k, v in body.items() if k in {"title", "body", "state"}})
            return 200, pull
        return 404, {"message": "Not Found"}


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    fake = FakeGitHub()
    fake.thread.start()
    yield fake
    fake.httpd.shutdown()
    fake.httpd.server_close()


def _repository(clone_url: str = "https://github.com/octo/calc.git") -> Repository:
    return Repository(
        name="calc",
        provider="github",
        external_id="octo/calc",
        clone_url=clone_url,
        default_branch="main",
    )


def _provider(github: FakeGitHub) -> GitHubProvider:
    return GitHubProvider(api_url=github.url, token=TOKEN, backoff_seconds=0.01)


def _ensure(provider: GitHubProvider, body: str = "first") -> Any:
    return provider.pull_request_ensure(
        repository=_repository(),
        branch="agent/abc",
        base_branch="main",
        title="agent: fix add",
        body=body,
        head_sha="f" * 40,
    )


def test_a_draft_pull_request_is_opened_when_none_exists(github):
    info = _ensure(_provider(github))

    assert info.created is True
    assert info.number == 1
    assert info.url == "https://github.com/octo/calc/pull/1"
    methods = [(m, p) for m, p, _ in github.calls]
    assert methods == [("GET", "/repos/octo/calc/pulls"), ("POST", "/repos/octo/calc/pulls")]
    posted = github.calls[1][2]
    assert posted == {
        "title": "agent: fix add",
        "head": "agent/abc",
        "base": "main",
        "body": "first",
        "draft": True,
    }
    assert set(github.auth) == {f"Bearer {TOKEN}"}


def test_a_follow_up_updates_the_existing_pull_request(github):
    provider = _provider(github)
    _ensure(provider)

    info = _ensure(provider, body="after review")

    assert info.created is False
    assert info.number == 1
    assert len(github.pulls) == 1
    assert github.pulls[0]["body"] == "after review"
    assert [m for m, _, _ in github.calls].count("POST") == 1
    assert github.calls[-1][:2] == ("PATCH", "/repos/octo/calc/pulls/1")


def test_pull_request_already_exists_is_reconciled_not_duplicated(github):
    # The PR exists remotely (an earlier attempt created it and crashed before
    # recording it) but the first lookup misses it, so the create is refused with 422.
    github.add_pull("octo", "calc", "agent/abc")
    github.hide_from_next_list = 1

    info = _ensure(_provider(github))

    assert info.created is False
    assert info.number == 1
    assert len(github.pulls) == 1
    assert [m for m, _, _ in github.calls] == ["GET", "POST", "GET", "PATCH"]


def test_server_errors_are_retried(github):
    github.fail_next = [502, 503]

    info = _ensure(_provider(github))

    assert info.created is True
    assert len(github.pulls) == 1


def test_refusals_are_not_retried(github):
    github.fail_next = [401]

    with pytest.raises(GitProviderError) as raised:
        _ensure(_provider(github))

    assert raised.value.retryable is False
    assert TOKEN not in str(raised.value)
    assert len(github.calls) == 1


def test_branch_push_keeps_the_token_out_of_the_sandbox(tmp_path, settings):
    settings.SANDBOX_ROOT = tmp_path / "sandboxes"
    origin = demo.sample_repository_create(tmp_path / "origin")
    git_dir = platform_git.repository_fetch(url=str(origin), dest=tmp_path / "platform.git")
    base = platform_git.commit_resolve(git_dir, "origin/main")
    sandbox = LocalSandbox("run-push")
    sandbox.create()
    platform_git.worktree_create(git_dir=git_dir, workdir=sandbox.path, commit=base)
    (sandbox.path / "calc" / "core.py").write_text("def add(a, b):\n    return a + b\n")
    # An agent could plant a hook or rewrite URLs in its working copy's git config.
    hook_marker = tmp_path / "hook-ran"
    hook = sandbox.path / ".git" / "hooks" / "pre-push"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text(f"#!/bin/sh\nenv > {hook_marker}\n")
    hook.chmod(0o755)
    with (sandbox.path / ".git" / "config").open("a") as config:
        config.write(f'[url "file:///nonexistent/"]\n\tinsteadOf = {origin}\n')
    _, diff = platform_git.tree_build(git_dir=git_dir, workdir=sandbox.path, base=base)
    commit, pushed = platform_git.patch_commit(
        git_dir=git_dir, base=base, diff=diff.text, message="fix"
    )
    repository = SimpleNamespace(clone_url=str(origin), name="origin")

    GitHubProvider(token=TOKEN).branch_push(
        repository=repository,  # type: ignore[arg-type]
        git_dir=git_dir,
        commit=commit,
        branch="agent/abc",
    )

    head = subprocess.run(
        ["git", "rev-parse", "refs/heads/agent/abc"],
        cwd=origin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert head == commit and pushed.sha256 == diff.sha256
    assert not hook_marker.exists()
    stored = "".join(
        p.read_text(errors="replace")
        for directory in (sandbox.path / ".git", git_dir)
        for p in directory.glob("*")
        if p.is_file()
    )
    assert TOKEN not in stored
    assert not any(TOKEN in value for value in sandbox.environment().values())


def test_a_closed_pull_request_is_reopened_not_duplicated(github):
    provider = _provider(github)
    _ensure(provider)
    github.pulls[0]["state"] = "closed"  # a reviewer closed it

    info = _ensure(provider, body="follow-up")

    assert (info.number, info.created) == (1, False)
    assert len(github.pulls) == 1
    assert github.pulls[0]["state"] == "open"
    assert [m for m, _, _ in github.calls].count("POST") == 1


def test_a_follow_up_on_a_merged_pull_request_is_refused(github):
    provider = _provider(github)
    _ensure(provider)
    github.pulls[0].update(state="closed", merged_at="2026-01-01T00:00:00Z")

    with pytest.raises(GitProviderError, match="already merged") as refused:
        _ensure(provider, body="follow-up")

    assert refused.value.retryable is False
    assert len(github.pulls) == 1
    assert [m for m, _, _ in github.calls].count("POST") == 1
