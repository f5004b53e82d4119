"""How rem opens state.db: its PRAGMA values, the read-only URI, never another program's database,
and SQLite's errors as the one-line RemError an operator can act on."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from backend.core.errors import (
    DatabaseCorrupt,
    DatabaseFull,
    DatabaseIOError,
    DatabaseLocked,
    DataDirError,
    ReadOnly,
    RemError,
)
from backend.core.settings import settings

# >= 5 s per the contract; tests of lock contention shorten it through the environment
BUSY_TIMEOUT_MS = settings.busy_timeout_ms
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024


def translate_sqlite_error(exc: sqlite3.Error, path: Path | str) -> RemError | None:
    """Map an sqlite3 error to the one-line RemError an operator can act on."""
    msg = str(exc).lower()
    if "locked" in msg or "busy" in msg:
        return DatabaseLocked(
            f"{path} stayed locked by another writer for more than "
            f"{BUSY_TIMEOUT_MS / 1000:g} s; retry, or find the holder with `fuser {path}`"
        )
    if "disk is full" in msg or "database or disk is full" in msg:
        return DatabaseFull(f"no space left for {path}; free disk space, then retry")
    if "disk i/o error" in msg:
        return _io_error(exc, path)
    if "not a database" in msg or "malformed" in msg:
        return DatabaseCorrupt(
            f"{path} is not a readable rem database ({exc}); restore it from a backup "
            "or move it aside and run `rem init`"
        )
    if "unable to open" in msg:
        return DataDirError(f"cannot open {path}: {exc}; check --data and its permissions")
    if "readonly" in msg or "read-only" in msg or "attempt to write" in msg:
        return ReadOnly(f"{path} is opened read-only; this action needs a writable rem")
    return None


@contextmanager
def sqlite_errors(path: Path | str) -> Iterator[None]:
    """Raise an sqlite3 error from inside as the one-line RemError for `path` (others unchanged)."""
    try:
        yield
    except sqlite3.Error as exc:
        translated = translate_sqlite_error(exc, path)
        if translated is None:
            raise
        raise translated from exc


# below this much free space, a disk I/O error is a full disk (SQLite reports a
# -shm or -wal file it could not grow as SQLITE_IOERR_*, not SQLITE_FULL)
FULL_BELOW_BYTES = 1024 * 1024


def _io_error(exc: sqlite3.Error, path: Path | str) -> RemError:
    """A disk I/O error: a full disk when the filesystem is (nearly) full, never "corrupt"."""
    name = getattr(exc, "sqlite_errorname", "SQLITE_IOERR")
    try:
        free = shutil.disk_usage(Path(path).parent).free
    except OSError:
        free = None
    if free is not None and free < FULL_BELOW_BYTES:
        return DatabaseFull(
            f"no space left for {path} ({free} bytes free, {name}); free disk space, then retry"
        )
    return DatabaseIOError(
        f"disk I/O error on {path} ({name}); check the disk (`df`, `dmesg`) "
        "and retry; if it persists, restore state.db from a backup"
    )


# what an unversioned (user_version 0) database already holds; a new rem database holds nothing
FOREIGN_TABLES_SQL = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
)


def refuse_foreign(path: Path | str, user_version: int, tables: list[str]) -> None:
    """Never touch another program's SQLite database: rem's is versioned, or empty."""
    if user_version == 0 and tables:
        shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        raise DataDirError(
            f"{path} is a SQLite database, but not rem's (no rem schema; tables: {shown}); "
            "move it aside or pass another --data"
        )


def sqlite_target(path: Path, read_only: bool) -> tuple[str, bool]:
    """What `sqlite3.connect` opens: the path, or a read-only URI (`(database, uri)`)."""
    if not read_only:
        return str(path), False
    return f"{Path(path).absolute().as_uri()}?mode=ro", True
