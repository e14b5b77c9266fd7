"""Plain child processes with rlimits: no namespaces, no walls. For development on a
machine without bubblewrap only; a system check refuses it in production mode."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
from typing import IO

from runs.agent.backends.base import CommandSpec, SandboxBackend

PR_SET_PDEATHSIG = 1


class ProcessBackend(SandboxBackend):
    name = "process"
    contains = False
    workdir_inside = ""  # commands see the host path of the working copy

    def start(self, spec: CommandSpec, output: IO[bytes]) -> subprocess.Popen[bytes]:
        limits = spec.limits

        def confine() -> None:
            # Runs in the child between fork and exec: die with the worker, rlimits.
            with contextlib.suppress(Exception):
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds,) * 2)
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes,) * 2)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_bytes,) * 2)

        for relative, source in spec.readonly_mounts.items():
            target = spec.workdir / relative
            if not target.exists() and not target.is_symlink():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(source)
        return subprocess.Popen(
            spec.argv,
            shell=isinstance(spec.argv, str),
            cwd=spec.workdir,
            env=spec.env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=confine,
        )

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
