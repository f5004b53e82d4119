"""The status history: compact snapshots `rem up` records, read back by the console's timeline.

`history.db` sits in the data dir beside state.db but is not the system of
record: losing it loses the timeline, nothing else. It has its own retention
(`REM_HISTORY_RETENTION_DAYS`, 7) and a size bound (`REM_HISTORY_MAX_MB`):
the oldest snapshots go first, and snapshots older than a day are thinned to
one a minute (the ones taken at an operator action or an incident's start
are kept), so a week fits the bound. Freed pages are reused, so the file
stops growing at the bound. Each row is a zlib-compressed JSON of what the
console's panels show, the journal id it had reached (the events around a
moment are read from state.db's journal by id, not stored twice), the alert
conditions that held (`backend/ops/alert_rules.py`), and whether an incident
started there: an alert condition that did not hold in the previous row, or
an operator action.

The store also keeps the journal tally (`backend/ops/throughput.py`) so the
throughput counters survive the journal's pruning.

One writer (`rem up`); readers open it read-only (`mode=ro`) and never write.
Plain `sqlite3` on purpose: callers run it off their event loop in one hop.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.core.errors import DataDirError, NotFound
from backend.store.db import translate_sqlite_error

HISTORY_FILE = "history.db"
SCHEMA_VERSION = 1
DAY_MS = 86_400_000
THIN_AFTER_MS = DAY_MS
THIN_TO_MS = 60_000
PRUNE_CHUNK = 500
# the alerts of the newest snapshot: a new one among the next snapshot's begins an incident
LAST_ALERTS_SQL = "SELECT alerts FROM snapshot ORDER BY time DESC, id DESC LIMIT 1"
INSERT_SNAPSHOT_SQL = "INSERT INTO snapshot (time, reason, last_event_id, alerts, incident, size, data) VALUES (?, ?, ?, ?, ?, ?, ?)"
SAVE_TALLY_SQL = (
    "INSERT INTO meta (key, value) VALUES ('tally', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
# retention: the oldest rows past the cutoff
EXPIRED_SQL = (
    "DELETE FROM snapshot WHERE id IN (SELECT id FROM snapshot WHERE time < :cutoff ORDER BY time LIMIT :n)"
)
# thinning: of the ordinary rows older than the edge, one a step is kept
THIN_SQL = (
    "DELETE FROM snapshot WHERE time < :edge AND reason = 'interval' AND incident = 0 "
    "AND id NOT IN (SELECT min(id) FROM snapshot WHERE time < :edge GROUP BY time / :step)"
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshot (
    id            INTEGER PRIMARY KEY,
    time          INTEGER NOT NULL,
    -- interval, start, or the operator event kind that triggered it (operator.release, ...)
    reason        TEXT NOT NULL,
    last_event_id INTEGER NOT NULL,
    -- alert conditions that held, comma-separated rule names
    alerts        TEXT NOT NULL DEFAULT '',
    incident      INTEGER NOT NULL DEFAULT 0,
    size          INTEGER NOT NULL,
    data          BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS snapshot_time_idx ON snapshot(time);
CREATE INDEX IF NOT EXISTS snapshot_incident_idx ON snapshot(time) WHERE incident = 1;
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class Entry:
    """One recorded snapshot."""

    id: int
    time: int
    reason: str
    last_event_id: int
    alerts: tuple[str, ...]
    incident: bool
    snapshot: dict[str, Any]


def encode(snapshot: dict[str, Any]) -> bytes:
    return zlib.compress(json.dumps(snapshot, separators=(",", ":"), default=str).encode(), 6)


def decode(blob: bytes) -> dict[str, Any]:
    value = json.loads(zlib.decompress(blob))
    return value if isinstance(value, dict) else {}


def history_path(root: Path) -> Path:
    return root / HISTORY_FILE


_ENTRY_COLUMNS = "id, time, reason, last_event_id, alerts, incident, data"


class HistoryStore:
    """`history.db` of one data dir: record (one writer) and read back (any number of readers)."""

    def __init__(self, conn: sqlite3.Connection, path: Path, read_only: bool) -> None:
        self.conn = conn
        self.path = path
        self.read_only = read_only
        self._lock = threading.Lock()  # callers hop threads (asyncio.to_thread); one statement at a time

    @classmethod
    def open(cls, root: Path, *, read_only: bool = False) -> HistoryStore:
        """Open (a writer creates) `history.db`; a reader of a data dir without one gets NotFound."""
        path = history_path(root)
        if read_only and not path.is_file():
            raise NotFound(
                f"no status history at {path}: `rem up` records it (every "
                "REM_HISTORY_INTERVAL_MS, 5 s by default) while it runs"
            )
        try:
            conn = _connect(path, read_only)
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.Error as exc:
            raise translate_sqlite_error(exc, path) or DataDirError(f"{path}: {exc}") from exc
        if version != SCHEMA_VERSION:
            conn.close()
            raise DataDirError(
                f"{path} has history schema {version}, this rem reads {SCHEMA_VERSION}; "
                "move it aside (only the timeline is lost)"
            )
        return cls(conn, path, read_only)

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def _query(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return list(self.conn.execute(sql, params).fetchall())
            except sqlite3.Error as exc:
                raise translate_sqlite_error(exc, self.path) or exc from exc

    # -- writing (rem up) ------------------------------------------------------------
    def record(
        self,
        *,
        time: int,
        reason: str,
        last_event_id: int,
        alerts: list[str],
        snapshot: dict[str, Any],
        tally: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Append one snapshot (and the journal tally) in one transaction; says if an incident began."""
        blob = encode(snapshot)
        with self._lock:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                previous = self.conn.execute(LAST_ALERTS_SQL).fetchone()
                before = set(previous[0].split(",")) - {""} if previous else set()
                incident = bool(set(alerts) - before) or reason.startswith("operator.")
                cursor = self.conn.execute(
                    INSERT_SNAPSHOT_SQL,
                    (time, reason, last_event_id, ",".join(sorted(alerts)), int(incident), len(blob), blob),
                )
                if tally is not None:
                    self.conn.execute(SAVE_TALLY_SQL, (json.dumps(tally, separators=(",", ":")),))
                self.conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise translate_sqlite_error(exc, self.path) or exc from exc
        return {"id": cursor.lastrowid, "size": len(blob), "incident": incident}

    def used_bytes(self) -> int:
        """Bytes of live pages (the file's size less its free list)."""
        pages = self._query("PRAGMA page_count")[0][0] - self._query("PRAGMA freelist_count")[0][0]
        return int(pages) * int(self._query("PRAGMA page_size")[0][0])

    def _delete(self, sql: str, params: dict[str, Any]) -> int:
        with self._lock:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                changed = self.conn.execute(sql, params).rowcount
                self.conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise translate_sqlite_error(exc, self.path) or exc from exc
        return int(changed)

    def prune(self, *, now: int, retention_ms: int, max_bytes: int) -> dict[str, int]:
        """Apply retention, thin rows older than a day to one a minute, then the size bound."""
        expired = self._delete(EXPIRED_SQL, {"cutoff": now - retention_ms, "n": 1_000_000})
        thinned = self._delete(THIN_SQL, {"edge": now - THIN_AFTER_MS, "step": THIN_TO_MS})
        over = 0
        while (excess := self.used_bytes() - max_bytes) > 0:
            # the oldest rows whose compressed sizes add up to the excess (page overhead: loop again)
            oldest = self._query("SELECT time, size FROM snapshot ORDER BY time LIMIT ?", (PRUNE_CHUNK,))
            if not oldest:
                break
            over += self._delete(
                "DELETE FROM snapshot WHERE time <= :cutoff", {"cutoff": _cutoff(oldest, excess)}
            )
        return {"expired": expired, "thinned": thinned, "over_size": over}

    # -- reading (the console, rem console --at) -----------------------------------
    def tally(self) -> dict[str, Any] | None:
        rows = self._query("SELECT value FROM meta WHERE key = 'tally'")
        if not rows:
            return None
        value = json.loads(rows[0][0])
        return value if isinstance(value, dict) else None

    def _entry(self, row: tuple[Any, ...] | None) -> Entry | None:
        if row is None:
            return None
        return Entry(
            id=int(row[0]),
            time=int(row[1]),
            reason=str(row[2]),
            last_event_id=int(row[3]),
            alerts=tuple(a for a in str(row[4]).split(",") if a),
            incident=bool(row[5]),
            snapshot=decode(row[6]),
        )

    def _one(self, sql: str, params: Any = ()) -> Entry | None:
        rows = self._query(sql, params)
        return self._entry(rows[0] if rows else None)

    def at(self, time: int) -> Entry | None:
        """The snapshot in force at `time`: the last one at or before it (else the first after it)."""
        return self._one(
            f"SELECT {_ENTRY_COLUMNS} FROM snapshot WHERE time <= ? ORDER BY time DESC, id DESC LIMIT 1",
            (time,),
        ) or self._one(f"SELECT {_ENTRY_COLUMNS} FROM snapshot ORDER BY time, id LIMIT 1")

    def step(self, time: int, entry_id: int, direction: int) -> Entry | None:
        """The snapshot recorded just after (`direction` > 0) or before the one at (`time`, `entry_id`)."""
        if direction > 0:
            sql = f"SELECT {_ENTRY_COLUMNS} FROM snapshot WHERE (time, id) > (?, ?) ORDER BY time, id LIMIT 1"
        else:
            sql = (
                f"SELECT {_ENTRY_COLUMNS} FROM snapshot WHERE (time, id) < (?, ?) "
                "ORDER BY time DESC, id DESC LIMIT 1"
            )
        return self._one(sql, (time, entry_id))

    def incident(self, time: int, direction: int) -> Entry | None:
        """The next (or previous) snapshot where an incident began."""
        if direction > 0:
            sql = (
                f"SELECT {_ENTRY_COLUMNS} FROM snapshot INDEXED BY snapshot_incident_idx "
                "WHERE incident = 1 AND time > ? ORDER BY time LIMIT 1"
            )
        else:
            sql = (
                f"SELECT {_ENTRY_COLUMNS} FROM snapshot INDEXED BY snapshot_incident_idx "
                "WHERE incident = 1 AND time < ? ORDER BY time DESC LIMIT 1"
            )
        return self._one(sql, (time,))

    def position(self, time: int, entry_id: int) -> tuple[int, int]:
        """(1-based index of the snapshot at (`time`, `entry_id`), how many there are)."""
        index = self._query("SELECT count(*) FROM snapshot WHERE (time, id) <= (?, ?)", (time, entry_id))[0][
            0
        ]
        total = self._query("SELECT count(*) FROM snapshot")[0][0]
        return int(index), int(total)

    def bounds(self) -> dict[str, Any]:
        """First and last recorded times, how many snapshots and incident starts."""
        first, last, count = self._query("SELECT min(time), max(time), count(*) FROM snapshot")[0]
        incidents = self._query(
            "SELECT count(*) FROM snapshot INDEXED BY snapshot_incident_idx WHERE incident = 1"
        )[0][0]
        return {"first": first, "last": last, "count": int(count), "incidents": int(incidents)}


def _cutoff(oldest: list[Any], excess: int) -> int:
    """The time up to which the rows `oldest` (time, size; oldest first) free `excess` bytes (all: the last)."""
    freed = 0
    for time, size in oldest:
        freed += int(size)
        if freed >= excess:
            return int(time)
    return int(oldest[-1][0])


def _connect(path: Path, read_only: bool) -> sqlite3.Connection:
    """A connection to `history.db`: read-only (`mode=ro`), or a writer's, which creates its schema."""
    if read_only:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    else:
        if not path.exists():
            path.touch(mode=0o600)  # private like the rest of the data dir
        conn = sqlite3.connect(str(path), check_same_thread=False)
    conn.isolation_level = None
    conn.execute("PRAGMA busy_timeout = 5000")
    if not read_only:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.executescript(SCHEMA)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return conn
