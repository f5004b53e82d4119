"""The operator journal's head, recorded outside the store, so a shortened or re-made chain shows.

A hash chain finds an edited or removed event in the middle, but not its own
end cut off, and a plain SHA-256 chain can be re-made whole by whoever can
write the store. So `rem up` records, in `journal.head` in the data dir
(private, 0600, replaced atomically), for each store it runs on (state.db,
or the PostgreSQL URL without its password): how many chained operator
events there are, the newest link, its event id and when it was recorded.
It records a new head only after checking that the journal still extends the
recorded one (the recorded link at the recorded position); a journal that
does not is left as evidence, logged, and `rem check` reports it:

* fewer chained events than recorded: the journal was truncated;
* another link at the recorded position: it was re-chained or rewritten.

What this cannot see, said plainly: the data dir's owner (or root) can
rewrite `journal.head` along with the store, and a key file too; events
newer than the last record (appended while no `rem up` runs, or in the
second before it records) can be removed by whoever writes the store, and,
without `REM_JOURNAL_KEY_FILE`, re-chained as well.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from backend.core import clock, private
from backend.core.datadir import DataDir
from backend.store.db import Conn, Database
from backend.store.events import LAST_CHAIN_SQL, journal_key, verify_operator_chain_sync

log = logging.getLogger("rem.journal_head")

FILE_NAME = "journal.head"


@dataclass(frozen=True)
class Head:
    """The recorded end of the chain: `count` chained operator events, the last one's link."""

    count: int
    head: str
    recorded_at: int


def head_file(data: DataDir) -> Path:
    return data.root / FILE_NAME


def read_heads(data: DataDir) -> dict[str, Head]:
    """Every store's recorded head in this data dir (nothing recorded: empty; a damaged file: empty)."""
    try:
        raw = json.loads(head_file(data).read_text(encoding="utf-8"))
        return {store: Head(**entry) for store, entry in raw.get("stores", {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def compare_sync(conn: Conn, recorded: Head | None, key: bytes | None = None) -> str | None:
    """Why the journal does not extend `recorded` (None: it does, or nothing was recorded)."""
    if recorded is None:
        return None
    walk = verify_operator_chain_sync(conn, key, at=recorded.count)
    if walk["broken"] is not None:
        return None  # the chain check names the break itself
    return extends(walk, recorded)


def extends(walk: dict[str, Any], recorded: Head | None) -> str | None:
    """Why a chain walk (`verify_operator_chain_sync`) does not extend `recorded` (None: it does)."""
    if recorded is None:
        return None
    if walk["count"] < recorded.count:
        return (
            f"holds {walk['count']} chained operator events, fewer than the {recorded.count} "
            f"`rem up` recorded at {_when(recorded.recorded_at)}: the newest were removed"
        )
    if walk["link_at"] != recorded.head:
        return (
            f"differs at operator event {recorded.count} from what `rem up` recorded at "
            f"{_when(recorded.recorded_at)}: the journal was re-chained or rewritten"
        )
    return None


def _when(ms: int) -> str:
    import datetime  # import time: only for a journal head that is reported

    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class HeadRecorder:
    """`rem up`'s part: record the head whenever it moves, once the journal is seen to extend it."""

    def __init__(self, data: DataDir, store: str) -> None:
        self.data = data
        self.store = store
        self._last_link: str | None = None
        self._complained: str | None = None

    async def record(self, db: Database) -> Head | None:
        """Record the current head if it moved (one indexed read when it did not); the head recorded."""
        row = await db.fetchone(LAST_CHAIN_SQL)
        link = None if row is None else row[0]
        if link is None or link == self._last_link:
            return None
        recorded = read_heads(self.data).get(self.store)
        key = journal_key()
        result = await db.read_in_thread(lambda conn: _walk(conn, recorded, key))
        problem, walk = result
        if problem is not None:
            if problem != self._complained:
                log.error("operator journal of %s %s; journal.head kept as it was", self.store, problem)
                self._complained = problem
            return None
        head = Head(count=int(walk["count"]), head=str(walk["head"]), recorded_at=clock.now_ms())
        self._write(head)
        self._last_link = head.head
        return head

    def _write(self, head: Head) -> None:
        heads = read_heads(self.data)
        heads[self.store] = head
        body = {"stores": {store: asdict(h) for store, h in sorted(heads.items())}}
        private.write_private_text(head_file(self.data), json.dumps(body, indent=1, sort_keys=True) + "\n")


def _walk(conn: Conn, recorded: Head | None, key: bytes | None) -> tuple[str | None, dict[str, Any]]:
    """(why the journal does not extend `recorded`, or is broken; the walk itself)."""
    walk = verify_operator_chain_sync(conn, key, at=recorded.count if recorded else None)
    if walk["broken"] is not None:
        return f"is broken at event {walk['broken']['event_id']} ({walk['broken']['why']})", walk
    return extends(walk, recorded), walk
