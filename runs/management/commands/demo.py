"""``make demo``: a real coding task end to end on the embedded default.

Generates a sample repository with a failing test under ``var/``, starts a real Celery
worker and beat as child processes, submits a task, shows its progress live, prints the
timeline and outcome, stops the children (and the embedded PostgreSQL and Valkey unless a
``serve`` holds them) and exits 0 on a completed run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from rich.console import Console
from rich.live import Live
from rich.table import Table

from agentplatform import embedded, supervision
from runs import demo
from runs.management.process_groups import process_groups_stop
from runs.models import PullRequest, Repository, Run, RunEvent, Workspace
from runs.services import task_submit
from runs.state import TERMINAL

PHASES = [
    "queued",
    "preparing",
    "context_loading",
    "planning",
    "running",
    "verifying",
    "judging",
    "awaiting_approval",
    "creating_pr",
    "completed",
]


def start_children(log_dir: Path, *, concurrency: int = 2) -> list[subprocess.Popen[bytes]]:
    """A Celery worker on every queue and a beat, as child processes."""
    log_dir.mkdir(parents=True, exist_ok=True)
    celery = [sys.executable, "-m", "celery", "-A", "agentplatform"]
    commands = {
        "worker": [
            *celery,
            "worker",
            "-Q",
            "agent,verify,events,webhooks",
            "-c",
            str(concurrency),
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "WARNING",
            "-n",
            f"demo-{os.getpid()}@%h",
        ],
        "beat": [*celery, "beat", "--loglevel", "WARNING"],
    }
    children = []
    for name, argv in commands.items():
        log = open(log_dir / f"demo-{name}.log", "wb")  # noqa: SIM115 - owned by the child
        children.append(
            # Its own group, and SIGTERM from the kernel should the demo be killed.
            supervision.spawn(argv, stdout=log, stderr=subprocess.STDOUT)
        )
    return children


def event_summary(event: RunEvent) -> str:
    data: dict[str, Any] = event.data or {}
    if event.type == "agent.run.status.changed":
        return f"{data.get('from')} → {data.get('to')}"
    if event.type.startswith("agent.tool.call."):
        return str(data.get("tool", ""))
    if event.type == "agent.model.turn.completed":
        return (
            f"{data.get('purpose')} turn, {data.get('tokens_in')}+{data.get('tokens_out')}"
            f" tokens, ${data.get('cost_usd')}"
        )
    if event.type == "agent.patch.created":
        return (
            f"{', '.join(data.get('files', []))} "
            f"(+{data.get('lines_added')} -{data.get('lines_removed')})"
        )
    if event.type.startswith("agent.verification."):
        return str(data.get("outcome") or data.get("command", ""))
    if event.type == "agent.judge.completed":
        return str(data.get("verdict"))
    if event.type.startswith("agent.pr."):
        return str(data.get("url") or data.get("branch", ""))
    if event.type == "agent.plan.created":
        return str(data.get("summary", ""))[:70]
    return ""


class Command(BaseCommand):
    help = "Run a sample coding task end to end on the embedded default."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--timeout", type=int, default=150)

    def handle(self, *args: Any, **options: Any) -> None:
        supervision.die_with_make()
        run_dir = Path(settings.VAR_DIR) / "run"
        supervision.sweep(run_dir)
        pid_file = supervision.PidFile(run_dir, "demo")
        watchdog = None
        try:
            with embedded.held(settings.EMBEDDED_SERVICES_IN_USE) as stops:
                # Killed, the demo's servers stop with it (its children on their
                # parent-death signal).
                watchdog = supervision.Watchdog(
                    pid_file, embedded_root=settings.EMBEDDED_SERVICES_IN_USE if stops else None
                )
                try:
                    self.demo(options)
                finally:
                    # Its connection ends before the server it is on stops.
                    connections.close_all()
        finally:
            if watchdog is not None:
                watchdog.stop()
            pid_file.remove()

    def demo(self, options: dict[str, Any]) -> None:
        console = Console()
        root = Path(settings.VAR_DIR) / "demo" / time.strftime("%Y%m%d-%H%M%S")
        bare = demo.sample_repository_create(root)
        console.print(f"[bold]agentplatform demo[/bold]  sample repository: {bare}")
        workspace, _ = Workspace.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
        repository, _ = Repository.objects.update_or_create(
            workspace=workspace,
            name="calc",
            defaults={
                "clone_url": str(bare),
                "default_branch": "main",
                # The repository's own environment, made by its setup command in the
                # sandbox and cached read-only; the tests never use the platform's
                # interpreter.
                "setup_command": demo.SETUP_COMMAND,
                "test_command": demo.test_command(demo.REPOSITORY_PYTHON),
                "allowed_commands": demo.allowed_commands(demo.REPOSITORY_PYTHON),
            },
        )
        children = start_children(Path(settings.VAR_DIR) / "log")
        try:
            submission = task_submit(
                workspace=workspace,
                repository=repository,
                instruction="Fix add() in calc/core.py so that the test suite passes.",
                source="admin",
                requested_by="demo",
                model_options={"provider": "scripted", "script": demo.fix_script()},
            )
            run = submission.run
            if run is None:
                raise CommandError(f"task deferred: {submission.task.status_reason}")
            console.print(f"task {submission.task.id}  run {run.id}")
            run = self.follow(console, run, children, options["timeout"])
        finally:
            process_groups_stop(children, timeout=15)
        self.report(console, run)
        if run.status != Run.Status.COMPLETED:
            raise CommandError(f"run ended {run.status}: {run.failure_reason}")

    def follow(self, console: Console, run: Run, children: list[Any], timeout: int) -> Run:
        started = time.monotonic()
        with Live(console=console, refresh_per_second=8, transient=False) as live:
            while True:
                run.refresh_from_db()
                last = run.events.order_by("-sequence_no").first()
                live.update(self.progress(run, last, time.monotonic() - started))
                if run.status in TERMINAL:
                    return run
                if time.monotonic() - started > timeout:
                    raise CommandError(f"run still {run.status} after {timeout}s")
                if any(child.poll() is not None for child in children):
                    raise CommandError("a worker or beat process exited; see var/log/")
                time.sleep(0.25)

    def progress(self, run: Run, last: RunEvent | None, elapsed: float) -> Table:
        table = Table.grid(padding=(0, 1))
        reached = PHASES.index(run.status) if run.status in PHASES else len(PHASES)
        bar = []
        for index, phase in enumerate(PHASES):
            if phase == "awaiting_approval":
                continue
            mark = (
                "[green]●[/green]"
                if index < reached or run.status == "completed"
                else ("[yellow]◉[/yellow]" if index == reached else "[dim]○[/dim]")
            )
            bar.append(f"{mark} {phase}")
        table.add_row("  ".join(bar))
        detail = f"{last.type} {event_summary(last)}" if last else ""
        table.add_row(f"[dim]{elapsed:5.1f}s  step {run.step_no}  {detail}[/dim]")
        return table

    def report(self, console: Console, run: Run) -> None:
        table = Table(title=f"Timeline of run {run.id}", show_lines=False)
        table.add_column("#", justify="right")
        table.add_column("time")
        table.add_column("event")
        table.add_column("detail")
        for event in run.events.order_by("sequence_no"):
            table.add_row(
                str(event.sequence_no),
                event.created_at.strftime("%H:%M:%S.%f")[:-3],
                event.type,
                event_summary(event),
            )
        console.print(table)
        pr = PullRequest.objects.filter(task=run.task).first()
        duration = (run.finished_at - run.created_at).total_seconds() if run.finished_at else 0
        colour = "green" if run.status == Run.Status.COMPLETED else "red"
        console.print(
            f"[bold {colour}]run {run.status}[/bold {colour}] in {duration:.1f}s · "
            f"{run.tokens_in}+{run.tokens_out} tokens · ${run.cost_usd:.6f}"
            + (f" · failure {run.failure_reason}" if run.failure_reason else "")
        )
        if pr is not None:
            console.print(f"pull request: {pr.url}  branch {pr.branch} @ {pr.head_sha[:10]}")
