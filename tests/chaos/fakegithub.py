"""A local server speaking the GitHub REST endpoints the platform calls.

It keeps every pull request and comment it is asked to create, so the harness can count
side effects where they land: two pull requests for one branch or two completion
comments for one issue are visible here whatever the database says.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.chaos.httpserver import HarnessHTTPServer


class FakeGitHub:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pulls: list[dict[str, Any]] = []
        self.comments: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.next_id = 1000
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {}
                url = urlparse(self.path)
                with fake.lock:
                    status, answer = fake.route(method, url.path, parse_qs(url.query), body)
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def do_PATCH(self) -> None:
                self._answer("PATCH")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = HarnessHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def route(
        self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any]
    ) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if parts[:1] != ["repos"] or len(parts) < 4:
            return 404, {"message": "Not Found"}
        owner, name, kind = parts[1], parts[2], parts[3]
        slug = f"{owner}/{name}"
        if kind == "pulls":
            return self._pulls(method, slug, parts[4:], query, body)
        if kind == "issues" and len(parts) == 6 and parts[5] == "comments":
            return self._comments(method, slug, int(parts[4]), query, body)
        return 404, {"message": "Not Found"}

    def _pulls(
        self,
        method: str,
        slug: str,
        rest: list[str],
        query: dict[str, list[str]],
        body: dict[str, Any],
    ) -> tuple[int, Any]:
        owner = slug.split("/")[0]
        if method == "GET" and not rest:
            head = query.get("head", [""])[0]
            state = query.get("state", ["open"])[0]
            return 200, [
                p
                for p in self.pulls
                if p["repo"] == slug
                and p["head"]["label"] == head
                and (state == "all" or p["state"] == state)
            ]
        if method == "POST" and not rest:
            if any(
                p["repo"] == slug and p["head"]["ref"] == body.get("head") and p["state"] == "open"
                for p in self.pulls
            ):
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
            number = 1 + sum(1 for p in self.pulls if p["repo"] == slug)
            pull = {
                "id": self._id(),
                "repo": slug,
                "number": number,
                "state": "open",
                "draft": bool(body.get("draft")),
                "title": body.get("title", ""),
                "body": body.get("body", ""),
                "head": {"ref": body.get("head"), "label": f"{owner}:{body.get('head')}"},
                "base": {"ref": body.get("base")},
                "html_url": f"https://github.com/{slug}/pull/{number}",
            }
            self.pulls.append(pull)
            return 201, pull
        if method == "PATCH" and len(rest) == 1:
            pull = next(
                (p for p in self.pulls if p["repo"] == slug and p["number"] == int(rest[0])), None
            )
            if pull is None:
                return 404, {"message": "Not Found"}
            pull.update({k: v for k, v in body.items() if k in {"title", "body", "state"}})
            return 200, pull
        return 404, {"message": "Not Found"}

    def _comments(
        self,
        method: str,
        slug: str,
        number: int,
        query: dict[str, list[str]],
        body: dict[str, Any],
    ) -> tuple[int, Any]:
        comments = self.comments.setdefault((slug, number), [])
        if method == "GET":
            page = int(query.get("page", ["1"])[0])
            per_page = int(query.get("per_page", ["30"])[0])
            return 200, comments[(page - 1) * per_page : page * per_page]
        if method == "POST":
            comment_id = self._id()
            comment = {
                "id": comment_id,
                "body": body.get("body", ""),
                "html_url": f"https://github.com/{slug}/issues/{number}#issuecomment-{comment_id}",
            }
            comments.append(comment)
            return 201, comment
        return 404, {"message": "Not Found"}

    def snapshot(self) -> tuple[list[dict[str, Any]], dict[tuple[str, int], list[dict[str, Any]]]]:
        with self.lock:
            return (
                [dict(p) for p in self.pulls],
                {key: list(value) for key, value in self.comments.items()},
            )
