"""Recall's dense retrievers, against Chroma: the nearest turn vectors and the nearest session summaries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backend.chroma.collection import ChromaStore
from backend.core.errors import ChromaUnreachable
from backend.memory.config import RecallConfig
from backend.memory.scope import Scope
from backend.runtime.context import Context
from backend.store import counters

# The summary retriever of a project (one summary collection for every project; Chroma 1.5's
# where-filtered search over it costs 50-170 ms at 100 000 rows whatever the filter selects, an
# unfiltered one 3-4 ms; `benchmarks/summary_search.py`). Per project, whichever is cheaper of:
# * its own rows, fetched by id and ranked here (~0.06 ms a row): always up to SUMMARIES_BY_ID
#   sessions, and up to SUMMARIES_BY_ID_MAX where the next way would cost more;
SUMMARIES_BY_ID = 500
SUMMARIES_BY_ID_MAX = 1000
BY_ID_ROW_MS = 0.06
# * the nearest rows of the whole collection, kept when the session is the project's: first
#   SUMMARIES_WIDE_MIN rows (a project with a large share of the sessions, the default one alone
#   included, is answered so), then ids and distances only (the fast query) of enough rows that the
#   project's share of the sessions holds SUMMARIES_WIDE_MARGIN times the wanted number (~5 ms +
#   ~0.01 ms a row), up to SUMMARIES_WIDE_MAX rows;
SUMMARIES_WIDE_MARGIN = 3
SUMMARIES_WIDE_MIN = 50
SUMMARIES_WIDE_MAX = 4000
WIDE_ROW_MS = 0.01
# * else (the wide query did not hold enough of the project's rows, or it would take too many):
#   by id up to SUMMARIES_BY_ID_MAX sessions, Chroma's filtered search past that.


def _where(
    scope: Scope, project_key: str = "project", session_key: str = "sessionId"
) -> dict[str, Any] | None:
    clauses: list[dict[str, Any]] = []
    if scope.project is not None:
        clauses.append({project_key: scope.project})
    if scope.session_id is not None:
        clauses.append({session_key: scope.session_id})
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


# A session-scoped dense search fetches the session's turn vectors by id up to this many turns:
# a fetch costs ~0.14 ms a row, Chroma's filtered search grows with the collection. Measured
# (`benchmarks/session_search.py`, n = 100): at 52 000 turns a 200-turn session by id 33 / 46 ms
# (p50 / p95) vs filtered 81 / 117; a 2 000-turn one 272 / 350 vs 67 / 99; at 3 500 turns a
# 200-turn session 34 / 43 vs 16 / 21 (a small collection's filtered search is cheap anyway).
SESSION_BY_ID_MAX = 300
SESSION_TURN_IDS_SQL = "SELECT message_id FROM memory_turn WHERE session_id = ? LIMIT ?"


async def dense(
    ctx: Context, vector: list[float], scope: Scope, config: RecallConfig
) -> list[tuple[str, float]]:
    """(message id, similarity) of the nearest turn vectors in scope.

    Only ids and distances come back (documents and metadata would triple the
    query's time); state.db says whether each vector is current for its row.
    """
    if scope.project is None:
        raise ChromaUnreachable("not searched across all projects (one turn collection per project)")
    store = ctx.turn_store(scope.project)
    if scope.session_id is None:
        hits = await store.nearest(vector, config.dense_candidates)
    else:
        hits = await _nearest_in_session(ctx, store, vector, scope.session_id, config.dense_candidates)
    return [(i, 1.0 - distance) for i, distance in hits]


async def _nearest_in_session(
    ctx: Context, store: ChromaStore, vector: list[float], session_id: str, n: int
) -> list[tuple[str, float]]:
    """(message id, distance) of one session's `n` nearest turn vectors in its project's `store`.

    Its turns' vectors by id, ranked here (Chroma's `where`-filtered search walks most of
    the collection's graph whatever the filter keeps: see `ChromaStore.nearest_among`).
    """
    db = await ctx.db()
    rows = await db.fetchall(SESSION_TURN_IDS_SQL, (session_id, SESSION_BY_ID_MAX + 1))
    ids = [str(r[0]) for r in rows]
    if len(ids) <= SESSION_BY_ID_MAX:
        return await store.nearest_by_id(ids, vector, n)
    return await store.nearest(vector, n, {"sessionId": session_id})


# A summary row's version: its job's lease epoch and receipt stamps. Every write of the row's
# document, vector or synthesis keys happens under a summary_job lease (a new epoch), and the job is
# released (no owner) and acknowledged only once the row reads back as its receipt: a row whose job
# is so at rest is what its version says until the version moves. Otherwise: no version (the row
# may be being written; read from Chroma every time). Dream's overlay keys move without a version.
SUMMARY_ROWS_SQL = (
    "SELECT s.id, j.epoch, j.owner_id, j.result_staged_at, j.result_acknowledged_at, "
    "j.result_last_replayed_at FROM session AS s LEFT JOIN summary_job AS j ON j.session_id = s.id "
    "WHERE s.{column} = ? LIMIT ?"
)
SummaryRows = dict[str, tuple[int, int, int, int | None] | None]


async def summary_rows(ctx: Context, scope: Scope) -> SummaryRows | None:
    """The summary rows of the scope's sessions with their versions, when it has few enough to
    fetch by id (at most SUMMARIES_BY_ID_MAX + 1 of a project's, read); None for everywhere."""
    if scope.project is None and scope.session_id is None:
        return None
    column, key = ("id", scope.session_id) if scope.session_id is not None else ("project", scope.project)
    db = await ctx.db()
    rows = await db.fetchall_beside(SUMMARY_ROWS_SQL.format(column=column), (key, SUMMARIES_BY_ID_MAX + 1))
    return {f"summary_{r[0]}": _version(r) for r in rows}


def _version(row: Any) -> tuple[int, int, int, int | None] | None:
    """A summary row's version from its job (None: no job, leased, or not acknowledged)."""
    epoch, owner, staged, acknowledged, replayed = (row[i] for i in range(1, 6))
    if epoch is None or owner is not None or acknowledged is None:
        return None
    return int(epoch), int(staged or 0), int(acknowledged), None if replayed is None else int(replayed)


async def summary_hits(
    ctx: Context,
    vector: list[float],
    scope: Scope,
    config: RecallConfig,
    rows: SummaryRows | None = None,
) -> list[tuple[str, float, str | None, dict[str, Any]]]:
    """The nearest summary rows in scope: among the scope's own rows by id when it has few, else
    among the whole collection's nearest when its share holds enough, else Chroma's filtered search.

    `rows`: `summary_rows(ctx, scope)`, when the caller read it already.
    """
    rows = rows if rows is not None else await summary_rows(ctx, scope)
    store, want = ctx.store(), config.summaries
    if scope.session_id is not None:
        return await store.nearest_among([f"summary_{scope.session_id}"], vector, want, rows)
    if scope.project is None or rows is None:
        return await store.query(vector, want, None)
    db = await ctx.db()
    # the project's summary rows, when it has few enough to fetch by id
    own = list(rows) if len(rows) <= SUMMARIES_BY_ID_MAX else None
    if own is not None:
        width = 0 if len(own) <= SUMMARIES_BY_ID else await _wide_width(db, scope.project, want, len(own))
        if width == 0 or width > SUMMARIES_WIDE_MAX or len(own) * BY_ID_ROW_MS <= width * WIDE_ROW_MS:
            return await store.nearest_among(own, vector, want, rows)
    else:
        # the nearest rows of the whole collection, kept when in scope, ARE the scope's nearest as
        # long as `want` of them are in it (or the collection had no more rows to give)
        first = await store.query(vector, SUMMARIES_WIDE_MIN, None)
        hits = [hit for hit in first if hit[3].get("project") == scope.project]
        if len(hits) >= want or len(first) < SUMMARIES_WIDE_MIN:
            return hits[:want]
        width = await _wide_width(db, scope.project, want)
    if SUMMARIES_WIDE_MIN < width <= SUMMARIES_WIDE_MAX:
        nearest = await store.nearest(vector, width)
        mine = set(own) if own is not None else await _rows_in_project(db, scope.project, nearest)
        kept = [(i, d) for i, d in nearest if i in mine][:want]
        if len(kept) >= want or len(nearest) < width:
            found = await store.get([i for i, _ in kept])
            return [(i, d, found[i].document, found[i].metadata) for i, d in kept if i in found]
    if own is not None:
        return await store.nearest_among(own, vector, want, rows)
    return await store.query(vector, want, _where(scope))


async def _wide_width(db: Any, project: str, want: int, mine: int | None = None) -> int:
    """How many of the whole collection's nearest rows hold SUMMARIES_WIDE_MARGIN x `want` of the
    project's, by its share of the sessions (`mine`: its sessions, counted here up to where the
    answer is the minimum when not given)."""
    total = int(await db.read_in_thread(counters.sessions_estimate_sync))
    if mine is None:
        enough = int(-(-SUMMARIES_WIDE_MARGIN * want * total // SUMMARIES_WIDE_MIN))  # the minimum width
        mine = int(
            await db.scalar(
                "SELECT count(*) FROM (SELECT 1 FROM session WHERE project = ? LIMIT ?) AS p",
                (project, enough),
            )
        )
    return max(SUMMARIES_WIDE_MIN, int(-(-SUMMARIES_WIDE_MARGIN * want * total // max(mine, 1))))


async def _rows_in_project(db: Any, project: str, hits: Sequence[tuple[str, float]]) -> set[str]:
    """Which of the summary rows `hits` are the project's sessions'."""
    sessions = {row_id.removeprefix("summary_"): row_id for row_id, _ in hits}
    if not sessions:
        return set()
    # by primary key, the project compared here: with `project = ?` in the WHERE, SQLite walks the
    # project's index instead (11 ms for 50 ids in a 50 000-session project, vs 0.3 ms)
    marks = ", ".join("?" * len(sessions))
    rows = await db.fetchall(f"SELECT id, project FROM session WHERE id IN ({marks})", tuple(sessions))
    return {sessions[str(r[0])] for r in rows if r[1] == project}


async def summaries(
    ctx: Context, vector: list[float], scope: Scope, config: RecallConfig, rows: SummaryRows | None = None
) -> list[dict[str, Any]]:
    """The nearest summaries in scope as recall items (`rows`: as `summary_hits` takes them)."""
    hits = await summary_hits(ctx, vector, scope, config, rows)
    if not hits:
        return []
    best = max(1.0 - d for _, d, _, _ in hits) or 1.0
    items = []
    for rank, (row_id, distance, document, meta) in enumerate(hits):
        sid = str(meta.get("sessionId") or row_id.removeprefix("summary_"))
        if not (scope.exclude_session == sid and scope.exclude_from_ord == 0):
            score = round(config.summary_weight * max(0.0, 1.0 - distance) / best, 6)
            items.append(_summary_item(row_id, sid, document, meta, rank, score))
    return items


def _summary_item(
    row_id: str, session_id: str, document: str | None, meta: dict[str, Any], rank: int, score: float
) -> dict[str, Any]:
    """One summary hit as a recall item (found by the dense retriever alone, citing nothing)."""
    return {
        "kind": "summary",
        "id": row_id,
        "session_id": session_id,
        "project": meta.get("project"),
        "message_id": None,
        "time": meta.get("timestamp"),
        "score": score,
        "text": document or "",
        "title": meta.get("title"),
        "provenance": {
            "revision": meta.get("dreamInputRevision"),
            "found_by": ["dense"],
            "ranks": {"dense": rank},
            "cites": [],
        },
    }
