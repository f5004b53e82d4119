"""The turn index family (invariant 9): every raw turn up to a session's current revision is in the
recall index, its FTS5 row beside it, and its vector in Chroma as written."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from backend.memory.text import FTS_TABLES_SQL, fts_table
from backend.ops.checks.family import Family
from backend.ops.checks.report import Report, rows_sync
from backend.store.db import Conn, engine_of
from backend.store.revision import compute_revision, turn_record

TURN_ROWS_CHANGED = "turn rows whose document, vector or digest in Chroma differs from what was written"


# -- invariant 9: every raw turn up to a session's current revision is in the recall index --
# (one batch of sessions at a time, like the other per-session invariants: each read holds
# a batch's raw turns, Dream rows and index rows, never the whole index)
SQL_RAW_TURNS = """
SELECT session_id, id, type, time_created, data FROM session_message
WHERE session_id > :lo AND session_id <= :hi AND type IN ('user', 'assistant') ORDER BY session_id
"""
SQL_INDEX_ROWS = """
SELECT id, project, session_id, message_id, digest, vector_digest FROM memory_turn
WHERE session_id > :lo AND session_id <= :hi
"""
SQL_PUBLISHED = """
SELECT session_id, input_revision, indexed_revision FROM dream_state WHERE session_id > :lo AND session_id <= :hi
"""


# the rowids of a project's FTS5 table among a JSON list of them
FTS_ROWIDS_IN_SQL = "SELECT rowid FROM {table} WHERE rowid IN (SELECT value FROM json_each(?))"


def _pg_fts_rowids_sync(conn: Conn, ids_by_project: Mapping[str, set[int]]) -> set[tuple[str, int]]:
    """`_fts_rowids_sync` on PostgreSQL: one `memory_fts` for every project."""
    wanted = sorted(set().union(*ids_by_project.values())) if ids_by_project else []
    if not wanted:
        return set()
    if wanted[-1] - wanted[0] < 4 * len(wanted):  # close together: one range of ids
        found = conn.execute(
            "SELECT project, id FROM memory_fts WHERE id BETWEEN ? AND ?", (wanted[0], wanted[-1])
        )
    else:
        found = conn.execute("SELECT project, id FROM memory_fts WHERE id = ANY(?)", (wanted,))
    return {(r[0], r[1]) for r in found if r[1] in ids_by_project.get(r[0], ())}


def _fts_rowids_sync(conn: Conn, ids_by_project: Mapping[str, set[int]]) -> set[tuple[str, int]]:
    """(project, rowid) of the given index rows that have their row in the project's FTS5 table.

    PostgreSQL: their `memory_fts` row, under the same project.
    """
    if engine_of(conn) == "postgresql":
        return _pg_fts_rowids_sync(conn, ids_by_project)
    tables = {r[0] for r in conn.execute(FTS_TABLES_SQL)}
    held: set[tuple[str, int]] = set()
    for project, ids in sorted(ids_by_project.items()):
        table = fts_table(project)
        if table not in tables or not ids:
            continue  # a missing table holds none
        lo, hi = min(ids), max(ids)
        if hi - lo < 4 * len(ids):  # the batch's rows are close together: one range of rowids
            found = conn.execute(f"SELECT rowid FROM {table} WHERE rowid BETWEEN ? AND ?", (lo, hi))
        else:  # spread out: one rowid lookup each
            found = conn.execute(FTS_ROWIDS_IN_SQL.format(table=table), (json.dumps(sorted(ids)),))
        held.update((project, r[0]) for r in found if r[0] in ids)
    return held


def _raw_turns_by_session(conn: Conn, lo: str, hi: str) -> dict[str, list[dict[str, Any]]]:
    """Each session's raw turn records (the ones its revision covers), for sessions `lo` < id <= `hi`."""
    records: dict[str, list[dict[str, Any]]] = {}
    for sid, mid, kind, created, data in conn.execute(SQL_RAW_TURNS, {"lo": lo, "hi": hi}):
        parsed = json.loads(data)
        record = turn_record(mid, kind, created, parsed if isinstance(parsed, dict) else {})
        if record is not None:
            records.setdefault(sid, []).append(record)
    return records


def check_recall_index_sync(conn: Conn, report: Report, lo: str, hi: str) -> None:
    """Invariant 9, on state.db, for sessions `lo` < id <= `hi`: the FTS5 side covers each
    session's indexed revision exactly (rows merged into the report's findings)."""
    report.mark("recall_index")
    bounds = {"lo": lo, "hi": hi}
    raw = _raw_turns_by_session(conn, lo, hi)
    published = {r[0]: (r[1], r[2]) for r in conn.execute(SQL_PUBLISHED, bounds)}
    rows: dict[str, list[dict[str, Any]]] = {}
    no_fts, vectors_pending = [], []
    index_rows = rows_sync(conn, SQL_INDEX_ROWS, bounds)
    ids_by_project: dict[str, set[int]] = {}
    for r in index_rows:
        ids_by_project.setdefault(r["project"], set()).add(r["id"])
    fts_rows = _fts_rowids_sync(conn, ids_by_project)
    for r in index_rows:
        rows.setdefault(r["session_id"], []).append(r)
        if (r["project"], r["id"]) not in fts_rows:
            no_fts.append({"session_id": r["session_id"], "message_id": r["message_id"]})
        if r["vector_digest"] != r["digest"]:
            vectors_pending.append({"session_id": r["session_id"], "message_id": r["message_id"]})
    missing, extra, behind = [], [], []
    for sid, records in raw.items():
        current, indexed = published.get(sid, (None, None))
        if current is not None and indexed != current:
            behind.append({"session_id": sid, "published": current, "indexed": indexed})
        # never indexed: nothing to compare (and no revision to hash)
        if indexed is None or indexed != compute_revision(records):
            continue  # the raw turns moved on (or were never published): coverage is checked at the revision
        turn_ids = {r["id"] for r in records}
        held = {r["message_id"] for r in rows.get(sid, [])}
        missing += [{"session_id": sid, "message_id": m} for m in sorted(turn_ids - held)]
        extra += [{"session_id": sid, "message_id": m} for m in sorted(held - turn_ids)]
    report.add(report.violations, "9", "raw turns missing from the recall index at its revision", missing)
    report.add(report.violations, "9", "recall index rows for turns that are not raw turns", extra)
    report.add(report.violations, "9", "recall index rows without their FTS5 row", no_fts)
    report.add(report.unsettled, "9", "recall index behind the session's published revision", behind)
    report.add(report.unsettled, "9", "turn vectors not written to Chroma yet", vectors_pending)


async def check_turn_vectors(ctx: Any, db: Any, report: Report) -> None:
    """Invariant 9, Chroma side: every turn row state.db marks as written is in its collection, as
    written (its digest, and its document and vector against the record kept at writing)."""
    # imported here: the worker processes, which never read Chroma, start without its client
    from backend.memory import turn_vectors  # import time: numpy, only when Chroma is compared

    missing: list[dict[str, Any]] = []
    changed: list[dict[str, Any]] = []
    after = 0
    while rows := await turn_vectors.marked_batch(db, after):
        after = rows[-1].id
        for row, why in await _still_differing(ctx, db, rows):
            found = {"session_id": row.session_id, "message_id": row.message_id}
            if why == "missing":
                missing.append(found)
            else:
                changed.append({**found, "differs": why})
    report.add(report.violations, "9", "turn vectors marked written but missing from Chroma", missing)
    report.add(report.violations, "9", TURN_ROWS_CHANGED, changed)


async def _still_differing(ctx: Any, db: Any, rows: list[Any]) -> list[tuple[Any, str]]:
    """The rows of a batch that differ from Chroma's, each looked at again as it is now.

    On a live system Dream can re-index a row and flush its new vector between this reading the
    row and reading Chroma: Chroma then holds a newer digest than the one read. Each row that
    differs is read again (still marked? which digest now?) and compared again; one that still
    differs after RECHECKS looks is real.
    """
    from backend.memory import turn_vectors  # import time: numpy, only when Chroma is compared

    differing = await turn_vectors.compare(rows, ctx.turn_store)
    for _ in range(RECHECKS):
        if not differing:
            break
        again = await turn_vectors.marked_again(db, [row for row, _ in differing])
        differing = await turn_vectors.compare(again, ctx.turn_store)
    return differing


# how many times a turn row that differs from Chroma's is looked at again, as it is now
RECHECKS = 2


FAMILY = Family(
    name="turn_index",
    findings=(
        "raw turns missing from the recall index at its revision",
        "recall index rows for turns that are not raw turns",
        "recall index rows without their FTS5 row",
        "recall index behind the session's published revision",
        "turn vectors not written to Chroma yet",
        "turn vectors marked written but missing from Chroma",
        TURN_ROWS_CHANGED,
    ),
    sessions=(check_recall_index_sync,),
    chroma=(check_turn_vectors,),
)
