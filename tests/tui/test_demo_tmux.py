"""The tour's tool-call step (docs/getting-started.md, step 4 of the demo) done as a reader does it:
`rem demo` in a real terminal (tmux), driven with keystrokes only, read off the screen.

Approve a send (`/approve`, `a`, the confirmation names who runs it), keep its row in view (`/`
and its id) until it is `running`, `k` on it (the confirmation names its executor and the send),
release the dead executor's lease on the turn (`2`, `/` and the execution id, `l`), see the call
`unknown`, `o` and Done. Then the harness settles the demo (stops the load, denies what still waits
for approval) until `rem check --settled` is clean on the live demo, and `q` quits it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from backend.core import processes
from tests.helpers import REM, rem_env, rem_json, run_rem, wait_until

pytestmark = pytest.mark.slow
TMUX = shutil.which("tmux")
SIZE = ("120", "40")


class Terminal:
    """One tmux session on a server of its own (its socket in the test's folder): keys in, the
    screen's text out."""

    def __init__(self, socket: Path, env: dict[str, str], logs: Path) -> None:
        assert TMUX is not None
        self.base = [TMUX, "-S", str(socket), "-f", "/dev/null"]
        self.env = env
        self.logs = logs  # the demo's logs: their tails go with a failure, for its post-mortem

    def tmux(self, *args: str) -> str:
        done = subprocess.run([*self.base, *args], capture_output=True, text=True, env=self.env, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-s", "t", "-x", SIZE[0], "-y", SIZE[1], command)

    def keys(self, *keys: str) -> None:
        """Each key as tmux names it (Enter, Tab, Home, C-u), or a word typed letter by letter."""
        for key in keys:
            literal = len(key) > 1 and not re.fullmatch(r"Enter|Tab|Home|Escape|C-u", key)
            self.tmux("send-keys", "-t", "t", *(["-l", key] if literal else [key]))
            time.sleep(0.15)  # a quick hand, not a paste

    def screen(self) -> str:
        return self.tmux("capture-pane", "-t", "t", "-p")

    def wait(self, pattern: str, what: str, timeout: float = 60) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def shown() -> bool:
            match = re.search(pattern, self.screen())
            if match is not None:
                found.append(match)
            return match is not None

        try:
            wait_until(shown, timeout=timeout, interval=0.3, message=what)
        except AssertionError:
            raise AssertionError(f"{what} not on screen:\n{self.screen()}\n{self.log_tails()}") from None
        return found[0]

    def log_tails(self, lines: int = 12) -> str:
        tails = []
        for log in sorted(self.logs.glob("*.log")):
            if log.name != "chroma.log":
                tails.append(
                    f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                )
        return "\n".join(tails)

    def alive(self) -> bool:
        assert TMUX is not None
        return (
            subprocess.run(
                [*self.base, "has-session", "-t", "t"], capture_output=True, env=self.env
            ).returncode
            == 0
        )

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, env=self.env)


def _settle(root: Path, env: dict[str, str]) -> dict[str, Any]:
    """Stop the demo's load (SIGUSR1 to its `rem up`), deny what still waits for approval, and wait
    until `rem check --settled` is clean: its last report."""
    manifest = json.loads((root / "up.json").read_text())
    assert processes.signal_if_same(manifest["pid"], manifest["started_at"], signal.SIGUSR1)
    report: dict[str, Any] = {}

    def settled() -> bool:
        waiting = rem_json("status", "--data", str(root), env=env)["tools"]["awaiting_approval"]
        for call in waiting:
            run_rem("deny", call["call_id"], "--data", str(root), "--reason", "the test settles", env=env)
        checked = run_rem("check", "--settled", "--json", "--data", str(root), env=env)
        report.update(json.loads(checked.stdout))
        return checked.returncode == 0

    wait_until(settled, timeout=240, interval=2, message="the demo to settle")
    return report


@pytest.mark.timeout(600)  # the demo's start (Chroma, five daemons) and its settling, on 2 loaded cores
def test_the_tours_tool_call_step_by_keys_ends_settled(tmp_path: Path) -> None:
    if TMUX is None:
        if os.environ.get("CI"):
            pytest.fail("tmux is not installed (.ci/run installs it)")
        pytest.skip("tmux is not installed")
    root = tmp_path / "demo"
    env = rem_env(
        TERM="xterm-256color", REM_OPERATOR="alice", COLUMNS=SIZE[0], LINES=SIZE[1]
    )  # CI exports COLUMNS=80
    term = Terminal(tmp_path / "tmux.sock", env, root / "logs")
    term.start(f"{REM} demo --data {root}")
    try:
        term.wait(r"[│┃] approve ", "a send waiting for approval in Backlog", timeout=180)
        term.keys("1", "/", "approve", "Enter", "Home", "a")
        approve = term.wait(r"Tool call (call_\S+) of session (\S+) \(execution (\S+)\)", "the approval")
        call_id, execution = approve.group(1), approve.group(3)
        assert "next executor to take the turn" in term.screen()
        term.keys("Tab", "Enter")
        term.keys("/", "C-u", call_id, "Enter")
        term.wait(r"[│┃] running ", "the approved send running", timeout=90)
        term.keys("Home", "k")
        term.wait(r"SIGKILL executor executor-", "the kill's confirmation")
        term.wait(r"demo\.outbox_send of \S+ · effect · running", "the send among the calls it runs")
        term.keys("Tab", "Enter")
        term.wait(r"kill done", "the kill done")
        term.keys("2", "/", "C-u", execution, "Enter", "Home", "l")
        term.wait(r"Release lease " + re.escape(execution), "the release's confirmation")
        term.keys("Tab", "Enter")
        term.keys("1")
        term.wait(r"[│┃] unknown ", "the send's outcome unknown after the takeover", timeout=90)
        term.keys("Home", "o")
        term.wait(r"Resolve demo\.outbox_send for", "the resolve confirmation")
        term.keys("Tab", "Enter")  # from Cancel to Done
        term.wait(r"resolve done", "the call resolved done")
        report = _settle(root, env)
        term.keys("q")
        wait_until(lambda: not term.alive(), timeout=90, message="the demo to stop everything and exit")
    finally:
        term.close()
        _stop_leftovers(root)
    # the last `rem check --settled` on the live demo: clean (its Chroma stopped with it since)
    assert report["ok"] is True and report["violations"] == [] and report["unsettled"] == []
    conn = sqlite3.connect(f"{(root / 'state.db').as_uri()}?mode=ro", uri=True)
    try:
        call = conn.execute("SELECT state, decided_by FROM tool_call WHERE id = ?", (call_id,)).fetchone()
        kills = conn.execute("SELECT actor, data FROM event WHERE kind = 'operator.kill'").fetchall()
    finally:
        conn.close()
    assert call == ("completed", "alice")  # resolved done by the operator, after the kill left it unknown
    ((actor, data),) = kills
    assert actor == "alice" and call_id in data  # the send was among the calls the killed executor ran


def _stop_leftovers(root: Path) -> None:
    """After a failure: the demo's `rem up` (its own process group) stopped, as `q` would have."""
    try:
        manifest = json.loads((root / "up.json").read_text())
    except (OSError, ValueError):
        return
    if processes.same_process(manifest.get("pid"), manifest.get("started_at")):
        os.killpg(manifest["pid"], signal.SIGKILL)
