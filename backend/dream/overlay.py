"""The Chroma overlay: Dream's lifecycle keys on the shared summary row, made eventually consistent.

state.db is the system of record. Every Dream transition that changes what
the overlay says (attest, defer, undigestible) sets `dream_state.overlay_pending
= 1` in its own transaction. A flush writes each pending row's *current*
state with Chroma `update` (which merges, never creates a row, and deletes a
key given `None`), reads the rows back, and clears the flag only where the
Dream-owned keys came back deep- and type-equal and `state_revision` has not
moved since the read; otherwise the row stays pending and is rewritten on a
later pass. A row that is missing (synthesis has not written it, or Chroma
lost it) is retried every `OVERLAY_MISSING_RETRY_MS`: Dream never creates
it, because the document belongs to synthesis. Synthesis-owned keys are
never named, so `update` cannot touch them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from backend.chroma.ownership import DREAM_OWNED_KEYS, summary_row_id
from backend.core import clock
from backend.runtime.context import Context
from backend.store.db import Database, execute
from backend.store.events import EventKind, append_event

OVERLAY_MISSING_RETRY_MS = 60_000


class OverlayOutcome(StrEnum):
    """What the read-back found after writing one session's overlay."""

    CONFIRMED = "confirmed"  # every Dream-owned key reads back as written
    DIFFERS = "differs"  # a key reads back otherwise (a concurrent writer): retried
    MISSING = "missing"  # no summary row to overlay: retried after OVERLAY_MISSING_RETRY_MS


OVERLAY_BATCH = 100

OVERLAY_SQL = """
SELECT session_id, input_revision, completed_revision, state_revision, digest_state,
       digest_attempts, defer_reason, overlay_retry_at
FROM dream_state INDEXED BY dream_state_overlay_idx
WHERE overlay_pending = 1 AND overlay_retry_at <= :now
ORDER BY overlay_retry_at, session_id LIMIT :limit
"""


def overlay_metadata(row: Mapping[str, Any]) -> dict[str, Any]:
    """The Dream-owned keys for one dream_state row (`None` deletes a key in Chroma)."""
    completed, published = row["completed_revision"], row["input_revision"]
    state = row["digest_state"]
    metadata = {
        "graphDigested": completed is not None and completed == published,
        # a claim in flight is still pending to a reader of the row
        "digestState": "pending" if state == "in_progress" else state,
        "digestAttempts": int(row["digest_attempts"]),
        "deferReason": row["defer_reason"],
        "dreamCompletedRevision": completed,
        "dreamStateRevision": int(row["state_revision"]),
    }
    assert set(metadata) == set(DREAM_OWNED_KEYS)
    return metadata


async def write_overlays(ctx: Context, rows: Sequence[Mapping[str, Any]]) -> dict[str, OverlayOutcome]:
    """Update the rows' Dream-owned keys and read them back: session -> confirmed/missing/differs."""
    store = ctx.store()
    ids = [summary_row_id(r["session_id"]) for r in rows]
    wanted = [overlay_metadata(r) for r in rows]
    # update never creates a row (Chroma ignores unknown ids), so a missing row stays missing
    await store.update_metadata(ids, wanted)
    back = await store.get(ids)
    outcome: dict[str, OverlayOutcome] = {}
    for row, row_id, meta in zip(rows, ids, wanted, strict=True):
        if row_id not in back:
            outcome[row["session_id"]] = OverlayOutcome.MISSING
            continue
        stored = back[row_id].metadata
        same = all(_same_value(stored.get(k), v) for k, v in meta.items())
        outcome[row["session_id"]] = OverlayOutcome.CONFIRMED if same else OverlayOutcome.DIFFERS
    return outcome


def _same_value(stored: Any, wanted: Any) -> bool:
    return stored == wanted and type(stored) is type(wanted)


async def settle_overlays(
    db: Database, rows: Sequence[Mapping[str, Any]], outcome: Mapping[str, OverlayOutcome], actor: str
) -> None:
    """Clear the flag where the written state is still current; back off missing rows."""
    now = clock.now_ms()
    async with db.tx() as conn:
        for row in rows:
            sid, result = row["session_id"], outcome.get(row["session_id"])
            if result == OverlayOutcome.CONFIRMED:
                # a state that moved on since the read (or a concurrent writer) keeps it pending
                await execute(
                    conn,
                    "UPDATE dream_state SET overlay_pending = CASE WHEN state_revision = ? "
                    "THEN 0 ELSE 1 END, overlay_retry_at = 0 WHERE session_id = ?",
                    (row["state_revision"], sid),
                )
            elif result == OverlayOutcome.MISSING:
                await execute(
                    conn,
                    "UPDATE dream_state SET overlay_retry_at = ? "
                    "WHERE session_id = ? AND overlay_pending = 1",
                    (now + OVERLAY_MISSING_RETRY_MS, sid),
                )
                if not row["overlay_retry_at"]:
                    await append_event(
                        conn,
                        kind=EventKind.DREAM_OVERLAY_MISSING,
                        actor=actor,
                        session_id=sid,
                        target=summary_row_id(sid),
                        data={"retry_in_ms": OVERLAY_MISSING_RETRY_MS},
                        now=now,
                    )


async def overlay_pending_count(db: Database) -> int:
    """Sessions whose Chroma overlay lags state.db."""
    return int(await db.scalar("SELECT count(*) FROM dream_state WHERE overlay_pending = 1"))


async def request_overlay_resync(db: Database, session_ids: Sequence[str] | None = None) -> int:
    """Queue overlays for rewriting (e.g. after Chroma lost rows); returns rows queued."""
    where = "completed_revision IS NOT NULL OR digest_state IN ('deferred', 'undigestible')"
    async with db.tx() as conn:
        if session_ids is None:
            return await execute(
                conn, f"UPDATE dream_state SET overlay_pending = 1, overlay_retry_at = 0 WHERE {where}"
            )
        total = 0
        for sid in session_ids:
            total += await execute(
                conn,
                "UPDATE dream_state SET overlay_pending = 1, overlay_retry_at = 0 "
                f"WHERE session_id = ? AND ({where})",
                (sid,),
            )
        return total
