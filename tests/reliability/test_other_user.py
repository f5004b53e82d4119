"""Another local user, as a real process of another uid (`nobody` through setpriv), against a live data dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import rem_env, spawn_rem, wait_until

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
