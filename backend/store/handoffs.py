"""The hand-offs between the three daemons, each written inside the producer's transaction.

* The executor calls `mark_turns_changed` whenever a raw turn lands (a user
  message promoted, an assistant reply completed or superseded): it bumps
  `summary_job.dirty_seq`, the summarizer's drift queue.
* The summarizer calls `publish_input_revision` when it makes a synthesis
  durable: it records the Dream input revision the summary was made from,
  which is what makes the session pending for Dream.
"""

from __future__ import annotations

import aiosqlite

from backend.store.db import Conn, engine_of, execute, execute_unread, in_thread

# Already drifted: count the change, keep `time_updated` = when it first drifted.
# The summarizer takes the oldest drift first, so a session that keeps talking
# is not pushed to the back of the queue by every turn; and an UPDATE that
# leaves `time_updated` out of its SET touches neither index on it (one page
# written instead of three, twice per turn on the executor's hot path).
BUMP_DRIFTED_SQL = (
    "UPDATE summary_job SET dirty_seq = dirty_seq + 1 WHERE session_id = ? AND dirty_seq > clean_seq"
)
MARK_TURNS_CHANGED_SQL = (
    "INSERT INTO summary_job (session_id, status, dirty_seq, time_created, time_updated) "
    "VALUES (?, 'pending', 1, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET dirty_seq = summary_job.dirty_seq + 1, "
    "time_updated = excluded.time_updated"
)


# PostgreSQL: the same in one statement whose result nobody reads, so it rides with the
# turn's next statement (no round trip of its own). Not on SQLite: naming `time_updated` in
# SET rewrites its index entries even when the value stays, and SQLite has no round trip to save.
MARK_TURNS_CHANGED_ONE_SQL = (
    "INSERT INTO summary_job (session_id, status, dirty_seq, time_created, time_updated) "
    "VALUES (?, 'pending', 1, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET dirty_seq = summary_job.dirty_seq + 1, "
    "time_updated = CASE WHEN summary_job.dirty_seq > summary_job.clean_seq "
    "THEN summary_job.time_updated ELSE excluded.time_updated END"
)


def mark_turns_changed_sync(conn: Conn, session_id: str, now: int) -> None:
    """Queue the session for the summarizer (idempotent per change, never loses one).

    For code running on the connection's thread (`Database.write_in_thread`).
    """
    if engine_of(conn) == "postgresql":
        execute_unread(conn, MARK_TURNS_CHANGED_ONE_SQL, (session_id, now, now))
        return
    if conn.execute(BUMP_DRIFTED_SQL, (session_id,)).rowcount == 0:
        conn.execute(MARK_TURNS_CHANGED_SQL, (session_id, now, now))


async def mark_turns_changed(conn: aiosqlite.Connection, session_id: str, now: int) -> None:
    """`mark_turns_changed_sync` inside an open aiosqlite transaction, in one thread hop."""
    await in_thread(conn, mark_turns_changed_sync, session_id, now)


DREAM_STATE_ROW_SQL = (
    "INSERT INTO dream_state (session_id, time_updated) VALUES (?, ?) ON CONFLICT (session_id) DO NOTHING"
)
PUBLISH_REVISION_SQL = (
    "UPDATE dream_state SET input_revision = :rev, time_published = :now, time_updated = :now, "
    "state_revision = state_revision + 1, "
    # a live Dream claim keeps 'in_progress' so its lease stays visible; Dream's own
    # attest/release sets the state from the revisions when the claim ends
    "digest_state = CASE WHEN digest_state = 'in_progress' THEN 'in_progress' "
    "WHEN completed_revision IS :rev THEN 'digested' ELSE 'pending' END, "
    "digest_attempts = 0, attempts_revision = NULL, defer_reason = NULL, next_attempt_at = 0 "
    "WHERE session_id = :sid AND input_revision IS NOT :rev"
)


async def publish_input_revision(
    conn: aiosqlite.Connection, session_id: str, revision: str, now: int
) -> bool:
    """Record the published Dream input revision; True when it changed.

    Publishing the revision already published is a no-op, so a replayed or
    repeated synthesis never re-opens a digested session. A new revision
    resets the per-revision attempt budget and makes the session pending
    (unless Dream already completed exactly this revision).
    """
    await execute(conn, DREAM_STATE_ROW_SQL, (session_id, now))
    changed = await execute(conn, PUBLISH_REVISION_SQL, {"rev": revision, "now": now, "sid": session_id})
    return changed > 0
