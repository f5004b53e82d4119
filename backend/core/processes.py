"""Processes rem starts and signals: safe command lines, and pids that stay who they were.

* Children run Python with `-P` (and `PYTHONSAFEPATH=1` for theirs): `python
  -m backend.cli.app` would otherwise put the current directory first on
  `sys.path`, so starting `rem up` from a folder someone else can write
  (`/tmp`) would import a planted `backend/` package. They also get an
  explicit working directory.
* A pid alone names a process only while it lives: once it exits the kernel
  may give the number to anything. Whatever rem records to signal later
  (`up.json`) carries the pid *and* its start time, and `signal_if_same`
  signals only a process whose start time still matches.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger("rem.processes")

# start times are compared to the hundredth of a second (psutil derives them from jiffies)
START_TIME_DIGITS = 2


def rem_command(*args: str) -> list[str]:
    """`python -P -m backend.cli.app ARGS`: this rem, never a `backend` from the current directory."""
    return [sys.executable, "-P", "-m", "backend.cli.app", *args]


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child rem starts: this one, with a safe `sys.path` for it and its own children."""
    return {**os.environ, "PYTHONSAFEPATH": "1", **extra}


def started_at(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), or None when there is no such process."""
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
