"""`rem kill` as a thin shell over `ops.kill`: `--json` prints the library's KillReport, a refusal is one
line on stderr with exit 1, and the worker it names dies by SIGKILL; `rem status` lists the tool call it
had running, with it as owner."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from backend.core.datadir import DataDir
from backend.runtime.context import Context
from tests.backend.test_ops_actions import IDLE_DAEMON
from tests.helpers import rem_env, run_rem, wait_until
from tests.tui.tool_turns import running_call


def test_rem_kill_sigkills_a_worker_and_refuses_in_one_line(tmp_path: Path) -> None:
    root = tmp_path / "data"
    env = rem_env(REM_OPERATOR="alice")
    assert run_rem("init", "--data", str(root), env=env).returncode == 0
    daemon = subprocess.Popen([sys.executable, "-c", IDLE_DAEMON, str(root), "dream-cli-1"], env=env)
    try:
        wait_until(lambda: _row(root, "dream-cli-1"), timeout=60, message="the daemon to register")
        call_id = asyncio.run(_running_call(root, "dream-cli-1"))
        shown = run_rem("status", "--data", str(root), env=env)
        assert "Tool calls running (1)" in shown.stdout and call_id[:9] in shown.stdout, shown.stdout
        out = run_rem("kill", "dream-cli-1", "--data", str(root), "--json", env=env)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert (report["target"], report["pid"], report["signal"]) == ("dream-cli-1", daemon.pid, "SIGKILL")
        assert report["killed_by"] == "alice" and report["exited"] is True
        assert [c["call_id"] for c in report["running_calls"]] == [call_id]
        assert daemon.wait(timeout=10) == -signal.SIGKILL
    finally:
        daemon.kill()
        daemon.wait()
    again = run_rem("kill", "dream-cli-1", "--data", str(root), env=env)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.startswith("rem: error: worker dream-cli-1 is already dead")
    assert len(again.stderr.strip().splitlines()) == 1
    state, exited_at = _row(root, "dream-cli-1") or ("", None)
    assert state == "running" and exited_at is not None  # dead at once, its leases left to expire


async def _running_call(root: Path, owner: str) -> str:
    async with Context(DataDir(root), start_chroma=False) as ctx:
        return await running_call(ctx, "s-cli", owner=owner)


def _row(root: Path, owner: str) -> tuple[str, int | None] | None:
    conn = sqlite3.connect(root / "state.db")
    try:
        return conn.execute("SELECT state, exited_at FROM worker WHERE owner_id = ?", (owner,)).fetchone()
    finally:
        conn.close()
