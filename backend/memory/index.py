"""The recall index of raw turns: FTS5 rows in state.db (a tsvector table on PostgreSQL), vectors in Chroma.

Who writes it: Dream (`backend.dream.digester`), per published revision,
under its fenced lease, before it extracts the graph. Dream already claims
each session per revision, re-checks the revision against the raw turns it
reads, and attests exactly what it processed; indexing inside that claim
gives the index the same guarantees for free (SIGKILL at any point: the
lease expires, another Dream redoes the revision; a lost lease writes
nothing; equal input writes nothing twice) and keeps the executor's turn
path and the summarizer untouched. `dream_state.indexed_revision` records
the revision the index covers, so `rem check` (invariant 9) and `rem status`
(index lag) read it directly.

A session's index is planned whole from its raw turns (`plan_session`) and
written by difference: rows whose digest is unchanged are not touched, so a
session that gained one turn costs a few row writes. The order of the steps
makes every crash point safe:

1. `write_rows` / `delete_rows` (state.db, in the caller's fenced
   transactions): memory_turn and its row in the project's FTS5 table
   (`backend.memory.text.fts_table`, created with the project's first turn); a changed row's
   `vector_digest` no longer equals its digest (its vector is pending).
   The vectors of removed turns are deleted from Chroma first (best
   effort: an orphan vector matches no row, so recall drops it).
2. `mark_indexed` (fenced): the lexical index covers the revision.
3. `flush_vectors`, after the claim ends: Chroma upserts of the pending
   vectors (idempotent; a crash repeats them), then `mark_vectors` only
   where the row still has the digest that was embedded. A Chroma outage leaves vectors pending (shown as lag), never
   the lexical index or Dream.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import aiosqlite

from backend.chroma.collection import ChromaStore
from backend.core import clock, faults
from backend.core.errors import ChromaUnreachable
from backend.memory.config import INDEX, IndexConfig
from backend.memory.text import clip, date_words, fts_table, fts_table_ddl, scope_text
from backend.memory.turn_vectors import sketch
from backend.store.db import Conn, Database, execute, executemany, fetchall, on_postgres
from backend.store.revision import load_raw_turns

# speakers and project of one session's raw turns (the revision's records do not carry them)
SPEAKERS_SQL = """
SELECT id, json_extract(data, '$.speaker') AS speaker FROM session_message
WHERE session_id = ? AND type IN ('user', 'assistant') AND json_extract(data, '$.speaker') IS NOT NULL
"""
EXISTING_SQL = "SELECT id, message_id, digest, vector_digest FROM memory_turn WHERE session_id = ?"
INSERT_TURN = """
INSERT INTO memory_turn (message_id, session_id, project, ord, role, speaker, time, digest,
    vector_digest, revision, time_indexed)
VALUES (:message_id, :session_id, :project, :ord, :role, :speaker, :time, :digest, NULL, :revision, :now)
ON CONFLICT (message_id) DO UPDATE SET session_id = excluded.session_id, project = excluded.project,
    ord = excluded.ord, role = excluded.role, speaker = excluded.speaker, time = excluded.time,
    digest = excluded.digest, vector_digest = NULL, revision = excluded.revision,
    time_indexed = excluded.time_indexed
RETURNING id
"""


@dataclass(frozen=True)
class IndexedTurn:
    """Everything the index holds for one raw turn."""

    message_id: str
    session_id: str
    project: str
    ord: int
    role: str
    speaker: str
    time: int
    text: str
    body: str
    ctx: str
    scope: str
    dense_text: str
    digest: str

    def chroma_metadata(self) -> dict[str, Any]:
        return {
            "project": self.project,
            "sessionId": self.session_id,
            "role": self.role,
            "speaker": self.speaker,
            "time": self.time,
            "ord": self.ord,
            "digest": self.digest,
        }


@dataclass
class Existing:
    row_id: int
    digest: str
    vector_digest: str | None


def speaker_of(record: Mapping[str, Any], speakers: Mapping[str, str]) -> str:
    """Who said a turn: the speaker recorded with the message, else its role."""
    return speakers.get(record["id"]) or str(record["role"])


def plan_session(
    session_id: str,
    project: str,
    turns: Sequence[Mapping[str, Any]],
    speakers: Mapping[str, str],
    config: IndexConfig = INDEX,
) -> list[IndexedTurn]:
    """The index rows of a session's raw turns (canonical records in canonical order)."""
    texts = [str(t.get("text") or "") for t in turns]
    names = [speaker_of(t, speakers) for t in turns]
    scope = scope_text(project, session_id)
    rows = []
    for i, turn in enumerate(turns):
        when = f"[{date_words(int(turn['time']))}] " if config.date_in_text else ""
        said = _resolved_days(texts[i], int(turn["time"])) if config.date_in_text else ""
        ctx = " ".join(clip(texts[j], config.neighbour_chars) for j in range(max(0, i - config.ctx_turns), i))
        dense = f"{when}{names[i]}: {texts[i]}"
        prev = range(max(0, i - config.dense_prev_turns), i)
        if config.dense_prev_turns and i > 0:
            dense += " || " + " ".join(f"{names[j]}: {clip(texts[j], config.neighbour_chars)}" for j in prev)
        fields = [project, i, turn["role"], names[i], int(turn["time"]), when + texts[i] + said, ctx, dense]
        digest = hashlib.sha256(
            json.dumps([config.key(), *fields], ensure_ascii=False).encode("utf-8", "surrogatepass")
        ).hexdigest()[:32]
        rows.append(
            IndexedTurn(
                message_id=str(turn["id"]),
                session_id=session_id,
                project=project,
                ord=i,
                role=str(turn["role"]),
                speaker=names[i],
                time=int(turn["time"]),
                text=texts[i],
                body=when + texts[i] + said,
                ctx=ctx,
                scope=scope,
                dense_text=dense,
                digest=digest,
            )
        )
    return rows


def _resolved_days(text: str, when_ms: int) -> str:
    """' (yesterday: 7 May 2023)' for each time expression of a turn, resolved against its time: the
    FTS5 body holds the days it names, so a question that names the day finds the turn."""
    # `rem status` imports this module for the index lag; the date grammar costs ~10 ms to compile
    from backend.memory import dates  # import time: only Dream's indexing needs the date grammar

    return "".join(f" ({span.phrase}: {span.words()})" for span in dates.resolve(text, when_ms))


async def load_session_meta(conn: aiosqlite.Connection, session_id: str) -> tuple[str, dict[str, str]]:
    """The session's project and the speakers recorded on its messages."""
    rows = await fetchall(conn, "SELECT project FROM session WHERE id = ?", (session_id,))
    project = str(rows[0][0]) if rows else "default"
    speakers = {r[0]: str(r[1]) for r in await fetchall(conn, SPEAKERS_SQL, (session_id,))}
    return project, speakers


async def load_existing(conn: aiosqlite.Connection, session_id: str) -> dict[str, Existing]:
    """What the index holds for a session now, by message id."""
    return {
        r["message_id"]: Existing(int(r["id"]), r["digest"], r["vector_digest"])
        for r in await fetchall(conn, EXISTING_SQL, (session_id,))
    }


@dataclass
class Diff:
    """How a session's index must change to equal its plan."""

    write: list[IndexedTurn]
    remove: list[str]
    # rows of the plan whose vector is not (yet) the one for their digest
    vectors: list[IndexedTurn]


def diff(plan: Sequence[IndexedTurn], existing: Mapping[str, Existing]) -> Diff:
    """The rows to (re)write, the message ids to remove, the vectors to write."""
    planned = {row.message_id for row in plan}
    write = [r for r in plan if r.message_id not in existing or existing[r.message_id].digest != r.digest]
    changed = {r.message_id for r in write}
    vectors = [r for r in plan if r.message_id in changed or existing[r.message_id].vector_digest != r.digest]
    remove = sorted(m for m in existing if m not in planned)
    return Diff(write, remove, vectors)


# PostgreSQL's twin of a project's FTS5 row (schema_pg.LEXICAL): the text, its context and
# the scope tokens as one weighted tsvector; `english` stems as FTS5's porter tokenizer does
INSERT_FTS_PG = """
INSERT INTO memory_fts (id, project, doc)
VALUES (:id, :project, setweight(to_tsvector('english', :body), 'A')
    || setweight(to_tsvector('english', :ctx), 'B') || setweight(to_tsvector('simple', :scope), 'D'))
ON CONFLICT (id) DO UPDATE SET project = excluded.project, doc = excluded.doc
"""


async def write_rows(
    conn: aiosqlite.Connection, rows: Sequence[IndexedTurn], revision: str, now: int
) -> None:
    """Insert or rewrite index rows and their lexical rows (caller's transaction).

    state.db: a row in the project's FTS5 table. PostgreSQL: a `memory_fts` row.
    """
    postgres = on_postgres(conn)
    created: set[str] = set()
    for row in rows:
        table = fts_table(row.project)
        if not postgres and table not in created:
            await execute(conn, fts_table_ddl(table))
            created.add(table)
        cursor = await conn.execute(
            INSERT_TURN,
            {
                "message_id": row.message_id,
                "session_id": row.session_id,
                "project": row.project,
                "ord": row.ord,
                "role": row.role,
                "speaker": row.speaker,
                "time": row.time,
                "digest": row.digest,
                "revision": revision,
                "now": now,
            },
        )
        row_id = (await cursor.fetchone())[0]  # type: ignore[index]
        await cursor.close()
        if postgres:
            await execute(
                conn,
                INSERT_FTS_PG,
                {"id": row_id, "project": row.project, "body": row.body, "ctx": row.ctx, "scope": row.scope},
            )
            continue
        await execute(conn, f"DELETE FROM {table} WHERE rowid = ?", (row_id,))
        await execute(
            conn,
            f"INSERT INTO {table} (rowid, body, ctx, scope) VALUES (?, ?, ?, ?)",
            (row_id, row.body, row.ctx, row.scope),
        )


async def delete_rows(conn: aiosqlite.Connection, message_ids: Sequence[str]) -> None:
    """Remove index rows and their FTS5 rows (a project's table holds only that project's turns).

    PostgreSQL: `memory_fts` rows go with their memory_turn row (ON DELETE CASCADE).
    """
    for message_id in message_ids if not on_postgres(conn) else ():
        for row_id, project in await fetchall(
            conn, "SELECT id, project FROM memory_turn WHERE message_id = ?", (message_id,)
        ):
            table = fts_table(str(project))
            await execute(conn, fts_table_ddl(table))
            await execute(conn, f"DELETE FROM {table} WHERE rowid = ?", (row_id,))
    await executemany(conn, "DELETE FROM memory_turn WHERE message_id = ?", [(m,) for m in message_ids])


async def mark_vectors(
    conn: aiosqlite.Connection, rows: Sequence[IndexedTurn], sketches: Sequence[str | None] | None = None
) -> None:
    """Record that these rows' vectors (for their current digest) are in Chroma, with the record
    of each row written (`turn_vectors.sketch`), which `rem check` and Dream's sweep compare."""
    records = sketches if sketches is not None else [None] * len(rows)
    await executemany(
        conn,
        "UPDATE memory_turn SET vector_digest = ?, vector_sketch = ? WHERE message_id = ? AND digest = ?",
        [(r.digest, sketch, r.message_id, r.digest) for r, sketch in zip(rows, records, strict=True)],
    )


async def mark_indexed(conn: aiosqlite.Connection, session_id: str, revision: str, now: int) -> None:
    """Record that the index covers `revision` of the session (invariant 9)."""
    await execute(
        conn,
        "UPDATE dream_state SET indexed_revision = ?, time_indexed = ? WHERE session_id = ?",
        (revision, now, session_id),
    )


# -- lag, for `rem status` and the console -------------------------------------------

# the oldest published revision not indexed yet: the first entry of the partial index (a seek);
# how many there are, and the turns whose vector is pending, are `status_count` counters
# (`index_behind`, `vectors_pending`: backend/store/counters.py), not counts of the index
INDEX_LAG_SQL = """
SELECT min(time_published) FROM dream_state INDEXED BY dream_state_index_lag_idx
WHERE input_revision IS NOT NULL AND indexed_revision IS NOT input_revision
"""
# the turns ever indexed, roughly: the newest turn's id (a seek of the primary key, not a count)
TURNS_INDEXED_SQL = "SELECT max(id) FROM memory_turn"


class IndexLag(TypedDict):
    """How far the recall index is behind (`rem status`, the console's Backlog)."""

    sessions_behind: int  # published revisions not indexed yet
    oldest_ms: int  # age of the oldest of them
    vectors_pending: int  # turns whose vector is not in Chroma yet
    turns_indexed_approx: int  # rows ever indexed (max id: O(1), not a count)


def index_lag_sync(conn: Conn, now: int, sessions_behind: int, vectors_pending: int) -> IndexLag:
    """The lag, given the counters of sessions behind and vectors pending: two seeks, at any size."""
    oldest = conn.execute(INDEX_LAG_SQL).fetchone()[0]
    turns = conn.execute(TURNS_INDEXED_SQL).fetchone()[0] or 0
    return IndexLag(
        sessions_behind=sessions_behind,
        oldest_ms=max(0, now - int(oldest)) if oldest else 0,
        vectors_pending=vectors_pending,
        turns_indexed_approx=int(turns),
    )


# -- one session, end to end (Dream calls this under its claim) ----------------------

Fence = Callable[[aiosqlite.Connection], Awaitable[None]]
# the turn collection of a project (`Context.turn_store`)
TurnStores = Callable[[str], ChromaStore]
VECTOR_BATCH = 256


async def index_session(
    db: Database,
    turn_stores: TurnStores,
    session_id: str,
    revision: str,
    turns: Sequence[Mapping[str, Any]],
    fence: Fence,
    chunk_rows: int = 500,
) -> dict[str, int]:
    """Make the FTS5 side equal the plan of `turns` and record `revision` as indexed.

    `fence(conn)` runs first in each write transaction and raises `LeaseLost`
    when the caller's lease is gone, which stops the indexing with nothing
    more written. Vectors are left pending for `flush_vectors`, so a Chroma
    outage never holds the lexical index (or Dream) back.
    """
    async with db.snapshot() as conn:
        project, speakers = await load_session_meta(conn, session_id)
        existing = await load_existing(conn, session_id)
    change = diff(plan_session(session_id, project, turns, speakers), existing)
    for start in range(0, len(change.write), chunk_rows):
        async with db.tx() as conn:
            await fence(conn)
            await write_rows(conn, change.write[start : start + chunk_rows], revision, clock.now_ms())
        faults.point("index.mid_rows")
    if change.remove:
        try:
            await turn_stores(project).delete(change.remove)
        except ChromaUnreachable:
            pass  # an orphan vector matches no memory_turn row, so recall never shows it
        async with db.tx() as conn:
            await fence(conn)
            await delete_rows(conn, change.remove)
    async with db.tx() as conn:
        await fence(conn)
        await mark_indexed(conn, session_id, revision, clock.now_ms())
    return {"written": len(change.write), "removed": len(change.remove), "vectors": len(change.vectors)}


# -- vectors: written after the FTS5 side, by whoever flushes first --------------------

# sessions with pending vectors that no Dream is digesting right now (a digestion
# rewrites the rows; the flush after it picks them up)
PENDING_VECTOR_SESSIONS_SQL = """
SELECT p.session_id FROM (
    SELECT DISTINCT session_id FROM memory_turn INDEXED BY memory_turn_vector_pending_idx
    WHERE vector_digest IS NOT digest) AS p
LEFT JOIN dream_state AS d ON d.session_id = p.session_id
WHERE d.lease_expires_at IS NULL OR d.lease_expires_at <= :now
LIMIT :n
"""


async def flush_vectors(db: Database, turn_stores: TurnStores, sessions: int = 8) -> int:
    """Write pending turn vectors to Chroma for up to `sessions` sessions; returns vectors written.

    No lease is needed: an upsert is idempotent and a row is marked only while
    it still has the digest that was embedded (`mark_vectors`), so two
    flushers, or a flush racing a re-index, never mark a stale vector current;
    the vector also carries its digest, and recall ignores a vector whose
    digest is not its row's. Raises ChromaUnreachable when Chroma is down
    (the caller backs off); the rows stay pending.
    """
    written = 0
    rows = await db.fetchall(PENDING_VECTOR_SESSIONS_SQL, {"now": clock.now_ms(), "n": sessions})
    for (session_id,) in rows:
        written += await _write_pending_vectors(db, turn_stores, session_id)
    return written


async def _write_pending_vectors(db: Database, turn_stores: TurnStores, session_id: str) -> int:
    async with db.snapshot() as conn:
        project, speakers = await load_session_meta(conn, session_id)
        existing = await load_existing(conn, session_id)
        turns = await load_raw_turns(conn, session_id)
    # only rows whose stored digest is what the turns give now: a row the raw turns
    # moved past is rewritten by the next digestion, and flushed after it
    pending = [
        r
        for r in plan_session(session_id, project, turns, speakers)
        if r.message_id in existing
        and existing[r.message_id].digest == r.digest
        and existing[r.message_id].vector_digest != r.digest
    ]
    store = turn_stores(project)
    for start in range(0, len(pending), VECTOR_BATCH):
        await _write_vector_batch(db, store, pending[start : start + VECTOR_BATCH])
    return len(pending)


async def _write_vector_batch(db: Database, store: ChromaStore, batch: list[IndexedTurn]) -> None:
    """Embed and upsert one batch of turns into Chroma, then mark their vectors written in state.db."""
    vectors = await store.embed([r.dense_text for r in batch])
    await store.upsert(
        [r.message_id for r in batch],
        [r.text for r in batch],
        [r.chroma_metadata() for r in batch],
        embeddings=vectors,
    )
    faults.point("index.after_vectors")
    async with db.tx() as conn:
        await mark_vectors(conn, batch, [sketch(r.text, v) for r, v in zip(batch, vectors, strict=True)])
        await unmark_overwritten(conn, batch)


async def unmark_overwritten(conn: aiosqlite.Connection, rows: Sequence[IndexedTurn]) -> None:
    """Rows re-indexed since this flush embedded them: what it just upserted is older than their
    digest, and may have overwritten a newer vector another flusher wrote and marked. They go back
    to pending (`rem check`: not written yet, not a changed row), and the next flush writes them."""
    await executemany(
        conn,
        "UPDATE memory_turn SET vector_digest = NULL, vector_sketch = NULL "
        "WHERE message_id = ? AND digest != ? AND vector_digest IS NOT NULL",
        [(r.message_id, r.digest) for r in rows],
    )
