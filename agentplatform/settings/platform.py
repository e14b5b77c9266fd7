"""The platform's own settings: runs, sandboxes, git, models, the outbox and work items,
retention, and Git provider webhooks."""

from __future__ import annotations

import json as _json
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from agentplatform.settings.environment import VAR_DIR, env_value
from agentplatform.settings.services import EMBEDDED, REDIS_URL

# --- The platform ---------------------------------------------------------------------

# How long a step's lease lasts without a heartbeat; heartbeats renew it every third.
RUN_LEASE_SECONDS = env_value("RUN_LEASE_SECONDS", int, 30)
# How many recoveries in a row at the same point (step, model turns) a run gets before
# it fails: a poison step; recoveries after which the run moved on are not counted.
RUN_MAX_RECOVERIES = env_value("RUN_MAX_RECOVERIES", int, 3)
# Retries of a step that could not reach the database (backoff capped at 30 s): a
# database restart or a moment without free connections must not fail runs.
RUN_STEP_DATABASE_RETRIES = env_value("RUN_STEP_DATABASE_RETRIES", int, 60)
# Submissions to one workspace admitted side by side while far from its limits (see
# runs.services); 0 admits one at a time.
ADMISSION_LANES = env_value("ADMISSION_LANES", int, 8)
# How long a worker goes on with a run's next steps itself (each still its own fenced
# commit) before it leaves them to a wake-up message and takes other work; 0: one step
# per message.
RUN_STEP_SLICE_SECONDS = env_value("RUN_STEP_SLICE_SECONDS", float, 1.0)
# An active run with no lease and no progress for this long lost its wake-up message.
RUN_STALL_SECONDS = env_value("RUN_STALL_SECONDS", int, 60)
SANDBOX_ROOT = Path(env_value("SANDBOX_ROOT", str, str(VAR_DIR / "sandboxes")))
# bubblewrap (contains; the default), process (development only: refused in production
# mode by a system check) or the dotted path of a runs.agent.backends.SandboxBackend.
SANDBOX_BACKEND = env_value("SANDBOX_BACKEND", str, "bubblewrap")
# Directories under which staff may register local (on-disk) repositories; the embedded
# mode's demo repositories live under var/.
LOCAL_REPOSITORY_ROOTS = env_value(
    "LOCAL_REPOSITORY_ROOTS", list, [str(VAR_DIR)] if EMBEDDED else []
)
# When set, clone URLs must name one of these hosts.
REPOSITORY_HOST_ALLOWLIST = env_value("REPOSITORY_HOST_ALLOWLIST", list, [])
# Where the platform's git may connect (runs/git_network.py). Clone URL schemes: https;
# ssh when listed (it offers the worker's ssh keys); http when listed, staff only.
GIT_ALLOWED_SCHEMES = env_value("GIT_ALLOWED_SCHEMES", list, ["https"])
# Hosts (by name) and networks (CIDR) git may reach although they are loopback, private
# or otherwise not public: e.g. an internal GitLab. Metadata services never.
GIT_INTERNAL_HOSTS = env_value("GIT_INTERNAL_HOSTS", list, [])
GIT_INTERNAL_NETWORKS = env_value("GIT_INTERNAL_NETWORKS", list, [])
# Every clone, fetch and push is killed after this long (and when its run is cancelled).
GIT_NETWORK_TIMEOUT_SECONDS = env_value("GIT_NETWORK_TIMEOUT_SECONDS", float, 300.0)
# Calls to each git host's REST API allowed per hour across all workers (runs.ratelimits);
# 0: none of ours (the host's 429s still back off).
GIT_PROVIDER_REQUESTS_PER_HOUR = env_value("GIT_PROVIDER_REQUESTS_PER_HOUR", int, 0)
# The origins (https://host[:port]; a bare host means https) git sends a provider's token
# to; empty: github.com (or the GitHub Enterprise host of GITHUB_API_URL), GitLab's API host.
GITHUB_GIT_HOSTS = env_value("GITHUB_GIT_HOSTS", list, [])
GITLAB_GIT_HOSTS = env_value("GITLAB_GIT_HOSTS", list, [])
# Cached results of repositories' setup commands (mounted read-only into sandboxes).
SETUP_CACHE_ROOT = Path(env_value("SETUP_CACHE_ROOT", str, str(VAR_DIR / "setup-cache")))
SETUP_TIMEOUT_SECONDS = env_value("SETUP_TIMEOUT_SECONDS", int, 900)
# The platform's own git repositories (never mounted into a sandbox).
PLATFORM_GIT_ROOT = Path(env_value("PLATFORM_GIT_ROOT", str, str(VAR_DIR / "platform-git")))
COMMAND_TIMEOUT_SECONDS = env_value("COMMAND_TIMEOUT_SECONDS", int, 300)
COMMAND_OUTPUT_LIMIT_BYTES = env_value("COMMAND_OUTPUT_LIMIT_BYTES", int, 256 * 1024)
APPROVAL_TTL_SECONDS = env_value("APPROVAL_TTL_SECONDS", int, 7 * 24 * 3600)
# A question the agent asked (or a plan under review) unanswered this long ends the run
# timed_out (runs.waiting.inputs_expire).
INPUT_TTL_SECONDS = env_value("INPUT_TTL_SECONDS", int, 7 * 24 * 3600)
# A patch that edits or deletes tests, or removes assertions, waits for a human even in
# autonomous mode (judge finding tests_modified).
TESTS_MODIFIED_REQUIRES_APPROVAL = env_value("TESTS_MODIFIED_REQUIRES_APPROVAL", bool, True)
EVENT_SOURCE = env_value("EVENT_SOURCE", str, "/agentplatform")
EVENT_STREAM_NAME = env_value("EVENT_STREAM_NAME", str, "agent.events.v1")
EVENT_STREAM_MAXLEN = env_value("EVENT_STREAM_MAXLEN", int, 100_000)
# The Redis holding the external event stream (defaults to REDIS_URL).
EVENT_STREAM_REDIS_URL = env_value("EVENT_STREAM_REDIS_URL", str, REDIS_URL)
# Outbox publish retries: exponential from the base, capped, with jitter.
OUTBOX_RETRY_BASE_SECONDS = env_value("OUTBOX_RETRY_BASE_SECONDS", float, 1.0)
OUTBOX_RETRY_MAX_SECONDS = env_value("OUTBOX_RETRY_MAX_SECONDS", float, 300.0)
# Under load, a relay that finds new commits after draining looks again this much later,
# so one task publishes the commits of the window together.
OUTBOX_RELAY_COALESCE_SECONDS = env_value("OUTBOX_RELAY_COALESCE_SECONDS", float, 0.2)
# In-app event consumers (dotted paths to jobs.consumers.Consumer objects).
EVENT_CONSUMERS = env_value(
    "EVENT_CONSUMERS",
    list,
    [
        "runs.cost_aggregation.COST_AGGREGATION",
        "runs.notify.SOURCE_NOTIFICATION",
    ],
)
# Work items (webhook processing, consumer and subscription deliveries, requeues): how
# long a claim lasts before another worker may take the item, how many claims a worker
# may die holding before the item is dead-lettered as poison, how long after a wake-up
# was due the sweep sends another (doubling per unanswered wake-up, capped), and how
# many wake-ups one sweep sends at most.
WORK_LEASE_SECONDS = env_value("WORK_LEASE_SECONDS", float, 300.0)
WORK_POISON_CRASHES = env_value("WORK_POISON_CRASHES", int, 3)
WORK_REWAKE_SECONDS = env_value("WORK_REWAKE_SECONDS", float, 30.0)
WORK_REWAKE_MAX_SECONDS = env_value("WORK_REWAKE_MAX_SECONDS", float, 600.0)
WORK_SWEEP_LIMIT = env_value("WORK_SWEEP_LIMIT", int, 500)
# New items (webhook deliveries) are run by one drain task per queue; a drain runs items
# for at most this long before a fresh task goes on, and up to this many drains of one
# queue run at once while a backlog lasts.
WORK_DRAIN_SECONDS = env_value("WORK_DRAIN_SECONDS", float, 1.0)
WORK_DRAIN_PARALLEL = env_value("WORK_DRAIN_PARALLEL", int, 4)
# Retention (jobs.retention): published outbox rows, consumers' receipts and finished
# work items are deleted after this many days, processed webhook receipts after theirs;
# 0 keeps them for good. A sweep deletes in batches of RETENTION_BATCH rows for at most
# RETENTION_SWEEP_SECONDS.
OUTBOX_RETENTION_DAYS = env_value("OUTBOX_RETENTION_DAYS", float, 14.0)
WEBHOOK_RECEIPT_RETENTION_DAYS = env_value("WEBHOOK_RECEIPT_RETENTION_DAYS", float, 30.0)
RETENTION_BATCH = env_value("RETENTION_BATCH", int, 2000)
RETENTION_SWEEP_SECONDS = env_value("RETENTION_SWEEP_SECONDS", float, 20.0)
EVENT_CONSUMER_MAX_RETRIES = env_value("EVENT_CONSUMER_MAX_RETRIES", int, 5)
EVENT_CONSUMER_RETRY_BASE_SECONDS = env_value("EVENT_CONSUMER_RETRY_BASE_SECONDS", float, 2.0)
# Outgoing HTTP subscriptions: attempts before a delivery is dead-lettered.
SUBSCRIPTION_MAX_ATTEMPTS = env_value("SUBSCRIPTION_MAX_ATTEMPTS", int, 8)
SUBSCRIPTION_RETRY_BASE_SECONDS = env_value("SUBSCRIPTION_RETRY_BASE_SECONDS", float, 5.0)
SUBSCRIPTION_TIMEOUT_SECONDS = env_value("SUBSCRIPTION_TIMEOUT_SECONDS", float, 10.0)
AGENT_MODEL = env_value("AGENT_MODEL", str, "scripted")
TASK_DEFAULT_BUDGET = {
    "agent_attempts": env_value("BUDGET_AGENT_ATTEMPTS", int, 3),
    "model_turns": env_value("BUDGET_MODEL_TURNS", int, 40),
    "tool_retries": env_value("BUDGET_TOOL_RETRIES", int, 10),
    "wall_clock_seconds": env_value("BUDGET_WALL_CLOCK_SECONDS", int, 3600),
    "cost_usd": env_value("BUDGET_COST_USD", float, 5.0),
    # Replies the model got wrong (bad tool call, text only, cut off) before the run ends.
    "model_errors": env_value("BUDGET_MODEL_ERRORS", int, 8),
}

# The agent's model endpoint (any OpenAI-compatible Chat Completions server) and the
# git hosting API. Keys and tokens stay in the platform process: never in a sandbox.
OPENAI_BASE_URL = env_value("OPENAI_BASE_URL", str, "https://api.openai.com/v1")
OPENAI_API_KEY = env_value("OPENAI_API_KEY", str, "")
OPENAI_DEFAULT_MODEL = env_value("OPENAI_DEFAULT_MODEL", str, "gpt-4o-mini")
OPENAI_TIMEOUT_SECONDS = env_value("OPENAI_TIMEOUT_SECONDS", float, 120.0)
OPENAI_MAX_RETRIES = env_value("OPENAI_MAX_RETRIES", int, 4)
OPENAI_RETRY_BACKOFF_SECONDS = env_value("OPENAI_RETRY_BACKOFF_SECONDS", float, 1.0)
# Named model profiles (JSON object of name -> profile), merged over the ones built in.
# A profile: provider (openai: Chat Completions; openai-responses; anthropic; gemini;
# local: an OpenAI-compatible server such as vLLM, Ollama or llama.cpp; scripted),
# model, base_url, api_key_env (the NAME of the variable holding the key),
# context_window, max_output_tokens, prices_per_million {input, output, cached},
# text_tool_calls, and capabilities: reasoning, reasoning_effort, tool_use, sampling,
# streaming, prompt_caching. Unset windows, prices and capabilities come from the model
# catalogue and the provider (runs/agent/profiles.py).
_model_profiles = env_value("MODEL_PROFILES", str, "{}")
try:
    MODEL_PROFILES = {
        # The scripted model costs nothing: it is no paid endpoint.
        "scripted": {
            "provider": "scripted",
            "model": "scripted-1",
            "context_window": 32_768,
            "max_output_tokens": 4_096,
        },
        # Blank model and base URL follow OPENAI_DEFAULT_MODEL and OPENAI_BASE_URL.
        "openai": {"provider": "openai", "api_key_env": "OPENAI_API_KEY"},
        "openai-responses": {
            "provider": "openai-responses",
            "model": "o4-mini",
            "api_key_env": "OPENAI_API_KEY",
        },
        "anthropic": {
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
            "api_key_env": "ANTHROPIC_API_KEY",
        },
        "gemini": {
            "provider": "gemini",
            "model": "gemini-2.5-flash",
            "api_key_env": "GEMINI_API_KEY",
        },
        "local": {
            "provider": "local",
            "model": "qwen2.5-coder",
            "base_url": "http://127.0.0.1:8000/v1",
        },
        **_json.loads(_model_profiles),
    }
except (ValueError, TypeError) as _exc:
    raise ImproperlyConfigured(f"Invalid value for MODEL_PROFILES: {_exc}") from _exc
# A streamed reply reports its progress on the timeline at most this often.
MODEL_STREAM_PROGRESS_SECONDS = env_value("MODEL_STREAM_PROGRESS_SECONDS", float, 5.0)
# max_tokens asked of any model, whatever its catalogue entry allows.
MODEL_MAX_OUTPUT_TOKENS_CAP = env_value("MODEL_MAX_OUTPUT_TOKENS_CAP", int, 8_192)
# Condense older tool outputs once the conversation reaches this share of the window.
CONTEXT_CONDENSE_AT = env_value("CONTEXT_CONDENSE_AT", float, 0.7)
# Ask the model for a second opinion (score and verdict) after the rule checks.
AGENT_MODEL_JUDGE = env_value("AGENT_MODEL_JUDGE", bool, False)
GITHUB_API_URL = env_value("GITHUB_API_URL", str, "https://api.github.com")
GITHUB_TOKEN = env_value("GITHUB_TOKEN", str, "")
GITHUB_TIMEOUT_SECONDS = env_value("GITHUB_TIMEOUT_SECONDS", float, 30.0)
# GitLab's REST API (v4) for merge requests, and a token with the api scope.
GITLAB_API_URL = env_value("GITLAB_API_URL", str, "https://gitlab.com/api/v4")
GITLAB_TOKEN = env_value("GITLAB_TOKEN", str, "")
GITLAB_TIMEOUT_SECONDS = env_value("GITLAB_TIMEOUT_SECONDS", float, 30.0)
# Resource limits of every command run in a sandbox.
SANDBOX_CPU_SECONDS = env_value("SANDBOX_CPU_SECONDS", int, 600)
SANDBOX_MEMORY_BYTES = env_value("SANDBOX_MEMORY_BYTES", int, 4 * 1024**3)
SANDBOX_FILE_SIZE_BYTES = env_value("SANDBOX_FILE_SIZE_BYTES", int, 512 * 1024**2)
SANDBOX_PROCESSES = env_value("SANDBOX_PROCESSES", int, 256)
# The working copy's total size, watched while a command runs and checked after it.
SANDBOX_WORKSPACE_BYTES = env_value("SANDBOX_WORKSPACE_BYTES", int, 2 * 1024**3)
SANDBOX_TMP_BYTES = env_value("SANDBOX_TMP_BYTES", int, 256 * 1024**2)
# Containment of the bubblewrap backend (docs/sandbox-backends.md). CPUs the command
# tree may use at once (0: no quota). The host uid/gid a root worker's commands run as
# (-1: the account agentsandbox if it exists, else 2100000000, a uid no account has).
# The cgroup v2 directory under which each command gets its cgroup (memory, pids, cpu);
# empty: the worker's own cgroup or the nearest ancestor that delegates them.
SANDBOX_CPUS = env_value("SANDBOX_CPUS", float, 1.0)
SANDBOX_HOST_UID = env_value("SANDBOX_HOST_UID", int, -1)
SANDBOX_HOST_GID = env_value("SANDBOX_HOST_GID", int, -1)
SANDBOX_CGROUP_ROOT = env_value("SANDBOX_CGROUP_ROOT", str, "")
# Sandboxed commands running at once on this host, across every worker process and
# thread (runs.agent.slots; 0: one per core), and the directory of their lock files,
# which every worker of the host must share. Runs waiting on their model hold no slot.
SANDBOX_CPU_SLOTS = env_value("SANDBOX_CPU_SLOTS", int, 0)
SANDBOX_CPU_SLOTS_DIR = Path(env_value("SANDBOX_CPU_SLOTS_DIR", str, str(VAR_DIR / "cpu-slots")))

# --- Git provider webhooks ------------------------------------------------------------

# Fallback secrets when a repository has no webhook_secret of its own.
GITHUB_WEBHOOK_SECRET = env_value("GITHUB_WEBHOOK_SECRET", str, "")
GITLAB_WEBHOOK_TOKEN = env_value("GITLAB_WEBHOOK_TOKEN", str, "")
# GitHub and GitLab cap payloads at 25 MB; anything larger is refused with 413.
WEBHOOK_MAX_BYTES = env_value("WEBHOOK_MAX_BYTES", int, 25 * 1024 * 1024)
# An issue given this label becomes a task.
WEBHOOK_AGENT_LABEL = env_value("WEBHOOK_AGENT_LABEL", str, "agent")
# Model options (JSON object) for tasks submitted from webhooks; {} uses AGENT_MODEL.
_webhook_model_options = env_value("WEBHOOK_TASK_MODEL_OPTIONS", str, "{}")
try:
    WEBHOOK_TASK_MODEL_OPTIONS = _json.loads(_webhook_model_options)
    if not isinstance(WEBHOOK_TASK_MODEL_OPTIONS, dict):
        raise ValueError("must be a JSON object")
except ValueError as _exc:
    raise ImproperlyConfigured(f"Invalid value for WEBHOOK_TASK_MODEL_OPTIONS: {_exc}") from _exc
# CI failures on one head commit of an agent PR that may start a follow-up run.
WEBHOOK_CI_FOLLOWUPS_PER_COMMIT = env_value("WEBHOOK_CI_FOLLOWUPS_PER_COMMIT", int, 1)
# GitLab notes carry no access level: only these usernames may give /agent commands.
GITLAB_COMMAND_USERS = env_value("GITLAB_COMMAND_USERS", list, [])
WEBHOOK_PROCESS_MAX_RETRIES = env_value("WEBHOOK_PROCESS_MAX_RETRIES", int, 5)
# The first processing retry waits about this long; each next one twice as long.
WEBHOOK_PROCESS_RETRY_BASE_SECONDS = env_value("WEBHOOK_PROCESS_RETRY_BASE_SECONDS", float, 2.0)

# Workers record a heartbeat this often; one silent for three intervals is not alive.
WORKER_HEARTBEAT_SECONDS = env_value("WORKER_HEARTBEAT_SECONDS", float, 10.0)
# /readyz answers 503 unless every task queue has a live worker (off: web-only probes).
READYZ_REQUIRE_WORKERS = env_value("READYZ_REQUIRE_WORKERS", bool, False)
