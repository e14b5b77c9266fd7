"""A small closed-loop HTTP/1.1 load generator (asyncio, keep-alive, loopback only).

    python -m bench.http_load --port 8000 --kind insert --conns 32 --seconds 5

    python -m bench.http_load --port 8000 --kind insert,submit --slice 1 --seconds 10 ...

Prints one JSON object: requests, req/s, status counts, p50/p99 latency in ms; with
several kinds, one such object per kind under ``by_kind``. Stops by itself after
``--seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import time
import uuid
from collections import Counter
from pathlib import Path


def request_bytes(kind: str, args: argparse.Namespace) -> bytes:
    host = f"127.0.0.1:{args.port}"
    if kind == "insert":
        body = b'{"hello":"world"}'
        head = f"POST /bench/insert/ HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    elif kind == "webhook":
        body = args.body
        signature = "sha256=" + hmac.new(args.secret.encode(), body, hashlib.sha256).hexdigest()
        head = (
            f"POST /webhooks/github/ HTTP/1.1\r\nHost: {host}\r\n"
            "Content-Type: application/json\r\nX-GitHub-Event: ping\r\n"
            f"X-GitHub-Delivery: {uuid.uuid4()}\r\nX-GitHub-Hook-ID: 1\r\n"
            f"X-Hub-Signature-256: {signature}\r\n"
        )
    elif kind in ("submit", "api-layer"):
        # The same request to the endpoint and to its API layer over one INSERT.
        path = "/api/tasks/" if kind == "submit" else "/bench/api-layer/"
        body = json.dumps(
            {"repository": args.repository, "instruction": "bench: do nothing"}
        ).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {args.token}\r\nIdempotency-Key: {uuid.uuid4()}\r\n"
        )
    elif kind == "get":
        body = b""
        head = f"GET {args.path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {args.token}\r\n"
    else:
        raise SystemExit(f"unknown kind {kind}")
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bool]:
    """One request and its response: the status, and whether the server closes."""
    writer.write(request)
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 60)
    if not status_line:
        raise ConnectionError("closed")
    status = int(status_line.split()[1])
    length = 0
    chunked = False
    close = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value.strip())
        elif name == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
        elif name == "connection" and "close" in value.lower():
            close = True
    if chunked:
        while True:
            size = int((await reader.readline()).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status, close


class Schedule:
    """Which kind's turn it is: slices of ``slice`` seconds, the kinds in turn. Of each
    slice the first ``settle`` seconds are not counted: the requests of the kind before
    finish then, and each connection's next request is of the new kind."""

    def __init__(self, kinds: list[str], seconds: float, slice_seconds: float) -> None:
        self.kinds = kinds
        self.slice = slice_seconds if len(kinds) > 1 else seconds
        self.settle = min(0.25, self.slice / 4) if len(kinds) > 1 else 0.0
        turns = max(1, round(seconds / self.slice / len(kinds))) * len(kinds)
        self.started = time.monotonic()
        self.end = self.started + turns * self.slice
        self.counted = {kind: (self.slice - self.settle) * turns / len(kinds) for kind in kinds}

    def kind_at(self, at: float) -> tuple[str, bool]:
        """The kind whose slice ``at`` is in, and whether ``at`` is counted."""
        turn, offset = divmod(at - self.started, self.slice)
        return self.kinds[int(turn) % len(self.kinds)], offset >= self.settle


async def one_connection(args: argparse.Namespace, schedule: Schedule, outs: dict) -> None:
    """Requests one after the other on one keep-alive connection (opened again when the
    server closes it), each of the kind whose turn it is when it starts, until the end;
    one is counted when it is answered in a counted part of a slice of its kind."""
    reader = writer = None
    while (started := time.monotonic()) < schedule.end:
        kind, _ = schedule.kind_at(started)
        out = outs[kind]
        if writer is None:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", args.port)
            except OSError:
                out["status"]["connect_error"] += 1
                await asyncio.sleep(0.05)
                continue
        try:
            assert reader is not None
            status, close = await _exchange(reader, writer, request_bytes(kind, args))
        except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError):
            out["status"]["io_error"] += 1
            writer.close()
            writer = None
            continue
        answered = time.monotonic()
        if answered <= schedule.end and schedule.kind_at(answered) == (kind, True):
            out["latencies"].append(answered - started)
            out["status"][str(status)] += 1
        elif status >= 400:  # an error counts wherever it falls
            out["status"][str(status)] += 1
        if close:
            writer.close()
            writer = None
    if writer is not None:
        writer.close()


def _summary(out: dict, elapsed: float) -> dict:
    latencies = sorted(out["latencies"])

    def pct(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0
        )

    ok = sum(v for k, v in out["status"].items() if k.isdigit() and int(k) < 400)
    return {
        "requests": len(latencies),
        "ok": ok,
        "rps": ok / elapsed if elapsed else 0.0,
        "status": dict(out["status"]),
        "errors": sum(v for k, v in out["status"].items() if k.isdigit() and int(k) >= 400)
        + out["status"]["io_error"],
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "seconds": elapsed,
    }


async def main_async(args: argparse.Namespace) -> dict:
    """``--kind`` for ``--seconds`` on ``--conns`` connections; with several kinds
    (comma-separated), slices of ``--slice`` seconds of each in turn on the same
    connections, and one summary per kind (``by_kind``).

    A kind's figure counts what is answered in its slices after their first quarter
    second (see ``Schedule``), when every request in flight is its own: kinds taking
    turns every second or so see the machine alike, where back-to-back windows of
    several seconds each met a machine whose speed had moved by a third in between."""
    kinds = args.kind.split(",")
    schedule = Schedule(kinds, args.seconds, args.slice)
    outs: dict[str, dict] = {kind: {"status": Counter(), "latencies": []} for kind in kinds}
    await asyncio.gather(*(one_connection(args, schedule, outs) for _ in range(args.conns)))
    by_kind = {kind: _summary(outs[kind], schedule.counted[kind]) for kind in kinds}
    if len(kinds) == 1:
        return by_kind[kinds[0]]
    return {"by_kind": by_kind}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kind", required=True, help="a kind, or several (comma-separated)")
    parser.add_argument(
        "--slice", type=float, default=1.0, help="seconds of each kind in turn (several kinds)"
    )
    parser.add_argument("--conns", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--secret", default="")
    parser.add_argument("--body-file", default="")
    parser.add_argument("--token", default="")
    parser.add_argument("--repository", type=int, default=0)
    parser.add_argument("--path", default="/")
    args = parser.parse_args()
    args.body = Path(args.body_file).read_bytes() if args.body_file else b"{}"
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
