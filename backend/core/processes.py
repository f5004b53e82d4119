"""Processes rem starts and signals: safe command lines, and pids that stay who they were.

* Every Python child is described by `python_child` and started through it
  (`PythonChild.popen`, `.spawn` for asyncio, `.run`): it runs Python with `-P`
  (and `PYTHONSAFEPATH=1` for its own children): `python -m backend.cli.app`
  would otherwise put the current directory first on `sys.path`, so starting
  `rem up` or `rem check` from a folder someone else can write (`/tmp`) would
  import a planted `backend/`, `json/` or `sqlite3/` package. It also gets a
  fixed working directory (the data dir, a checkout, else `/`), never the
  caller's: a relative path or an empty `PYTHONPATH` entry then names nothing
  the caller's folder holds.
* A pid alone names a process only while it lives: once it exits the kernel
  may give the number to anything. Whatever rem records to signal later
  (`up.json`) carries the pid *and* its start time, and `signal_if_same`
  signals only a process whose start time still matches.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import psutil
import setproctitle

log = logging.getLogger("rem.processes")

# start times are compared to the hundredth of a second (psutil derives them from jiffies)
START_TIME_DIGITS = 2
# psutil's start times are the boot time (whole seconds) plus jiffies: off by up to a second
# from the wall clock (`started_by`)
BOOT_TIME_SLACK_S = 1.0


class PythonChild(NamedTuple):
    """A Python child process as rem starts it: argv (`python -P ...`), environment, working directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: str

    def popen(self, **options: Any) -> subprocess.Popen[bytes]:
        """Start it (`subprocess.Popen` options: stdout, preexec_fn, ...)."""
        return subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, **options)

    async def spawn(self, **options: Any) -> asyncio.subprocess.Process:
        """Start it from asyncio (`asyncio.create_subprocess_exec` options)."""
        return await asyncio.create_subprocess_exec(*self.argv, env=self.env, cwd=self.cwd, **options)

    def run(self, **options: Any) -> subprocess.CompletedProcess[Any]:
        """Run it to its end (`subprocess.run` options)."""
        return subprocess.run(self.argv, env=self.env, cwd=self.cwd, **options)


def python_child(
    program: str | Path, *args: str, cwd: Path, env: Mapping[str, str] | None = None
) -> PythonChild:
    """The one way rem starts Python: `program` is a module (`backend.cli.app`) or a script's Path.

    `env` adds to (or overrides) this process's environment; `PYTHONSAFEPATH=1`
    always wins. `cwd` is used when it exists, else `/`.
    """
    target = [str(program)] if isinstance(program, Path) else ["-m", program]
    return PythonChild([sys.executable, "-P", *target, *args], child_env(**(env or {})), working_dir(cwd))


def rem_child(*args: str, cwd: Path, env: Mapping[str, str] | None = None) -> PythonChild:
    """`python -P -m backend.cli.app ARGS`: this rem, never a `backend` from the current directory."""
    return python_child("backend.cli.app", *args, cwd=cwd, env=env)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child rem starts: this one, with a safe `sys.path` for it and its own children."""
    return {**os.environ, **extra, "PYTHONSAFEPATH": "1"}


def foreign_child_env(**extra: str) -> dict[str, str]:
    """The environment of a program that is not rem (Chroma): `child_env` without any `REM_*` variable."""
    return {k: v for k, v in child_env(**extra).items() if not k.startswith("REM_")}


def hide_in_title(text: str, shown: str) -> bool:
    """Show `shown` for `text` in this process's title (`ps`, /proc/PID/cmdline); True if it was there.

    setproctitle rewrites the memory the kernel reads argv from (moving the environment if needed):
    what another user's `ps` reads from now on. The moments between exec and this call still show it.
    """
    title = setproctitle.getproctitle()
    if text not in title:
        return False
    setproctitle.setproctitle(title.replace(text, shown))
    return True


def started_at(pid: int) -> float | None:
    """When process `pid` started (Unix time in seconds), or None when there is no such process."""
    try:
        return round(float(psutil.Process(pid).create_time()), START_TIME_DIGITS)
    except (psutil.Error, ValueError, OverflowError):
        return None


def identity(pid: int | None) -> dict[str, Any]:
    """`{"pid", "started_at"}`: what a record of a process must hold to signal it safely later."""
    return {"pid": pid, "started_at": None if pid is None else started_at(pid)}


def same_process(pid: Any, started: Any) -> bool:
    """True while `pid` is still the process that started at `started` (not a reused number)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(started, int | float):
        return False
    now = started_at(pid)
    return now is not None and now == round(float(started), START_TIME_DIGITS)


def started_by(pid: Any, moment_s: float) -> bool:
    """True while `pid` is a process that had started by `moment_s` (Unix time in seconds).

    For a record that kept only when its process began its work (a worker row's `started_at`)
    and not the kernel's start time: a pid the kernel gave to a process after that moment is
    not the one recorded. psutil derives a start time from the boot time, which the kernel
    gives in whole seconds, hence the slack.
    """
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    now = started_at(pid)
    return now is not None and now <= moment_s + BOOT_TIME_SLACK_S


def is_gone(pid: int) -> bool:
    """True when no process has `pid`, or the one that has it is a zombie (dead, not yet reaped)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def wait_gone(pid: int, timeout_s: float, step_s: float = 0.01) -> bool:
    """Wait up to `timeout_s` for `pid` to be gone (`is_gone`); whether it is."""
    deadline = time.monotonic() + timeout_s
    while not is_gone(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(step_s)
    return True


def signal_if_same(pid: Any, started: Any, signum: int) -> bool:
    """Send `signum` to `pid` only if it is still the process recorded; True when it was sent."""
    if not same_process(pid, started):
        log.warning("not signalling pid %s: it is no longer the process recorded (started %s)", pid, started)
        return False
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def working_dir(path: Path) -> str:
    """An explicit working directory for a child: `path` when it exists, else `/`."""
    return str(path) if path.is_dir() else "/"
