"""Chroma's port taken over under a running `rem up`: the listener is checked on every connection.

Chroma is SIGKILLed under running daemons and an impostor binds its old port at once (as the
user nobody when this runs as root, else as this user: then it is the lock, not the uid, that
gives it away). The impostor answers like Chroma and records every connection and request. The
daemons keep working: nothing but a TCP handshake reaches the impostor, a `chroma.untrusted`
row is journaled, no daemon crashes, `rem up` starts a server of its own on another port and the
work goes on there, `rem status` and the console's banner say what listens on the old port. The
same run shows `rem up` recording the operator journal's head.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.core import processes
from backend.core.datadir import DataDir
from backend.store import journal_head
from tests.helpers import await_until, rem_env, rem_json, run_rem, spawn_rem, wait_until
from tui.app import ConsoleApp

pytestmark = pytest.mark.slow

SETPRIV = shutil.which("setpriv")
NOBODY = ["--reuid=nobody", "--regid=nogroup", "--clear-groups"]

# binds the port as soon as it is free, then answers every request like a Chroma that knows
# nothing (`{}`), and prints one JSON line per connection and per request it gets
IMPOSTOR = r"""
import http.server, json, socket, sys, time

port = int(sys.argv[1])

class Recorder(http.server.BaseHTTPRequestHandler):
    def setup(self):
        super().setup()
        print(json.dumps({"connection": self.client_address[1]}), flush=True)

    def _any(self):
        size = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(size) if size else b""
        print(json.dumps({"method": self.command, "path": self.path, "body": body.decode(errors="replace")}), flush=True)
        out = b'{"nanosecond heartbeat": 1}' if self.path.endswith("/heartbeat") else b"{}"
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

    def log_message(self, *args):
        pass

http.server.HTTPServer.allow_reuse_address = True
deadline = time.monotonic() + 60
while True:
    try:
        server = http.server.HTTPServer(("127.0.0.1", port), Recorder)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.001)
print(json.dumps({"bound": port}), flush=True)
server.serve_forever()
"""


def _as_other_user() -> bool:
    if os.geteuid() != 0 or SETPRIV is None:
        return False
    return subprocess.run([SETPRIV, *NOBODY, "true"], capture_output=True).returncode == 0


@pytest.fixture
def shared_parent() -> Iterator[Path]:
    """A 0755 folder (the impostor's script must be readable by nobody); the data dir inside is rem's."""
    parent = Path(tempfile.mkdtemp(prefix="rem-impostor-"))
    os.chmod(parent, 0o755)
    yield parent
    shutil.rmtree(parent, ignore_errors=True)


def _manifest(root: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((root / "up.json").read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _children(root: Path) -> dict[str, int]:
    return {c["name"]: c["pid"] for c in _manifest(root).get("children", []) if c["pid"]}


def _status(root: Path) -> dict[str, Any]:
    return rem_json("status", "--data", str(root))  # type: ignore[no-any-return]


def _settled(root: Path, sessions: int) -> bool:
    """At least `sessions` sessions, every one answered, summarized and digested, its vectors written."""
    if _status(root)["counts"]["sessions"] < sessions:
        return False
    check = json.loads(run_rem("check", "--json", "--data", str(root)).stdout or "{}")
    return bool(check.get("ok")) and check.get("counts", {}).get("unsettled") == 0


def _send(root: Path, *sessions: str) -> None:
    for sid in sessions:
        proc = run_rem("send", sid, f"what changed for the ledger export on {sid}?", "--data", str(root))
        assert proc.returncode == 0, proc.stderr


def _journal(root: Path, kind: str) -> list[dict[str, Any]]:
    import sqlite3

    conn = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT id, actor, data FROM event WHERE kind = ? ORDER BY id", (kind,)
        ).fetchall()
    finally:
        conn.close()
    return [{"id": r[0], "actor": r[1], **json.loads(r[2])} for r in rows]


async def _console_banner(root: Path) -> str:
    app = ConsoleApp(DataDir(root), read_only=True, data_label="data")
    async with app.run_test(size=(140, 40)) as pilot:

        async def refused() -> str | None:
            await pilot.pause()
            return app.banner.problems.get("chroma-refused")

        shown: str = await await_until(refused, timeout=30, message="the console's banner")
        assert app.banner.has_class("-shown") and not app.banner.has_class("-warning")
        return shown


async def test_an_impostor_on_chromas_port_is_sent_nothing_and_the_fleet_goes_on(shared_parent: Path) -> None:
    root = shared_parent / "data"
    env = rem_env(REM_AGENT_DELAY_MS="50", REM_DREAM_LEASE_MS="4000", REM_SUMMARY_LEASE_MS="4000")
    up = spawn_rem("up", "--data", str(root), "--executors", "1", env=env, log=shared_parent / "up.log")
    impostor: subprocess.Popen[str] | None = None
    try:
        wait_until(lambda: len(_children(root)) == 3, timeout=90, message="rem up to start its daemons")
        _send(root, "s1", "s2")
        wait_until(lambda: _settled(root, 2), timeout=120, interval=0.5, message="the first work")
        daemons = _children(root)
        chroma = _manifest(root)["chroma"]
        old_url, port = chroma["url"], int(chroma["url"].rsplit(":", 1)[1])

        # an operator action: `rem up` records the journal's head as it moves
        assert run_rem("release", "exe_nothing", "--data", str(root)).returncode != 0
        head = wait_until(
            lambda: journal_head.read_heads(DataDir(root)).get(str(root / "state.db")),
            timeout=30,
            message="rem up to record the journal head",
        )
        assert head.count == 1

        script = shared_parent / "impostor.py"
        script.write_text(IMPOSTOR)
        os.chmod(script, 0o644)
        other = _as_other_user()
        prefix = [SETPRIV, *NOBODY] if other else []
        python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
        impostor = subprocess.Popen(
            [*prefix, python if other else sys.executable, str(script), str(port)],
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        assert processes.signal_if_same(chroma["pid"], chroma["started_at"], signal.SIGKILL)
        assert impostor.stdout is not None
        assert json.loads(impostor.stdout.readline()) == {"bound": port}, "the impostor did not get the port"

        _send(root, "s3", "s4")  # work that needs Chroma: summaries, turn vectors, overlays
        refusals = wait_until(
            lambda: _journal(root, "chroma.untrusted"), timeout=60, message="a chroma.untrusted row"
        )
        assert all(r["url"] == old_url for r in refusals), refusals
        if other:
            assert all(r["users"] == ["nobody"] for r in refusals), refusals
        wait_until(lambda: _settled(root, 4), timeout=120, interval=0.5, message="the work after")
        new_url = _manifest(root)["chroma"]["url"]
        assert new_url != old_url, "rem up's Chroma is on another port now"
        status = _status(root)
        assert status["chroma"]["healthy"] and status["chroma"]["url"] == new_url
        # the old port is still held: the snapshot says by whom, from the journal and the socket
        refused = status["chroma"]["refused"]
        assert refused["url"] == old_url
        assert refused["event_id"] == max(r["id"] for r in _journal(root, "chroma.untrusted"))
        assert impostor.pid in refused["pids"] or not refused["pids"]  # pids: as far as we may see them
        if other:
            assert refused["users"] == ["nobody"] and refused["uids"] == [65534]
        assert _children(root) == daemons, "a daemon was restarted (it crashed)"
        assert up.poll() is None
        banner = await _console_banner(root)
        assert old_url in banner and "sent it nothing" in banner, banner
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait(10)
        if impostor is not None:
            impostor.kill()
            out, _ = impostor.communicate(timeout=10)
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    requests = [r for r in records if "method" in r]
    assert requests == [], f"the impostor was sent requests: {requests}"
    assert up.returncode == 0, (shared_parent / "up.log").read_text()[-3000:]
