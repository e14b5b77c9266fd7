"""A private repository clones with the provider's credential given to the platform's
git process only: never in the working copy, its .git/config, the platform repository's
config, or the sandbox's environment."""

from __future__ import annotations

import base64
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

from runs import demo
from runs.agent.workspace import workspace_clone
from runs.models import Run
from runs.services import task_submit
from tests.factories import RepositoryFactory

pytestmark = pytest.mark.django_db

TOKEN = "ghp_" + "PrivateCloneToken" * 3
BACKEND = "/usr/lib/git-core/git-http-backend"


class GitSmartHttp(BaseHTTPRequestHandler):
    """git's smart HTTP protocol (git http-backend as CGI) behind a token check."""

    root: Path
    seen: list[str]

    def _serve(self) -> None:
        expected = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
        self.seen.append(self.headers.get("Authorization", ""))
        if self.headers.get("Authorization") != expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.end_headers()
            return
        url = urlparse(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        env = {
            "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": url.path,
            "QUERY_STRING": url.query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
        }
        out = subprocess.run([BACKEND], input=body, env=env, capture_output=True).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.decode().split("\r\n"):
            name, _, value = line.partition(": ")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _serve

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def private_server(tmp_path) -> Iterator[tuple[str, list[str]]]:
    root = tmp_path / "git-root"
    bare = demo.sample_repository_create(root / "private")
    handler = type("Handler", (GitSmartHttp,), {"root": root, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    relative = bare.relative_to(root)
    yield f"http://127.0.0.1:{server.server_address[1]}/{relative}", handler.seen
    server.shutdown()


def test_a_private_repository_clones_with_a_credential_kept_out_of_every_file(
    workspace, settings, private_server
):
    url, seen = private_server
    settings.GITHUB_TOKEN = TOKEN
    # The token goes only to GitHub's configured git host: here, the test's server.
    parsed = urlparse(url)
    settings.GITHUB_GIT_HOSTS = [f"{parsed.scheme}://{parsed.netloc}"]
    repository = RepositoryFactory(
        workspace=workspace, provider="github", external_id="octo/private", clone_url=url
    )
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    run = Run.objects.get(pk=submission.run.id)

    sandbox, sha = workspace_clone(run=run, ref="origin/main", attempt=1)

    assert len(sha) == 40 and (sandbox.path / "calc" / "core.py").is_file()
    assert any(value.startswith("Basic ") for value in seen)  # the server demanded it
    stored = [
        p
        for directory in (sandbox.path, sandbox.git_dir)
        for p in Path(directory).rglob("*")
        if p.is_file() and TOKEN.encode() in p.read_bytes()
    ]
    encoded = base64.b64encode(f"x-access-token:{TOKEN}".encode())
    assert not stored
    assert not [p for p in Path(sandbox.git_dir).rglob("config") if encoded in p.read_bytes()]
    assert not any(TOKEN in value for value in sandbox.environment().values())


def test_without_the_credential_the_clone_is_refused(workspace, settings, private_server):
    url, _ = private_server
    settings.GITHUB_TOKEN = ""
    repository = RepositoryFactory(
        workspace=workspace, provider="github", external_id="octo/private", clone_url=url
    )
    submission = task_submit(
        workspace=workspace,
        repository=repository,
        instruction="Fix add()",
        model_options={"provider": "scripted", "script": demo.fix_script()},
    )
    with pytest.raises(Exception, match="clone failed"):
        workspace_clone(run=Run.objects.get(pk=submission.run.id), ref="origin/main", attempt=1)
