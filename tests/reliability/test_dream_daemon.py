"""The real `rem daemon --role dream` process: --once end to end, and SIGKILL mid-pass."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from backend.chroma.ownership import summary_row_id
from backend.core.datadir import DataDir
from backend.dream.digester import Dreamer
from backend.runtime.context import Context
from tests.dreamkit import add_session_with_turns, add_turn, publish, synthesize, without_revisions
from tests.helpers import rem_env, run_rem, spawn_rem, wait_until

WORDS = ["latency", "storage", "budget", "replica", "journal", "snapshot", "cursor", "backlog"]
NAMES = ["Kafka", "Postgres", "Redis", "SQLite", "Chroma"]


def _texts(session: int, turns: int) -> list[str]:
    rng = random.Random(session)
    return [
        f"We tuned {rng.choice(NAMES)} with {rng.choice(NAMES)} for {rng.choice(WORDS)} and "
        f"{rng.choice(WORDS)} in turn {j}."
        for j in range(turns)
    ]


async def _build(ctx: Context, sessions: int, turns: int, chroma: bool) -> None:
    db = await ctx.db()
    for i in range(sessions):
        sid = f"s{i:03d}"
        await add_session_with_turns(db, sid, _texts(i, turns))
        if chroma:
            await synthesize(db, ctx.store(), sid)
        else:
            await publish(db, sid)


def _state(root: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(root / "state.db", timeout=10)
    conn.row_factory = sqlite3.Row
    return conn


def _graph(root: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    with _state(root) as conn:
        nodes = [
            tuple(r)
            for r in conn.execute("SELECT id, kind, session_id, revision FROM graph_node ORDER BY id")
        ]
        edges = [
            tuple(r)
            for r in conn.execute(
                "SELECT src, dst, kind, session_id, weight, revision FROM graph_edge ORDER BY 1, 2, 3, 4"
            )
        ]
    return nodes, edges


def _all_current(root: Path) -> bool:
    with _state(root) as conn:
        row = conn.execute(
            "SELECT count(*) FROM dream_state WHERE completed_revision IS NOT input_revision "
            "OR overlay_pending = 1"
        ).fetchone()
    return row[0] == 0


async def _reference(root: Path, sessions: int, turns: int, extra: bool) -> tuple[list[Any], list[Any]]:
    """The graph of the same input digested by one uninterrupted in-process Dreamer."""
    ctx = Context(DataDir(root), start_chroma=False)
    try:
        await _build(ctx, sessions, turns, chroma=False)
        if extra:
            await _extra_turn(ctx)
        dreamer = Dreamer(ctx)
        while await dreamer.run_pass():
            pass
    finally:
        await ctx.close()
    return _graph(root)


async def _extra_turn(ctx: Context, store: bool = False) -> str:
    db = await ctx.db()
    await add_turn(db, "s001", "s001-extra", "Later we moved Redis behind Kafka.", time=99_000)
    if store:
        return (await synthesize(db, ctx.store(), "s001"))[0]
    return await publish(db, "s001")


def _env(collection: str, **extra: str) -> dict[str, str]:
    return rem_env(REM_CHROMA_COLLECTION=collection, REM_DREAM_LEASE_MS="1500", **extra)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


async def test_once_digests_everything_end_to_end(ctx: Context, chroma_url: str, collection: str) -> None:
    await _build(ctx, sessions=3, turns=4, chroma=True)
    root = ctx.data.root
    proc = run_rem(
        "daemon",
        "--role",
        "dream",
        "--once",
        "--data",
        str(root),
        "--chroma-url",
        chroma_url,
        env=_env(collection),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert _all_current(root)
    with _state(root) as conn:
        assert conn.execute("SELECT count(*) FROM event WHERE kind = 'dream.completed'").fetchone()[0] == 3
        worker = conn.execute("SELECT state FROM worker WHERE role = 'dream'").fetchone()
    assert worker["state"] == "stopped"
    rows = await ctx.store().get([summary_row_id(f"s{i:03d}") for i in range(3)])
    db = await ctx.db()
    for row_id, (_, meta) in rows.items():
        completed = await db.scalar(
            "SELECT completed_revision FROM dream_state WHERE session_id = ?",
            (row_id.removeprefix("summary_"),),
        )
        assert meta["dreamCompletedRevision"] == completed == meta["dreamInputRevision"]
        assert meta["graphDigested"] is True


@pytest.mark.parametrize("kill", ["fault", "random"])
async def test_sigkill_mid_pass_then_rerun_leaves_no_duplicates(
    ctx: Context, chroma_url: str, collection: str, tmp_path: Path, kill: str
) -> None:
    sessions, turns = (4, 30) if kill == "fault" else (40, 40)
    await _build(ctx, sessions, turns, chroma=True)
    root = ctx.data.root
    args = ("daemon", "--role", "dream", "--data", str(root), "--chroma-url", chroma_url)
    log = tmp_path / "dream.log"
    if kill == "fault":
        proc = spawn_rem(
            *args, env=_env(collection, REM_FAULTS="dream.mid_graph", REM_DREAM_CHUNK_ROWS="20"), log=log
        )
        assert proc.wait(timeout=60) == -signal.SIGKILL, log.read_text()
    else:
        proc = spawn_rem(*args, env=_env(collection, REM_DREAM_CHUNK_ROWS="40"), log=log)
        try:
            wait_until(lambda: _graph(root)[1], timeout=60, message="the first graph rows")
            seed = int.from_bytes(os.urandom(4), "big")
            delay = random.Random(seed).uniform(0.0, 0.4)
            print(f"random kill: seed={seed} delay={delay:.3f}s")
            time.sleep(delay)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    with _state(root) as conn:
        held = conn.execute("SELECT count(*) FROM dream_state WHERE owner_id IS NOT NULL").fetchone()[0]
    if kill == "fault":
        assert held == 1  # killed holding its lease, part of the graph written
    assert not _all_current(root), "the kill landed after all the work; make the workload bigger"

    rev_b = await _extra_turn(ctx, store=True)  # synthesis publishes a new revision meanwhile
    rerun = spawn_rem(*args, env=_env(collection), log=log)
    try:
        wait_until(lambda: _all_current(root), timeout=120, message="every session at its current revision")
    finally:
        _stop(rerun)
    assert rerun.returncode == 0, log.read_text()

    expected = await _reference(tmp_path / "ref", sessions, turns, extra=True)
    # no duplicate, missing or stale node or edge (revisions differ by history: a row
    # written for A that B left as it was keeps A's stamp)
    assert without_revisions(_graph(root)) == without_revisions(expected)
    with _state(root) as conn:
        assert (
            conn.execute("SELECT completed_revision FROM dream_state WHERE session_id = 's001'").fetchone()[0]
            == rev_b
        )
        if held:
            assert (
                conn.execute("SELECT count(*) FROM event WHERE kind = 'dream.taken_over'").fetchone()[0] >= 1
            )
        states = {r[0] for r in conn.execute("SELECT digest_state FROM dream_state")}
    assert states == {"digested"}
    metas = await ctx.store().get([summary_row_id(f"s{i:03d}") for i in range(sessions)])
    db = await ctx.db()
    for row_id, (_, meta) in metas.items():
        completed = await db.scalar(
            "SELECT completed_revision FROM dream_state WHERE session_id = ?",
            (row_id.removeprefix("summary_"),),
        )
        assert meta["dreamCompletedRevision"] == completed == meta["dreamInputRevision"]
