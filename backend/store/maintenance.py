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
* A whole-file read (`rem check`'s `quick_check`) walks the b-trees in page
  order, not file order: from a cold page cache that is random reads
  (10 000 000 messages: 2.8 GB in 54 s here). `warm_page_cache` asks the
  kernel to read the file ahead sequentially first (~1 GB/s here).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import mmap
import os
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


# read ahead in requests of this size (one large request is cut to the device's readahead window)
WARM_CHUNK_BYTES = 8 << 20


def warm_page_cache(path: Path, *, max_share: float = 0.25) -> int:
    """Ask the kernel to read `path` and its `-wal` into the page cache, sequentially, in the
    background; returns the bytes asked for (0: nothing asked).

    `posix_fadvise(WILLNEED)` starts the reads and returns at once (no copy into this
    process). Skipped where the platform lacks it, and for a file larger than `max_share` of
    physical memory, which would only push other pages out before they are read.
    """
    fadvise = getattr(os, "posix_fadvise", None)
    if fadvise is None:
        return 0
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0
    files = [p for p in (path, path.with_name(path.name + "-wal")) if p.exists()]
    try:
        sizes = [p.stat().st_size for p in files]
    except OSError:
        return 0
    if sum(sizes) > memory * max_share:
        return 0
    asked = 0
    for file, size in zip(files, sizes, strict=True):
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:
            continue
        try:
            for offset in range(0, size, WARM_CHUNK_BYTES):
                fadvise(fd, offset, WARM_CHUNK_BYTES, os.POSIX_FADV_WILLNEED)
            asked += size
        except OSError:
            pass  # only a hint: the check reads the file either way
        finally:
            os.close(fd)
    return asked


def evict_page_cache(path: Path) -> None:
    """Drop `path`'s clean pages from the page cache (benchmarks of a cold read; Linux only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def page_cache_share(path: Path) -> float:
    """The share of `path`'s pages in the page cache (`mincore` over a private map; Linux only)."""
    size = path.stat().st_size
    if size == 0:
        return 1.0
    pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    with path.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        start = ctypes.c_char.from_buffer(mapped)  # copy-on-write: untouched pages are the file's
        try:
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed on {path}")
        finally:
            del start
    return sum(b & 1 for b in vec) / pages


def retention_ms() -> int:
    return settings.event_retention_days * DAY_MS


def _passive_checkpoint(conn: sqlite3.Connection, path: Path) -> dict[str, Any]:
    """A PASSIVE checkpoint, and the WAL's size after it."""
    busy, frames, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    wal = Path(f"{path}-wal")
    return {
        "mode": "passive",
        "busy": bool(busy),
        "frames": frames,
        "checkpointed": done,
        "wal_bytes": wal.stat().st_size if wal.exists() else 0,
        "truncated": False,
        "busy_timeout_ms": int(conn.execute("PRAGMA busy_timeout").fetchone()[0]),
    }


def checkpoint_sync(path: Path, truncate_above: int | None = None) -> dict[str, Any]:
    """PASSIVE, then TRUNCATE if the WAL is over `truncate_above` bytes, on a short-timeout connection."""
    limit = TRUNCATE_ABOVE_BYTES if truncate_above is None else truncate_above
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=CHECKPOINT_BUSY_TIMEOUT_MS / 1000)
    try:
        conn.execute(f"PRAGMA busy_timeout = {CHECKPOINT_BUSY_TIMEOUT_MS}")
        result = _passive_checkpoint(conn, path)
        if result["wal_bytes"] > limit:
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
