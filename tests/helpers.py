"""Helpers shared by the test suites: running `rem`, waiting on conditions."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REM = str(Path(sys.executable).parent / "rem")


def rem_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("REM_DATA", None)
    env.pop("REM_CHROMA_URL", None)
    env.pop("REM_FAULTS", None)
    env.pop("REM_SERVER", None)  # a command of a test runs on its store, unless the test names a server
    env.pop("REM_TOKEN_FILE", None)
    env.update(extra)
    return env


def run_rem(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, input: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed `rem` script as a real subprocess."""
    return subprocess.run(
        [REM, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or rem_env(),
        input=input.decode() if input is not None else None,
    )


def rem_json(*args: str, env: dict[str, str] | None = None, expect_rc: int = 0) -> Any:
    proc = run_rem(*args, "--json", env=env)
    assert proc.returncode == expect_rc, (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


def spawn_rem(
    *args: str, env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start `rem` as a background process (stdout/stderr to `log`)."""
    out = open(log, "ab") if log else subprocess.DEVNULL
    return subprocess.Popen(
        [REM, *args], stdout=out, stderr=subprocess.STDOUT, env=env or rem_env(), start_new_session=True
    )


def wait_until(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, message: str = "condition"
) -> Any:
    """Poll `predicate` until it returns a truthy value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.1f} s waiting for {message} (last={last!r})")


async def await_until(
    predicate: Callable[[], Awaitable[Any]],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition",
) -> Any:
    """Async `wait_until`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while loop.time() < deadline:
        last = await predicate()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.1f} s waiting for {message} (last={last!r})")


def data_fingerprint(root: Path) -> dict[str, str]:
    """SHA-256 of every file under `root`, as a read-only path must leave it.

    Left out: SQLite's `-shm` index, which every WAL reader writes by design,
    and an empty `-wal`, which a `mode=ro` reader creates when a cleanly closed
    database has none (it holds nothing; README, "Read-only writes nothing").
    """
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and not p.name.endswith("-shm")
        and not (p.name.endswith("-wal") and p.stat().st_size == 0)
    }


def counter_drift(state_db: Path) -> list[dict[str, object]]:
    """Every `status_count` counter that differs from a real count of its rows (read-only).

    Nothing to say (an empty list) when there is no rem state.db of a schema with counters, or
    the file is not a database any more (a test that corrupts it on purpose).
    """
    import sqlite3

    from backend.store import counters

    if not state_db.exists():
        return []
    try:
        conn = sqlite3.connect(f"{state_db.as_uri()}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error:
        return []
    try:
        if conn.execute("PRAGMA user_version").fetchone()[0] < 6:
            return []
        conn.execute("BEGIN")
        return [d for c in counters.COUNTERS for d in counters.drift_sync(conn, c)]
    except sqlite3.DatabaseError:
        return []
    finally:
        conn.close()
