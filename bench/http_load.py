"""A small closed-loop HTTP/1.1 load generator (asyncio, keep-alive, loopback only).

    python -m bench.http_load --port 8000 --kind insert --conns 32 --seconds 5

Prints one JSON object: requests, req/s, status counts, p50/p99 latency in ms.
Stops by itself after ``--seconds``.
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


async def one_connection(args: argparse.Namespace, deadline: float, out: dict) -> None:
    reader = writer = None
    while time.monotonic() < deadline:
        if writer is None:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", args.port)
            except OSError:
                out["status"]["connect_error"] += 1
                await asyncio.sleep(0.05)
                continue
        started = time.monotonic()
        try:
            writer.write(request_bytes(args.kind, args))
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
        except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError):
            out["status"]["io_error"] += 1
            writer.close()
            writer = None
            continue
        out["latencies"].append(time.monotonic() - started)
        out["status"][str(status)] += 1
        if close:
            writer.close()
            writer = None
    if writer is not None:
        writer.close()


async def main_async(args: argparse.Namespace) -> dict:
    out: dict = {"status": Counter(), "latencies": []}
    started = time.monotonic()
    deadline = started + args.seconds
    await asyncio.gather(*(one_connection(args, deadline, out) for _ in range(args.conns)))
    elapsed = time.monotonic() - started
    latencies = sorted(out["latencies"])

    def pct(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0
        )

    ok = sum(v for k, v in out["status"].items() if k.isdigit() and int(k) < 400)
    return {
        "requests": len(latencies),
        "ok": ok,
        "rps": ok / elapsed,
        "status": dict(out["status"]),
        "errors": len(latencies) - ok + out["status"]["io_error"],
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kind", required=True)
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
