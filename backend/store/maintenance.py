"""Housekeeping `rem up` does for its data dir: bound the WAL, prune the old journal.

* A passive autocheckpoint cannot restart the WAL while readers keep using
  it, so under steady load the `-wal` file creeps upward. Every
  `CHECKPOINT_EVERY_S` the supervisor checkpoints on a connection of its own
  with a short busy timeout (`CHECKPOINT_BUSY_TIMEOUT_MS`): first PASSIVE
  (copies what it can, never waits), then, only when the WAL file is larger
  than `TRUNCATE_ABOVE_BYTES`, TRUNCATE (waits for readers to move on, copies
  every frame back, truncates the file to zero). A reader in the way costs
  the TRUNCATE at most the short timeout, never the full `busy_timeout` the
  daemons' connections use; it is simply tried again next interval.
* `event` is append-only but not forever: rows older than the retention
  window (`REM_EVENT_RETENTION_DAYS`, default 30, the window Dream's legacy
  retirement rule counts in) are deleted from the old end, in small chunks;
  operator events (the audit journal) are kept, whatever the window.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

from backend.core import clock
from backend.core.settings import settings
from backend.store.db import Database, execute, translate_sqlite_error
from backend.store.events import OPERATOR_KINDS_SQL

log = logging.getLogger("rem.maintenance")

CHECKPOINT_EVERY_S = 30.0
CHECKPOINT_BUSY_TIMEOUT_MS = 250
TRUNCATE_ABOVE_BYTES = 8 * 1024 * 1024
PRUNE_CHUNK = 5_000
DAY_MS = 86_400_000


def retention_ms() -> int:
    return settings.event_retention_days * DAY_MS


def checkpoint_sync(path: Path, truncate_above: int | None = None) -> dict[str, Any]:
    """PASSIVE, then TRUNCATE if the WAL is over `truncate_above` bytes, on a short-timeout connection."""
    limit = TRUNCATE_ABOVE_BYTES if truncate_above is None else truncate_above
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=CHECKPOINT_BUSY_TIMEOUT_MS / 1000)
    try:
        conn.execute(f"PRAGMA busy_timeout = {CHECKPOINT_BUSY_TIMEOUT_MS}")
        busy, frames, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        wal = Path(f"{path}-wal")
        size = wal.stat().st_size if wal.exists() else 0
        result: dict[str, Any] = {
            "mode": "passive",
            "busy": bool(busy),
            "frames": frames,
            "checkpointed": done,
            "wal_bytes": size,
            "truncated": False,
            "busy_timeout_ms": int(conn.execute("PRAGMA busy_timeout").fetchone()[0]),
        }
        if size > limit:
            busy, frames, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            result.update(
                mode="truncate", busy=bool(busy), frames=frames, checkpointed=done, truncated=not busy
            )
        return result
    finally:
        conn.close()


async def checkpoint(db: Database, truncate_above: int | None = None) -> dict[str, Any]:
    """`checkpoint_sync` on state.db, off the event loop (PostgreSQL checkpoints its own WAL)."""
    if db.postgres:  # its `db.path` names no file: a sqlite3.connect would create one in the cwd
        return {"mode": "server", "busy": False}
    try:
        result = await asyncio.to_thread(checkpoint_sync, db.path, truncate_above)
    except sqlite3.Error as exc:
        raise translate_sqlite_error(exc, db.path) or exc from exc
    if result["busy"]:
        log.info("WAL checkpoint (%s) could not finish (readers busy); tried again later", result["mode"])
    return result


# The journal is appended in time order, so its old end is a prefix in id order:
# delete up to the first row inside the window. Finding that row walks only
# the rows about to go (no time index to maintain on every write). A row
# stamped by a clock running ahead holds the rows after it until it ages out.
# Operator events are the audit journal: never pruned (a trigger refuses their deletion too).
PRUNE_SQL = f"""
DELETE FROM event WHERE id IN (
    SELECT id FROM event
    WHERE id < coalesce((SELECT id FROM event WHERE time >= :cutoff ORDER BY id LIMIT 1),
                        (SELECT max(id) FROM event) + 1)
      AND kind NOT IN ({OPERATOR_KINDS_SQL})
    ORDER BY id LIMIT :chunk)
"""


async def prune_events(db: Database, now: int | None = None) -> int:
    """Delete journal rows older than the retention window; returns rows deleted."""
    cutoff = (clock.now_ms() if now is None else now) - retention_ms()
    deleted = 0
    while True:
        async with db.tx() as conn:
            changed = await execute(conn, PRUNE_SQL, {"cutoff": cutoff, "chunk": PRUNE_CHUNK})
        deleted += changed
        if changed < PRUNE_CHUNK:
            return deleted


# model request attempts age out with the journal (served by model_call_time_idx)
PRUNE_CALLS_SQL = """
DELETE FROM model_call WHERE id IN (
    SELECT id FROM model_call WHERE time < :cutoff ORDER BY time LIMIT :chunk)
"""


async def prune_model_calls(db: Database, now: int | None = None) -> int:
    """Delete model request records older than the retention window; returns rows deleted."""
    cutoff = (clock.now_ms() if now is None else now) - retention_ms()
    deleted = 0
    while True:
        async with db.tx() as conn:
            changed = await execute(conn, PRUNE_CALLS_SQL, {"cutoff": cutoff, "chunk": PRUNE_CHUNK})
        deleted += changed
        if changed < PRUNE_CHUNK:
            return deleted


async def run_once(db: Database) -> dict[str, Any]:
    pruned = await prune_events(db)
    calls = await prune_model_calls(db)
    result = await checkpoint(db)
    result["events_pruned"] = pruned
    result["model_calls_pruned"] = calls
    return result
