"""Housekeeping `rem up` does for its data dir: bound the WAL, prune the old journal.

* A passive autocheckpoint cannot restart the WAL while readers keep using
  it, so under steady load the `-wal` file creeps upward. Every
  `CHECKPOINT_EVERY_S` the supervisor runs `wal_checkpoint(TRUNCATE)`, which
  waits (busy handler) for readers to move to the newest snapshot, copies
  every frame back and truncates the file to zero: the WAL stays bounded by
  what one interval writes.
* `event` is append-only but not forever: rows older than the retention
  window (`REM_EVENT_RETENTION_DAYS`, default 30, the window Dream's legacy
  retirement rule counts in) are deleted from the old end, in small chunks;
  operator events (the audit journal) are kept, whatever the window.
"""

from __future__ import annotations

import logging
from typing import Any

from backend.core import clock
from backend.core.settings import settings
from backend.store.db import Database, execute
from backend.store.events import OPERATOR_KINDS_SQL

log = logging.getLogger("rem.maintenance")

CHECKPOINT_EVERY_S = 30.0
PRUNE_CHUNK = 5_000
DAY_MS = 86_400_000


def retention_ms() -> int:
    return settings.event_retention_days * DAY_MS


async def checkpoint(db: Database) -> dict[str, Any]:
    """`PRAGMA wal_checkpoint(TRUNCATE)`: (busy, WAL frames, frames checkpointed)."""
    row = await db.fetchone("PRAGMA wal_checkpoint(TRUNCATE)")
    busy, frames, done = (int(v) for v in row) if row is not None else (1, -1, -1)
    if busy:
        log.info("WAL checkpoint could not finish (readers busy); %s of %s frames copied", done, frames)
    return {"busy": bool(busy), "frames": frames, "checkpointed": done}


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


async def run_once(db: Database) -> dict[str, Any]:
    pruned = await prune_events(db)
    result = await checkpoint(db)
    result["events_pruned"] = pruned
    return result
