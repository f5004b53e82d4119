"""Legacy Dream rows: sessions Dream digested before revisions existed, and when that path retires.

`import_legacy` marks sessions whose Chroma row carries only the old
`graphDigested`/`digestState` flags (no revision) as `digest_state =
'legacy'`; they are honoured as digested until synthesis publishes a revision
for them, which makes them pending like any other. Retirement condition
(`legacy_retirement`): zero legacy-only rows and no legacy event for one full
`LEGACY_RETIREMENT_WINDOW_MS` (the journal's retention window); then
`import_legacy` and the `legacy` state can be deleted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from backend.chroma.ownership import session_id_of
from backend.core import clock
from backend.dream.drift import DigestState
from backend.runtime.context import Context
from backend.store.db import Database, execute, fetchone
from backend.store.events import EventKind, append_event
from backend.store.handoffs import DREAM_STATE_ROW_SQL

# the journal's retention window; legacy retires after one full window with zero legacy rows
LEGACY_RETIREMENT_WINDOW_MS = 30 * 24 * 3600 * 1000
# the literal kinds match event_legacy_idx's WHERE, so this reads that small index
LAST_LEGACY_EVENT_SQL = (
    f"SELECT max(time) FROM event WHERE kind IN ('{EventKind.DREAM_LEGACY_IMPORTED}', "
    f"'{EventKind.DREAM_LEGACY_SUPERSEDED}')"
)


async def legacy_only_count(db: Database) -> int:
    """Sessions honoured as digested only by the legacy `graphDigested` flag."""
    return int(await db.scalar("SELECT count(*) FROM dream_state WHERE digest_state = 'legacy'"))


async def legacy_retirement(db: Database, now: int | None = None) -> dict[str, Any]:
    """Whether the legacy path may be deleted: zero legacy rows for one full retention window."""
    now = clock.now_ms() if now is None else now
    count = await legacy_only_count(db)
    last = await db.scalar(LAST_LEGACY_EVENT_SQL)
    quiet_since = None if count else last
    retired = count == 0 and (last is None or now - int(last) >= LEGACY_RETIREMENT_WINDOW_MS)
    return {
        "legacy_only": count,
        "last_legacy_event_at": last,
        "quiet_since": quiet_since,
        "window_ms": LEGACY_RETIREMENT_WINDOW_MS,
        "retired": retired,
        "condition": "zero legacy-only rows and no legacy event for one full retention window",
    }


def is_legacy_only(metadata: Mapping[str, Any]) -> bool:
    """A Chroma row Dream digested before revisions existed: a digested flag, no revision."""
    flagged = metadata.get("graphDigested") is True or metadata.get("digestState") == DigestState.DIGESTED
    return flagged and metadata.get("dreamCompletedRevision") is None


async def import_legacy(ctx: Context, *, actor: str = "dream", page: int = 500) -> dict[str, int]:
    """Mark sessions whose Chroma row is legacy-only as `legacy` (honoured until a revision is published)."""
    db = await ctx.db()
    store = ctx.store()
    ids = [i for i in await store.all_ids() if session_id_of(i)]
    marked = scanned = 0
    for start in range(0, len(ids), page):
        rows = await store.get(ids[start : start + page])
        legacy = [session_id_of(i) for i, row in rows.items() if is_legacy_only(row.metadata)]
        scanned += len(rows)
        marked += await _mark_legacy(db, [s for s in legacy if s])
    if marked:
        async with db.tx() as conn:
            await append_event(
                conn,
                kind=EventKind.DREAM_LEGACY_IMPORTED,
                actor=actor,
                data={"scanned": scanned, "marked": marked},
            )
    return {"scanned": scanned, "marked": marked}


# only rows synthesis never published a revision for: a revision always wins
MARK_LEGACY_SQL = (
    "UPDATE dream_state SET digest_state = 'legacy', legacy_digested = 1, "
    "time_updated = ? WHERE session_id = ? AND input_revision IS NULL "
    "AND completed_revision IS NULL AND digest_state != 'legacy'"
)


async def _mark_legacy(db: Database, session_ids: Sequence[str]) -> int:
    now = clock.now_ms()
    marked = 0
    async with db.tx() as conn:
        for sid in session_ids:
            if await fetchone(conn, "SELECT 1 FROM session WHERE id = ?", (sid,)) is None:
                continue  # a summary row for a session state.db does not know: nothing to honour
            await execute(conn, DREAM_STATE_ROW_SQL, (sid, now))
            marked += await execute(conn, MARK_LEGACY_SQL, (now, sid))
    return marked
