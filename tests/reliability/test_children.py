"""Processes rem starts and signals: no planted `backend/`, `json/` or `sqlite3/` from the current
directory in any child (`rem up`'s, the demo's, the drill's, `rem check`'s workers, `rem bench`'s), no
signal to a reused pid, and no drill on a data dir a live `rem up` owns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from backend.core import processes
from backend.core.datadir import DataDir
from backend.core.errors import Refused
from backend.programs import bench, demo
from backend.programs.drill import Drill, DrillConfig, refuse_a_live_data_dir
from backend.programs.supervisor import read_manifest
from backend.runtime.context import Context
from tests import pg
from tests.helpers import REM, rem_env, run_rem, spawn_rem, wait_until

pytestmark = pytest.mark.slow

PLANTED = """
import os
with open(os.environ["PLANTED_MARKER"], "a") as out:
    out.write(f"planted backend imported by pid {os.getpid()}\\n")
raise SystemExit(97)
"""


# what a child would import from its current directory, were it on `sys.path`: rem itself, and two
# modules of the standard library every rem process imports
PLANTED_PACKAGES = ("backend", "backend/cli", "backend/ops", "json", "sqlite3")


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A current directory holding `backend/`, `json/` and `sqlite3/` packages that record any import."""
    cwd = tmp_path / "writable-by-anyone"
    for name in PLANTED_PACKAGES:
        (cwd / name).mkdir(parents=True)
        (cwd / name / "__init__.py").write_text(PLANTED)
    (cwd / "backend" / "cli" / "app.py").write_text(PLANTED)
    (cwd / "backend" / "ops" / "check_worker.py").write_text(PLANTED)
    marker = tmp_path / "marker"
    monkeypatch.setenv("PLANTED_MARKER", str(marker))
    monkeypatch.chdir(cwd)
    yield marker


def _manifest(root: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((root / "up.json").read_text()))
    except (OSError, ValueError):
        return {}


def _all_running(root: Path) -> bool:
    manifest = _manifest(root)
    children = manifest.get("children") or []
    return bool(children) and all(c["pid"] for c in children) and bool(manifest["chroma"]["pid"])


def _start_with_rem_up(root: Path) -> subprocess.Popen[bytes]:
    args = ["up", "--data", str(root), "--executors", "1", "--summarizers", "1", "--dreams", "1"]
    return subprocess.Popen([REM, *args], env=rem_env(), start_new_session=True)


def _start_with_demo(root: Path) -> subprocess.Popen[bytes]:
    return demo.start_up(root)


def _start_with_drill(root: Path) -> subprocess.Popen[bytes]:
    drill = Drill(Context(DataDir(root), start_chroma=False), DrillConfig(executors=1))
    drill.start_system()
    assert drill.up is not None
    return drill.up


@pytest.mark.parametrize("start", [_start_with_rem_up, _start_with_demo, _start_with_drill])
def test_no_child_imports_a_backend_planted_in_the_current_directory(
    planted: Path, tmp_path: Path, start: Callable[[Path], subprocess.Popen[bytes]]
) -> None:
    root = tmp_path / "data"
    up = start(root)
    try:
        wait_until(lambda: _all_running(root), timeout=90, message="rem up to start every process")
        first = {c["name"]: c["pid"] for c in _manifest(root)["children"]}
        # had any child imported the planted package it would have exited 97 (and been restarted)
        wait_until(
            lambda: (
                "executor-1.log" in os.listdir(root / "logs")
                and b"started" in (root / "logs" / "executor-1.log").read_bytes()
            ),
            timeout=60,
            message="the executor to log its start",
        )
        assert {c["name"]: c["pid"] for c in _manifest(root)["children"]} == first  # none restarted
        assert not planted.exists(), planted.read_text()
    finally:
        demo.stop(up)


def test_rem_check_workers_import_nothing_from_the_current_directory(planted: Path, tmp_path: Path) -> None:
    root = str(tmp_path / "data")
    for session in ("s1", "s2", "s3"):
        assert run_rem("send", session, "hello", "--data", root).returncode == 0
    # three sessions are enough for worker processes once the threshold says so
    env = rem_env(REM_CHECK_PARALLEL_SESSIONS="1", REM_LOG="1")
    proc = run_rem("check", "--data", root, "--json", env=env)
    assert "checking 3 sessions in 1 worker process" in proc.stderr, proc.stderr
    assert proc.returncode == 0 and json.loads(proc.stdout)["counts"]["violations"] == 0, proc.stdout
    assert not planted.exists(), planted.read_text()


def test_rem_bench_runs_its_scripts_with_a_safe_path(planted: Path, tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text("import json, os, sys\nprint(json.dumps({'cwd': os.getcwd(), 'path': sys.path}))\n")
    probe = bench.Bench("probe", str(script), (), (), lambda result: [])
    seen = bench.run_one(probe, quick=True)["result"]
    assert seen["cwd"] == str(bench.BENCH_DIR.parent)  # a checkout of rem, not the caller's folder
    assert os.getcwd() not in seen["path"] and "" not in seen["path"] and str(tmp_path) not in seen["path"]
    assert not planted.exists(), planted.read_text()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_rem_up_on_postgresql_shows_its_password_in_no_command_line(
    tmp_path: Path, pg_server: pg.LocalPostgres
) -> None:
    root = tmp_path / "data"
    env = rem_env()
    env.pop("REM_DB_URL", None)
    for url in pg.database_url(pg_server):
        secret = url.replace("postgres@", "postgres:Hunter2-pw@")  # trust auth: never asked for
        args = ["--db", secret, "up", "--data", str(root), "--executors", "1", "--summarizers", "1"]
        up = subprocess.Popen([REM, *args, "--dreams", "1"], env=env, start_new_session=True)
        try:
            wait_until(lambda: _all_running(root), timeout=90, message="rem up to start every process")
            kids = psutil.Process(up.pid).children(recursive=True)
            daemons = [c["pid"] for c in _manifest(root)["children"]]
            assert len(kids) >= 4 and set(daemons) <= {k.pid for k in kids}  # 3 daemons and Chroma
            for pid in [up.pid, *(k.pid for k in kids)]:
                line = _cmdline(pid)
                assert b"Hunter2-pw" not in line and secret.encode() not in line, (pid, line)
            assert b"--db postgresql://postgres:***@/" in _cmdline(up.pid)  # its own title, rewritten
            for pid in daemons:  # the daemons have the URL from their environment, only their user's
                assert f"REM_DB_URL={secret}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
        finally:
            demo.stop(up)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated live process, standing where a reused pid would be."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait(10)


def _write_manifest(root: Path, supervisor: dict[str, Any], child: dict[str, Any]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    manifest = {
        **supervisor,
        "chroma": {"url": "http://127.0.0.1:1", **child, "external": False},
        "children": [{"name": "executor-1", "role": "executor", "restarts": 0, **child}],
    }
    (root / "up.json").write_text(json.dumps(manifest))


def test_a_stale_up_json_pid_is_never_signalled(tmp_path: Path, bystander: subprocess.Popen[bytes]) -> None:
    root = tmp_path / "data"
    real = processes.identity(bystander.pid)
    stale = {"pid": bystander.pid, "started_at": real["started_at"] - 3600}  # same number, older process
    ctx = Context(DataDir(root), start_chroma=False)
    drill = Drill(ctx, DrillConfig())

    _write_manifest(root, stale, stale)  # its `rem up` died and the pid went to someone else
    assert read_manifest(ctx) is None
    refuse_a_live_data_dir(ctx)  # a stale up.json does not make the data dir "live"
    assert drill._pick_victim("executor") is None and drill._pick_victim("chroma") is None

    ours = processes.identity(os.getpid())
    _write_manifest(root, ours, stale)  # a live supervisor, but a child record outlived its process
    assert read_manifest(ctx) is not None
    assert drill._pick_victim("executor") is None and drill._pick_victim("chroma") is None
    for signum in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT, signal.SIGUSR1):
        assert processes.signal_if_same(stale["pid"], stale["started_at"], signum) is False
    assert bystander.poll() is None

    _write_manifest(root, ours, real)  # the control: the right start time names the process
    assert drill._pick_victim("executor") == ("executor-1", bystander.pid, real["started_at"])


def test_drill_refuses_a_data_dir_a_live_rem_up_owns(tmp_path: Path) -> None:
    root = tmp_path / "data"
    up = spawn_rem(
        "up", "--data", str(root), "--executors", "1", "--summarizers", "0", "--dreams", "0", env=rem_env()
    )
    try:
        wait_until(lambda: _all_running(root), timeout=90, message="rem up to start")
        before = _manifest(root)
        proc = run_rem("drill", "sigkill", "--rounds", "1", "--data", str(root), timeout=60)
        assert proc.returncode == 1, proc.stderr
        error = proc.stderr.splitlines()[-1]
        assert error.startswith("rem: error: data dir") and "belongs to a live `rem up`" in error
        assert f"pid {before['pid']}" in error
        assert _manifest(root)["children"] == before["children"]  # nothing was killed or restarted
        with pytest.raises(Refused):
            refuse_a_live_data_dir(Context(DataDir(root), start_chroma=False))
    finally:
        demo.stop(up)
