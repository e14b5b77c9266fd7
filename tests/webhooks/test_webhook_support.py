"""Helpers shared by the webhook tests: corpus payloads, signing, posting deliveries."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from pathlib import Path
from typing import Any

CORPUS = Path("/work/shared/corpus")
GITHUB_SECRET = "test-github-webhook-secret"
# A repository's own secret: the proof that routes a delivery to it (the installation
# secret above only gets a delivery recorded).
REPOSITORY_SECRET = "test-repository-webhook-secret"
GITLAB_TOKEN = "test-gitlab-webhook-token"
GITLAB_EVENTS = {
    "issue": "Issue Hook",
    "merge_request": "Merge Request Hook",
    "note": "Note Hook",
    "pipeline": "Pipeline Hook",
    "push": "Push Hook",
}


def corpus(provider: str, name: str) -> dict[str, Any]:
    """A corpus payload, e.g. ``corpus("github", "issues/labeled")``."""
    suffix = ".payload.json" if provider == "github" else ".json"
    return json.loads((CORPUS / provider / f"{name}{suffix}").read_text())


def sign(body: bytes, secret: str = GITHUB_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_headers(
    body: bytes,
    event: str,
    *,
    delivery: str | None = None,
    hook: str = "1",
    secret: str | None = GITHUB_SECRET,
) -> dict[str, str]:
    headers = {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-GitHub-Hook-ID": hook,
        "User-Agent": "GitHub-Hookshot/test",
    }
    if secret is not None:
        headers["X-Hub-Signature-256"] = sign(body, secret)
    return headers


def github_post(
    client: Any,
    payload: dict[str, Any] | bytes,
    event: str,
    *,
    path: str = "/webhooks/github/",
    **kwargs: Any,
) -> Any:
    """POST a GitHub delivery (compact JSON, signed exactly as sent) with the test client."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return client.post(
        path,
        data=body,
        content_type="application/json",
        headers=github_headers(body, event, **kwargs),
    )


def gitlab_post(
    client: Any,
    payload: dict[str, Any],
    *,
    token: str | None = GITLAB_TOKEN,
    key: str | None = None,
    path: str = "/webhooks/gitlab/",
) -> Any:
    body = json.dumps(payload).encode()
    headers = {
        "X-Gitlab-Event": GITLAB_EVENTS.get(payload.get("object_kind", ""), "System Hook"),
        "X-Gitlab-Event-UUID": str(uuid.uuid4()),
        "X-Gitlab-Webhook-UUID": "hook-1",
        "Idempotency-Key": key or str(uuid.uuid4()),
    }
    if token is not None:
        headers["X-Gitlab-Token"] = token
    return client.post(path, data=body, content_type="application/json", headers=headers)


def followup_script(python: str = "python3") -> dict[str, Any]:
    """A scripted agent that leaves a change on every run, follow-ups included: it fixes
    add() (a no-op failure once fixed) and writes a fresh notes file."""
    note = "import pathlib, uuid\npathlib.Path('NOTES.txt').write_text(str(uuid.uuid4()))"
    return {
        "plan": "Fix add(), note the change, run the tests.",
        "turns": [
            {
                "content": "Fixing add().",
                "tool_calls": [
                    {
                        "name": "replace_text",
                        "arguments": {
                            "path": "calc/core.py",
                            "old": "return a - b",
                            "new": "return a + b",
                        },
                    }
                ],
            },
            {
                "content": "Noting.",
                "tool_calls": [
                    {"name": "run_command", "arguments": {"command": f'{python} -c "{note}"'}}
                ],
            },
            {
                "content": "Testing.",
                "tool_calls": [
                    {
                        "name": "run_command",
                        "arguments": {"command": f"{python} -m unittest discover -s tests -q"},
                    }
                ],
            },
            {
                "content": "Done.",
                "tool_calls": [{"name": "finish", "arguments": {"summary": "Done."}}],
            },
        ],
    }
