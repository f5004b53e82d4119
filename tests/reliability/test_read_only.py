"""Read-only writes nothing: state.db, its WAL and the chroma/ tree hash the same before and after
`rem status`, `rem check`, `rem replay --dry-run` and a read-only console session, even while the WAL
holds frames a SIGKILLed writer never checkpointed. And a read-only rem starts no Chroma server and
creates no collection."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from backend import ops
from backend.chroma import server as chroma_server
from backend.chroma.ownership import summary_row_id
from backend.core.datadir import DataDir
from backend.dream.digester import Dreamer
from backend.runtime.context import Context
from backend.summaries.summarizer import Summarizer
from tests.helpers import await_until, data_fingerprint, rem_env, run_rem
from tests.summaries import TOPICS, seed_session
from tui.app import ConsoleApp
from tui.screens.detail import DetailScreen
from tui.screens.export import ExportScreen

pytestmark = pytest.mark.slow

# a writer that commits and is then SIGKILLed before it ever checkpoints or closes
KILLED_WRITER = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    for i in range(50):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO event (time, kind, actor, data) VALUES (?, 'test.uncheckpointed', 'writer', '{}')",
            (1_700_000_000_000 + i,),
        )
        conn.execute("COMMIT")
    print("committed", flush=True)
    time.sleep(600)
    """
)


def fingerprint(root: Path) -> dict[str, str]:
    """SHA-256 of state.db, its WAL and every file under chroma/ (names included)."""
    paths = [root / "state.db", root / "state.db-wal", *sorted((root / "chroma").rglob("*"))]
    found = {}
    for path in paths:
        if path.is_file():
            found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            found[str(path.relative_to(root))] = "dir"
    return found


async def build_data_dir(root: Path) -> None:
    """Sessions summarized into this data dir's own Chroma server, which then stops."""
    ctx = Context(DataDir(root), collection="rem_summaries")
    db = await ctx.db()
    for sid in ("s1", "s2", "s3"):
        await seed_session(db, sid, TOPICS[: 1 + int(sid[1]) % 3])
    await Summarizer(ctx, once=True).run()
    # one damaged row, so a dry run has a diff to show and the console a mismatch
    await ctx.store().update_metadata([summary_row_id("s2")], [{"title": "tampered [/oops]"}])
    (row,) = (await ops.replay(ctx, [summary_row_id("s2")], dry_run=True))["rows"]
    detail = {"verdict": row["verdict"], "keys": row["keys"]}
    async with db.tx() as conn:  # what the summarizer's sweep records when it finds the damage
        await conn.execute(
            "UPDATE summary_job SET verdict = ?, verdict_detail = ? WHERE session_id = 's2'",
            (row["verdict"], json.dumps(detail)),
        )
    assert ctx.chroma().started_here
    await ctx.close()  # stops the server this context started
    assert not chroma_server.lock_is_held(DataDir(root))


def kill_a_writer_mid_life(root: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(root / "state.db")], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "committed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


async def read_only_console_session(root: Path, export_to: Path) -> dict[str, Any]:
    """Open the read-only console, look at a receipt's live diff, export a panel outside the data dir."""
    app = ConsoleApp(DataDir(root), read_only=True, data_label="data")
    async with app.run_test(size=(120, 40)) as pilot:

        async def shown() -> bool:
            await pilot.pause()
            return app.applied is not None and bool(app.panel("receipts").shown_keys())

        await await_until(shown, timeout=30, message="the console's first snapshot")
        await pilot.press("3", "enter")
        await await_until(lambda: _screen_is(pilot, DetailScreen), message="the receipt detail")
        await pilot.press("escape", "e")
        await await_until(lambda: _screen_is(pilot, ExportScreen), message="the export prompt")
        path_input = app.screen.query_one("#path")
        path_input.value = str(export_to)  # type: ignore[attr-defined]
        await pilot.press("enter")
        await await_until(lambda: _exists(pilot, export_to), message="the export")
        snapshot = app.applied
        assert snapshot is not None
        return snapshot


async def _screen_is(pilot: Any, cls: type) -> bool:
    await pilot.pause()
    return isinstance(pilot.app.screen, cls)


async def _exists(pilot: Any, path: Path) -> bool:
    await pilot.pause()
    return path.exists()


async def test_every_read_only_path_leaves_the_data_dir_byte_identical(tmp_path: Path) -> None:
    root = tmp_path / "data"
    await build_data_dir(root)
    kill_a_writer_mid_life(root)
    wal = root / "state.db-wal"
    assert wal.stat().st_size > 0, "the killed writer left uncheckpointed frames"
    before = fingerprint(root)
    assert "state.db-wal" in before and any(name.startswith("chroma/") for name in before)

    status = run_rem("status", "--json", "--data", str(root))
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["chroma"]["healthy"] is False
    check = run_rem("check", "--json", "--data", str(root))
    report = json.loads(check.stdout)
    assert check.returncode == 1 and report["violations"]  # what the killed writer left: a violation wins
    # Chroma is down: its part is not checked, and it says why, apart from the violations
    assert [part["what"] for part in report["not_checked"]] == ["chroma"]
    assert "Chroma not running" in check.stdout
    dry = run_rem("replay", "--all", "--dry-run", "--data", str(root))
    assert dry.returncode == 3 and dry.stderr.startswith("rem: error: Chroma not running"), dry.stderr
    assert fingerprint(root) == before

    exported = tmp_path / "receipts.csv"
    snapshot = await read_only_console_session(root, exported)
    assert snapshot["read_only"] is True
    assert "summary_s2" in exported.read_text() or "s2" in exported.read_text()
    assert fingerprint(root) == before
    # the uncheckpointed frames are still only in the WAL: nothing was checkpointed or deleted
    assert wal.exists() and not chroma_server.lock_is_held(DataDir(root))
    assert not (root / "chroma.url").exists()
    assert sorted(p.name for p in root.iterdir()) == sorted(
        ["chroma", "chroma.lock", "logs", "state.db", "state.db-shm", "state.db-wal"]
    )


def chroma_files(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under chroma/ with its SHA-256 and its mtime (a rewrite with equal bytes shows too)."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted((root / "chroma").rglob("*"))
        if p.is_file()
    }


async def test_read_only_paths_leave_a_running_chromas_files_untouched_after_a_restart(
    tmp_path: Path,
) -> None:
    """Chroma writes a collection's index files when the collection is first opened after a start:
    the process that starts it opens them all before recording its URL, so no reader is first."""
    root = tmp_path / "data"
    await build_data_dir(root)
    ctx = Context(DataDir(root), collection="rem_summaries")
    await Dreamer(ctx, once=True).run()  # the turn collection too, its vectors written, never read
    await ctx.close()  # the server stops: the next one starts with every index to reopen
    server = chroma_server.resolve(DataDir(root), start=True)  # as `rem up` starts it
    try:
        before = {**data_fingerprint(root), **chroma_files(root)}
        assert sum(name.endswith("length.bin") for name in before) == 2  # summaries and turns
        env = rem_env(REM_CHROMA_COLLECTION="rem_summaries")
        for args in (["status", "--json"], ["check", "--json"], ["replay", "--all", "--dry-run"]):
            proc = run_rem(*args, "--data", str(root), env=env)
            assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
            assert {**data_fingerprint(root), **chroma_files(root)} == before, (
                f"`rem {args[0]}` changed the data dir"
            )
        assert (
            "chroma" in json.loads(run_rem("check", "--json", "--data", str(root), env=env).stdout)["checked"]
        )
    finally:
        server.stop()


async def test_a_read_only_rem_never_creates_the_collection(
    db_ctx: Context, chroma_url: str, collection: str
) -> None:
    import chromadb

    await db_ctx.close()
    ro = Context(db_ctx.data, chroma_url=chroma_url, collection=collection, read_only=True)
    try:
        report = await ops.check(ro)
        assert "chroma" in report["checked"]
        dry = await ops.replay(ro, all_mismatched=True, dry_run=True)
        assert dry["counters"]["scanned"] == 0
        assert await ro.store().get(["summary_x"]) == {}
    finally:
        await ro.close()
    host, port = chroma_url.rsplit(":", 1)
    client = chromadb.HttpClient(host=host.split("//")[1], port=int(port))
    assert collection not in [c.name for c in client.list_collections()]
