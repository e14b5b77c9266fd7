"""Load through the public surfaces only: the REST API and signed GitHub webhooks.

Each scenario gets a workspace of its own (a member with an API token, a local
repository for API tasks, a GitHub-mapped repository for webhook tasks), so its
invariants are checked over exactly the work it caused. Every submission carries a
marker in its instruction and every delivery a unique issue number, which is how the
checks find (or miss) what each accepted request should have produced.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import io
import json
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.chaos.modelserver import PROFILE
from tests.chaos.stack import WEBHOOK_SECRET, Stack

CORPUS = Path("/work/shared/corpus")


@dataclass
class Scope:
    slug: str
    workspace_id: int
    token: str
    repository_id: int
    github_repository: str  # owner/name the webhooks name


@dataclass
class Submission:
    marker: str
    status: int | None = None  # None: no answer (connection refused, timeout)
    body: dict[str, Any] = field(default_factory=dict)
    answered: float = 0.0  # time.monotonic() when the answer (or the error) came
    latency: float = 0.0

    @property
    def accepted(self) -> bool:
        return self.status == 202


@dataclass
class Delivery:
    delivery_id: str
    issue_number: int
    statuses: list[int | None] = field(default_factory=list)

    @property
    def accepted(self) -> bool:
        return any(status is not None and 200 <= status < 300 for status in self.statuses)


def scope_create(stack: Stack, slug: str, *, max_active_runs: int = 1000) -> Scope:
    """A workspace with a member, an API token and two repositories (in the database)."""
    from django.core.management import call_command

    from runs import demo
    from runs.models import Repository, Workspace

    workspace = Workspace.objects.create(slug=slug, name=slug, max_active_runs=max_active_runs)
    out = io.StringIO()
    call_command("issue_token", user=f"{slug}-member", workspace=slug, stdout=out)
    token = out.getvalue().strip().splitlines()[-1]
    origin = stack.root / "repos" / slug
    local = Repository.objects.create(
        workspace=workspace,
        name="calc",
        clone_url=str(demo.sample_repository_create(origin / "local")),
        test_command=demo.test_command(),
        allowed_commands=demo.allowed_commands(),
        max_active_runs=max_active_runs,
    )
    github_name = f"chaos/{slug}"
    # Deliveries come to the shared URL, signed with the repository's own secret: the
    # proof that routes them to it.
    Repository.objects.create(
        workspace=workspace,
        name="calc-github",
        provider=Repository.Provider.GITHUB,
        external_id=github_name,
        webhook_secret=WEBHOOK_SECRET,
        clone_url=str(demo.sample_repository_create(origin / "github")),
        test_command=demo.test_command(),
        allowed_commands=demo.allowed_commands(),
        max_active_runs=max_active_runs,
    )
    return Scope(
        slug=slug,
        workspace_id=workspace.pk,
        token=token,
        repository_id=local.pk,
        github_repository=github_name,
    )


class Load:
    """Thread-safe senders; every request and its answer is recorded."""

    def __init__(self, stack: Stack, scope: Scope) -> None:
        self.stack = stack
        self.scope = scope
        self.lock = threading.Lock()
        self.submissions: list[Submission] = []
        self.deliveries: list[Delivery] = []
        self.issue_seq = 0
        self.task_seq = 0
        self.template = json.loads((CORPUS / "github/issues/labeled.payload.json").read_text())
        self.local = threading.local()

    def _client(self) -> httpx.Client:
        client = getattr(self.local, "client", None)
        if client is None:
            client = httpx.Client(base_url=self.stack.url, timeout=30)
            self.local.client = client
        return client

    def _next(self, kind: str) -> int:
        with self.lock:
            if kind == "task":
                self.task_seq += 1
                return self.task_seq
            self.issue_seq += 1
            return self.issue_seq

    # --- API -----------------------------------------------------------------------------

    def submit(self, **extra: Any) -> Submission:
        marker = f"[{self.scope.slug}#{self._next('task')}]"
        record = Submission(marker=marker)
        with self.lock:
            self.submissions.append(record)
        body = {
            "repository": self.scope.repository_id,
            "instruction": f"{marker} Fix add() in calc/core.py so the tests pass.",
            # The scripted agent, asked over HTTP (see modelserver).
            "model_options": {"profile": PROFILE},
            **extra,
        }
        sent = time.monotonic()
        try:
            response = self._client().post(
                "/api/tasks/",
                json=body,
                headers={"Authorization": f"Bearer {self.scope.token}"},
            )
        except httpx.HTTPError:
            return record
        finally:
            record.answered = time.monotonic()
            record.latency = record.answered - sent
        record.status = response.status_code
        try:
            record.body = response.json()
        except ValueError:
            record.body = {"raw": response.text[:200]}
        return record

    def submit_many(self, count: int, *, concurrency: int = 4, **kwargs: Any) -> None:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda _: self.submit(**kwargs), range(count)))

    # --- webhooks ------------------------------------------------------------------------

    def delivery_body(self, number: int) -> bytes:
        payload = copy.deepcopy(self.template)
        owner, name = self.scope.github_repository.split("/")
        payload["repository"]["full_name"] = self.scope.github_repository
        payload["repository"]["name"] = name
        payload["repository"]["owner"]["login"] = owner
        payload["label"]["name"] = "agent"
        payload["issue"]["number"] = number
        payload["issue"]["title"] = f"[{self.scope.slug} issue {number}] add() subtracts"
        payload["issue"]["body"] = "Fix add() in calc/core.py so the tests pass."
        return json.dumps(payload, separators=(",", ":")).encode()

    def deliver(self, *, copies: int = 1, secret: str = WEBHOOK_SECRET) -> Delivery:
        """One GitHub delivery (a new issue labelled ``agent``), sent ``copies`` times at
        once with the same delivery id, as a redelivery storm would."""
        number = self._next("issue")
        record = Delivery(delivery_id=str(uuid.uuid4()), issue_number=number)
        with self.lock:
            self.deliveries.append(record)
        body = self.delivery_body(number)
        headers = github_headers(body, "issues", record.delivery_id, secret)
        if copies == 1:
            record.statuses.append(self.post_webhook(body, headers))
            return record
        barrier = threading.Barrier(copies)

        def send() -> int | None:
            barrier.wait(timeout=30)
            return self.post_webhook(body, headers)

        with ThreadPoolExecutor(copies) as pool:
            record.statuses.extend(pool.map(lambda _: send(), range(copies)))
        return record

    def post_webhook(self, body: bytes, headers: dict[str, str]) -> int | None:
        try:
            return (
                self._client().post("/webhooks/github/", content=body, headers=headers).status_code
            )
        except httpx.HTTPError:
            return None

    def deliver_many(self, count: int, *, concurrency: int = 4, copies: int = 1) -> None:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda _: self.deliver(copies=copies), range(count)))

    def corpus_noise(self) -> Iterable[int | None]:
        """Every other GitHub corpus event once, signed: recorded and ignored or handled."""
        for path in sorted((CORPUS / "github").glob("*/*.payload.json")):
            if path.parent.name == "issues":
                continue
            payload = json.loads(path.read_text())
            if isinstance(payload.get("repository"), dict):
                payload["repository"]["full_name"] = self.scope.github_repository
            body = json.dumps(payload, separators=(",", ":")).encode()
            headers = github_headers(body, path.parent.name, str(uuid.uuid4()), WEBHOOK_SECRET)
            yield self.post_webhook(body, headers)


def github_headers(body: bytes, event: str, delivery: str, secret: str) -> dict[str, str]:
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Hook-ID": "4242",
        "X-Hub-Signature-256": f"sha256={signature}",
        "User-Agent": "GitHub-Hookshot/chaos",
    }
