"""Prometheus metrics of webhook intake and processing (default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

import jobs.metrics  # noqa: F401 - the shared multiprocess store comes first

# Refused before anything is stored: the counter is the only trace besides a log line.
signature_failures = Counter(
    "agent_webhook_signature_failures",
    "Webhook deliveries refused for a missing, malformed or wrong signature or token.",
    ["provider", "reason"],
)
deliveries = Counter(
    "agent_webhook_deliveries",
    "Webhook deliveries by intake result (accepted, duplicate, too_large, malformed...).",
    ["provider", "result"],
)
processed = Counter(
    "agent_webhook_processed",
    "Processed webhook receipts by final status (processed, ignored, failed).",
    ["provider", "status"],
)
intake_seconds = Histogram(
    "agent_webhook_intake_seconds",
    "Time from request to response for accepted deliveries.",
    ["provider"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
processing_seconds = Histogram(
    "agent_webhook_processing_seconds",
    "Time to process one receipt.",
    ["provider"],
)
