"""Another local user, as a real process of another uid (`nobody` through setpriv), against a live data dir."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.core.datadir import DataDir
from tests.helpers import REM, rem_env, run_rem, spawn_rem, wait_until

pytestmark = pytest.mark.slow

SETPRIV = shutil.which("setpriv")
NOBODY = ["--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def as_nobody(*command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run `command` as the user nobody (no groups, no capabilities)."""
    assert SETPRIV is not None
    return subprocess.run(
        [SETPRIV, *NOBODY, *command], capture_output=True, text=True, timeout=timeout, cwd="/"
    )


def require_other_user() -> None:
    if os.geteuid() != 0 or SETPRIV is None:
        pytest.skip("needs root and setpriv to run a process as another user (nobody)")
    if as_nobody("true").returncode != 0:
        pytest.skip("setpriv cannot switch to nobody here")


@pytest.fixture
def shared_parent() -> Iterator[Path]:
    """A 0755 folder every user can enter, so only rem's own modes stand between nobody and the data."""
    require_other_user()
    parent = Path(tempfile.mkdtemp(prefix="rem-other-user-"))
    os.chmod(parent, 0o755)
    yield parent
    shutil.rmtree(parent, ignore_errors=True)


def _manifest(root: Path) -> dict:  # type: ignore[type-arg]
    try:
        return json.loads((root / "up.json").read_text())
    except (OSError, ValueError):
        return {}


def _live_children(root: Path) -> bool:
    children = _manifest(root).get("children") or []
    return bool(children) and all(c["pid"] for c in children)


def test_another_uid_cannot_read_the_data_or_take_the_chroma_lock(shared_parent: Path) -> None:
    root = shared_parent / "data"
    up = spawn_rem(
        "up", "--data", str(root), "--executors", "1", "--summarizers", "0", "--dreams", "0", env=rem_env()
    )
    try:
        wait_until(lambda: _live_children(root), timeout=60, message="rem up to start its executor")
        assert (root / "state.db-wal").exists() and (root / "chroma.url").exists()
        logs = sorted((root / "logs").iterdir())
        assert logs, "rem up writes logs"
        # the data dir itself keeps nobody out ...
        assert as_nobody("ls", str(root)).returncode != 0
        assert as_nobody("cat", str(root / "state.db")).returncode != 0
        # ... and so does every file, even once the folders are opened for traversal
        os.chmod(root, 0o711)
        os.chmod(root / "logs", 0o711)
        for path in [root / "state.db", root / "state.db-wal", root / "chroma.url", root / "up.json", *logs]:
            proc = as_nobody("cat", str(path))
            assert proc.returncode != 0 and "Permission denied" in proc.stderr, (path, proc)
        locked = as_nobody("flock", "--nonblock", "--shared", str(root / "chroma.lock"), "true")
        assert locked.returncode != 0 and "Permission denied" in locked.stderr, locked
    finally:
        up.terminate()
        up.wait(60)


# a stand-in that answers Chroma's heartbeat, as a squatter on a stale chroma.url port would
FAKE_CHROMA = """
import http.server, json, sys
class Heartbeat(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"nanosecond heartbeat": 1}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Heartbeat).serve_forever()
"""


async def _one_receipt(root: Path) -> None:
    from backend.runtime.context import Context
    from tests.summaries import base_metadata, stage_receipt

    ctx = Context(DataDir(root), start_chroma=False)
    await stage_receipt(await ctx.db(), "s1", "summary of s1", base_metadata("s1"), now=1_000)
    await ctx.close()


def _answers(url: str) -> bool:
    from backend.chroma import server as chroma_server

    return chroma_server.is_alive(url, timeout=0.5)


def test_a_listener_of_another_uid_on_the_recorded_port_is_refused(shared_parent: Path) -> None:
    from backend.chroma import server as chroma_server

    root = shared_parent / "data"
    asyncio.run(_one_receipt(root))  # so check and replay have a row to fetch from Chroma
    script = shared_parent / "fake_chroma.py"
    script.write_text(FAKE_CHROMA)
    os.chmod(script, 0o644)
    port = chroma_server.free_port()
    url = f"http://127.0.0.1:{port}"
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    squatter = subprocess.Popen([SETPRIV, *NOBODY, python, str(script), str(port)], cwd="/")
    # the lock held (as a live server of this data dir would hold it) and the URL recorded:
    # everything the old check looked at says "trust it"
    holder = subprocess.Popen(["flock", str(root / "chroma.lock"), "sleep", "600"])
    try:
        wait_until(lambda: _answers(url), timeout=20, message="the squatter to answer")
        (root / "chroma.url").write_text(url + "\n")
        wait_until(lambda: chroma_server.lock_is_held(DataDir(root)), timeout=10, message="the lock")

        status = run_rem("status", "--json", "--data", str(root))
        assert status.returncode == 0, status.stderr
        chroma = json.loads(status.stdout)["chroma"]
        assert chroma["healthy"] is False and "nobody (uid 65534)" in chroma["error"]
        for command in (
            ["replay", "--all", "--dry-run"],
            ["replay", "--all"],
            ["check"],
        ):
            proc = run_rem(*command, "--data", str(root), timeout=60)
            assert "Traceback" not in proc.stderr, (command, proc.stderr)
            if command[0] == "check":  # a check says what it could not check, and why (exit 3)
                assert proc.returncode == 3 and "nobody (uid 65534)" in proc.stdout, proc
                assert "INCOMPLETE (Chroma unreachable)" in proc.stdout, proc
                continue
            assert proc.returncode == 3, (command, proc.stderr)
            assert proc.stderr.startswith("rem: error: refusing the Chroma server at " + url), proc.stderr
            assert proc.stderr.count("\n") == 1
        assert squatter.poll() is None  # refused, not talked to and not signalled
    finally:
        holder.terminate()
        squatter.terminate()
        holder.wait(10)
        squatter.wait(10)


def test_a_data_dir_under_a_folder_this_user_cannot_enter_is_one_line(shared_parent: Path) -> None:
    """A real other user (root enters everything): every data-dir command said PermissionError in a
    traceback; now one line naming the folder it may not enter, and the usage exit code."""
    locked = shared_parent / "locked"
    locked.mkdir(mode=0o700)  # root's: nobody may not enter it
    root = locked / "data"
    for command in (["status"], ["init"], ["send", "s1", "hi"], ["check", "--json"], ["show", "s1"]):
        proc = as_nobody(REM, *command, "--data", str(root), timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (command, proc.stderr[-2000:])
        assert proc.stdout == "" and proc.stderr == (
            f"rem: error: data dir {root} cannot be reached: this user (nobody) may not enter {locked}; "
            "run rem as the user the data dir belongs to, or pass another --data\n"
        ), (command, proc.stderr)
    assert not root.exists()  # nothing was made, either
