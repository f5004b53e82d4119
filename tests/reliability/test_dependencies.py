"""Dependencies failing under a live system: Chroma SIGKILLed, state.db locked, the disk full.

Each test runs real daemons, breaks one dependency while they work, mends
it, and requires the system to settle with `rem check --settled` clean: the
daemons log the failure and retry with backoff, nothing is lost, and a user
command that hits the failure gets one line naming the problem (exit 3) and
writes nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from backend import ops
from backend.chroma import server as chroma_server
from backend.core.datadir import DataDir
from backend.execution import sessions
from backend.runtime.context import Context
from tests.helpers import run_rem, wait_until
from tests.reliability.rig import WORK, Rig


def _one_line_error(proc: subprocess.CompletedProcess[str], rc: int, needle: str) -> str:
    assert proc.returncode == rc, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rem: error: ") and needle in lines[0], proc.stderr
    return lines[0]


def _count(root: Path, sql: str, params: tuple[object, ...] = ()) -> int:
    with contextlib.closing(sqlite3.connect(root / "state.db", timeout=10)) as conn:
        return int(conn.execute(sql, params).fetchone()[0])


# -- Chroma SIGKILLed mid-pass ------------------------------------------------------------------


@pytest.fixture
async def private_chroma(tmp_path: Path) -> AsyncIterator[Context]:
    """A data dir with its own `chroma run` (so this test may kill it), and a Context on it."""
    data = DataDir(tmp_path / "data").ensure()
    server = chroma_server.resolve(data)
    ctx = Context(data, collection=f"t_{uuid.uuid4().hex[:12]}")
    await ctx.db()
    try:
        yield ctx
    finally:
        await ctx.close()
        live = chroma_server.live_server(data)
        for proc in (server.process,):
            if proc is not None and proc.poll() is None:
                proc.kill()
        if live is not None and live.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(live.pid), signal.SIGKILL)


async def test_chroma_sigkilled_mid_pass_loses_nothing(private_chroma: Context, tmp_path: Path) -> None:
    ctx = private_chroma
    rig = Rig(ctx, None, tmp_path)
    data = ctx.data
    await rig.admit()
    try:
        for role in ("executor", "summarizer", "dream"):
            rig.spawn(role)
        wait_until(lambda: rig.events("summary.completed"), timeout=30, message="a first summary in Chroma")
        server = chroma_server.live_server(data)
        assert server is not None and server.pid
        os.kill(int(server.pid), signal.SIGKILL)
        wait_until(lambda: not chroma_server.is_alive(server.url), timeout=10, message="Chroma to die")
        # work keeps arriving while Chroma is down: new turns, new summaries to write
        await rig.admit(
            [
                ("s3", "Who owns the Payment Gateway, and does Lena need to approve?", "queue"),
                ("s2", "Also mention the refund queue.", "queue"),
            ]
        )
        summarizer_log = next(log for role, _, log in rig.procs if role == "summarizer")
        wait_until(
            lambda: "retrying in" in summarizer_log.read_text(),
            timeout=20,
            message="the summarizer to notice Chroma is gone and back off",
        )
        wait_until(
            lambda: _count(data.root, "SELECT count(*) FROM session_input WHERE promoted_seq IS NULL") == 0,
            timeout=20,
            message="the executors to go on without Chroma",
        )
        assert len(rig.alive()) == 3, rig.tail_logs()  # nobody died of it
        restarted = chroma_server.resolve(data)
        assert restarted.url == server.url  # same port: clients that cached the URL keep working
        await rig.settle(timeout=60)
        await rig.stop()
    finally:
        rig.kill_all()
    report = rig.check_cli()
    assert report["ok"] and "chroma" in report["checked"]
    sessions_done = _count(
        data.root, "SELECT count(*) FROM dream_state WHERE completed_revision = input_revision"
    )
    assert sessions_done == 3


# -- state.db locked by another writer for longer than busy_timeout ----------------------------------

BUSY_MS = "300"


async def test_a_locked_database_is_one_line_for_send_and_a_retry_for_daemons(
    ctx: Context, chroma_url: str, tmp_path: Path
) -> None:
    rig = Rig(
        ctx, chroma_url, tmp_path, extra_env={"REM_BUSY_TIMEOUT_MS": BUSY_MS, "REM_AGENT_DELAY_MS": "150"}
    )
    root = ctx.data.root
    await rig.admit()
    blocker = sqlite3.connect(root / "state.db", timeout=10, isolation_level=None)
    try:
        for role in ("executor", "summarizer"):
            rig.spawn(role)
        wait_until(lambda: _count(root, "SELECT count(*) FROM session_part"), timeout=30, message="streaming")
        blocker.execute("BEGIN IMMEDIATE")  # another writer, holding the lock far past busy_timeout
        held_at = time.monotonic()
        dream = rig.spawn("dream")  # a daemon starting up while the lock is held waits too
        send = run_rem(
            "send",
            "s9",
            "Is the ledger export late again?",
            "--id",
            "late-1",
            "--json",
            "--data",
            str(root),
            env=rig.env(),
        )
        line = _one_line_error(send, 3, "stayed locked by another writer for more than 0.3 s")
        assert str(root / "state.db") in line and "fuser" in line
        executor_log = next(log for role, _, log in rig.procs if role == "executor")
        wait_until(
            lambda: "locked" in executor_log.read_text(), timeout=10, message="the executor to log the lock"
        )
        wait_until(
            lambda: "cannot register yet" in rig.log_of(dream),
            timeout=15,
            message="the starting Dream daemon to wait for the lock",
        )
        time.sleep(max(0.0, 2.0 - (time.monotonic() - held_at)))  # hold it well past every timeout
        assert len(rig.alive()) == 3, rig.tail_logs()
        blocker.execute("ROLLBACK")
        assert (
            _count(root, "SELECT count(*) FROM session WHERE id = 's9'") == 0
        )  # the refused send wrote nothing
        retried = run_rem(
            "send",
            "s9",
            "Is the ledger export late again?",
            "--id",
            "late-1",
            "--json",
            "--data",
            str(root),
            env=rig.env(),
        )
        assert retried.returncode == 0, retried.stderr
        await rig.settle(timeout=60)
        await rig.stop()
    finally:
        blocker.close()
        rig.kill_all()
    rig.check_cli()
    assert _count(root, "SELECT count(*) FROM session_input") == len(WORK) + 1


# -- a full disk ----------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs (as root); skipped with the reason where mounting is not permitted."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a small tmpfs to fill ({proc.stderr.strip() or 'mount failed'}); "
            "run as root (or in a container with CAP_SYS_ADMIN) to test a full disk"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(disk: Path) -> Path:
    """Write a filler file until the filesystem refuses (ENOSPC)."""
    filler = disk / "filler"
    # unbuffered: a partial last write leaves nothing for close() to flush (and fail on)
    with open(filler, "wb", buffering=0) as out:
        with contextlib.suppress(OSError):
            while True:
                out.write(b"\0" * 65536)
    assert os.statvfs(disk).f_bavail == 0
    return filler


def _holds_write_lock(db: Path) -> bool:
    conn = sqlite3.connect(db, timeout=0.2, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()


def _pause_idle(proc: subprocess.Popen[bytes], db: Path) -> None:
    """SIGSTOP `proc` at a moment it holds no write transaction."""
    for _ in range(20):
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.05)
        if not _holds_write_lock(db):
            return
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("could not pause the executor outside a transaction")


async def test_a_full_disk_is_one_line_no_corruption_and_work_resumes(
    small_disk: Path, chroma_url: str, tmp_path: Path
) -> None:
    ctx = Context(
        DataDir(small_disk / "data"), chroma_url=chroma_url, collection=f"t_{uuid.uuid4().hex[:12]}"
    )
    db = await ctx.db()
    root = ctx.data.root
    rig = Rig(ctx, chroma_url, tmp_path)
    try:
        executor = rig.spawn("executor")
        await sessions.admit(db, "s1", "Is the Postgres primary healthy?")
        wait_until(
            lambda: (
                _count(root, "SELECT count(*) FROM session_execution") == 0
                and _count(root, "SELECT count(*) FROM session_message WHERE type = 'assistant'")
            ),
            timeout=30,
            message="a first turn to finish",
        )
        _pause_idle(executor, root / "state.db")
        for i in range(2):  # waiting work the executor will find when it wakes on a full disk
            await sessions.admit(db, f"s{i + 2}", f"Question {i} about the disk pressure alert?")
        await db.fetchall("PRAGMA wal_checkpoint(TRUNCATE)")  # so any write needs a fresh block
        filler = _fill(small_disk)
        executor.send_signal(signal.SIGCONT)

        wait_until(
            lambda: "no space left" in rig.log_of(executor),
            timeout=15,
            message="the executor to hit the full disk",
        )
        send = run_rem(
            "send", "s9", "Anything new on the Frankfurt region?", "--data", str(root), env=rig.env()
        )
        line = _one_line_error(send, 3, "no space left")
        assert str(root / "state.db") in line and "free disk space" in line
        assert executor.poll() is None, rig.log_of(executor)
        with contextlib.closing(sqlite3.connect(root / "state.db")) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]

        filler.unlink()  # space returns: the executor's retry goes through on its own
        wait_until(
            lambda: (
                _count(root, "SELECT count(*) FROM session_input WHERE promoted_seq IS NULL") == 0
                and _count(root, "SELECT count(*) FROM session_execution") == 0
            ),
            timeout=30,
            message="the executor to finish the waiting work",
        )
        assert "retrying in" in rig.log_of(executor)
        await rig.stop()
    finally:
        rig.kill_all()
    assert _count(root, "SELECT count(*) FROM session WHERE id = 's9'") == 0  # the refused send wrote nothing
    await ctx.close()  # the last connection: SQLite removes the -wal and -shm files
    filler = _fill(small_disk)
    # opening now needs a new -shm file, which SQLite reports as a disk I/O error: still "no space", never "corrupt"
    _one_line_error(run_rem("status", "--json", "--data", str(root), env=rig.env()), 3, "no space left")
    filler.unlink()
    await _summarize_and_dream(ctx)
    report = await ops.check(ctx, settled=True)
    assert report["ok"], report["violations"]
    with contextlib.closing(sqlite3.connect(root / "state.db")) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    await ctx.close()


async def _summarize_and_dream(ctx: Context) -> None:
    from backend.dream.digester import Dreamer
    from backend.summaries.summarizer import Summarizer

    await Summarizer(ctx, once=True).run()
    await Dreamer(ctx, once=True).run()
