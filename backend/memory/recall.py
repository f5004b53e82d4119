"""Recall: ranked memory items (turns, session summaries, graph facts) for a free-text query.

Hybrid, scoped to one project (or one session, or everything when asked):

* **lexical**: FTS5 over the project's own turn table (`body` = the turn's
  text and date, `ctx` = the turns before it, bm25-weighted), the query's
  non-stop words OR-ed (a session's scope token AND-ed when scoped to it);
* **dense**: the query's WordLlama vector against the Chroma turn collection
  (`where={"project": ...}`); a vector whose row is not marked current (a
  turn re-indexed since, or removed) is ignored;
* fused per turn, linearly after min-max normalisation or by reciprocal rank
  (`backend.memory.config.RecallConfig`), times a boost for turns by the one
  speaker the query names;
* **graph**: the query's words and word runs as Dream's concept and entity
  nodes -> the turns that mention them (a small extra weight in the fusion),
  and typed relations between entities as `fact` items;
* **summaries**: the session summaries nearest to the query (Chroma, by
  project), ranked among the turns by `summary_weight`.

Every item carries its kind, session, message id (turns), time, score and
text, and its provenance: the revision it was indexed or written at, which
retrievers found it (and at what rank), and the turns it cites. A Chroma
outage degrades recall to lexical + graph and says so in `degraded`.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import unicodedata
from collections.abc import Awaitable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from backend.core.errors import BadInput, ChromaUnreachable
from backend.memory.config import RecallConfig, recall_config
from backend.memory.text import (
    FTS_TABLES_SQL,
    fts_match,
    fts_table,
    mentions_name,
    query_terms,
    scope_token,
    words,
)
from backend.runtime.context import Context
from backend.store import counters
from backend.store.db import Conn, Reader, engine_of, independent_reads_sync, read_together_sync

KINDS = ("turn", "summary", "fact")
RETRIEVERS = ("fts", "dense", "graph", "summaries", "facts")
MAX_K = 200
MAX_QUERY_CHARS = 4000
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
# a concept mentioned by more turns than this says little about any of them
GRAPH_MAX_DF = 5000
FACT_KINDS_SQL = "('uses', 'depends_on', 'is_a', 'part_of', 'has_part', 'replaces', 'co_occurs')"
RELATION_WORDS = {
    "uses": "uses",
    "depends_on": "depends on",
    "is_a": "is a",
    "part_of": "is part of",
    "has_part": "has",
    "replaces": "replaces",
    "co_occurs": "goes with",
}


@dataclass
class Scope:
    """Where recall looks: a project, a session in it, or everywhere (project None)."""

    project: str | None
    session_id: str | None = None
    # leave out this session's turns from this position on (the agent's own recent turns)
    exclude_session: str | None = None
    exclude_from_ord: int = 0


@dataclass
class Candidate:
    """One turn found by at least one retriever."""

    row_id: int
    message_id: str
    session_id: str
    speaker: str = ""
    ranks: dict[str, int] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)


def validate(query: str, k: int, kinds: Collection[str]) -> None:
    """Refuse a query recall cannot answer, naming the fix."""
    if not isinstance(query, str) or not query.strip():
        raise BadInput("the recall query is empty: pass the words to look for as QUERY")
    if len(query) > MAX_QUERY_CHARS:
        raise BadInput(f"the recall query is {len(query)} characters, over {MAX_QUERY_CHARS}: shorten it")
    if not 1 <= k <= MAX_K:
        raise BadInput(f"--k {k} is out of range: ask for 1 to {MAX_K} items")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise BadInput(f"unknown item kind(s) {sorted(unknown)}: use {', '.join(KINDS)}")


async def recall(
    ctx: Context,
    query: str,
    *,
    project: str | None = "default",
    session_id: str | None = None,
    k: int = 10,
    kinds: Collection[str] = KINDS,
    retrievers: Collection[str] = RETRIEVERS,
    exclude_session: str | None = None,
    exclude_recent: int = 0,
    config: RecallConfig | None = None,
    top_ord: tuple[int | None] | None = None,
) -> dict[str, Any]:
    """The `k` best memory items for `query` (see the module docstring); reads only.

    `top_ord`: `exclude_session`'s newest turn as the caller already read it
    (`TOP_ORD_SQL`, in a 1-tuple: `(None,)` for none), saving recall that read.
    """
    validate(query, k, kinds)
    started = time.perf_counter()
    config = config or recall_config()
    db = await ctx.db()
    scope = await _scope(ctx, project, session_id, exclude_session, exclude_recent, top_ord)
    terms = query_terms(query)
    degraded: list[str] = []
    want_dense = "dense" in retrievers and "turn" in kinds
    want_summaries = "summaries" in retrievers and "summary" in kinds

    async def vector_side() -> tuple[Any, Any]:
        """The query vector, then the turn and summary searches at once (threads, HTTP)."""
        if not (want_dense or want_summaries):
            return None, None
        vector = await _settle(_query_vector(ctx, query), degraded)
        if vector is None:
            return None, None
        dense_task = _dense(ctx, vector, scope, config) if want_dense else None
        summary_task = _summaries(ctx, vector, scope, config) if want_summaries else None
        return await asyncio.gather(
            _guard(dense_task, degraded, "dense"), _guard(summary_task, degraded, "summaries")
        )

    # the state store's side runs on a database thread (PostgreSQL: the reading connection's,
    # beside the writes) while the vector side waits on Chroma
    lexical, (dense_hits, summaries) = await asyncio.gather(
        db.read_beside(lambda c: _lexical(c, terms, scope, config, retrievers, kinds, query)), vector_side()
    )
    turns = await db.read_beside(lambda c: _turn_items(c, lexical, dense_hits or [], scope, config, query, k))
    items = turns + (summaries or []) + lexical["facts"]
    items.sort(key=lambda item: (-item["score"], item["id"]))
    items = [i for i in items if i["kind"] in kinds][:k]
    return {
        "query": query,
        "project": scope.project,
        "session": scope.session_id,
        "k": k,
        "terms": terms,
        "items": items,
        "candidates": {
            "fts": len(lexical["fts"]),
            "dense": None if dense_hits is None else len(dense_hits),
            "graph": len(lexical["graph"]),
            "summaries": None if summaries is None else len(summaries),
            "facts": len(lexical["facts"]),
        },
        "degraded": degraded,
        "took_ms": round((time.perf_counter() - started) * 1000, 2),
    }


# the session's newest turn, for `exclude_recent` (its `ord`; NULL before its first turn)
TOP_ORD_SQL = "SELECT max(ord) FROM memory_turn WHERE session_id = ?"


def first_excluded_ord(top: int | None, recent: int) -> int:
    """The first `ord` of a session's `recent` newest turns, its newest being `top` (None: no turns)."""
    return max(0, int(top) + 1 - recent) if top is not None and recent > 0 else 0


async def _scope(
    ctx: Context,
    project: str | None,
    session_id: str | None,
    exclude_session: str | None,
    recent: int,
    top_ord: tuple[int | None] | None = None,
) -> Scope:
    scope = Scope(project, session_id, exclude_session)
    if exclude_session is not None and recent > 0:
        if top_ord is None:
            db = await ctx.db()
            top_ord = (await db.scalar(TOP_ORD_SQL, (exclude_session,)),)
        scope.exclude_from_ord = first_excluded_ord(top_ord[0], recent)
    elif exclude_session is not None:
        scope.exclude_from_ord = 0
    return scope


async def _query_vector(ctx: Context, query: str) -> list[float]:
    embedder = ctx.embedder()
    vectors = await asyncio.to_thread(embedder.embed, [query])
    return vectors[0]


async def _settle(task: Awaitable[list[float]], degraded: list[str]) -> list[float] | None:
    try:
        return await task
    except Exception as exc:  # the embedder failed to load: recall still answers lexically
        degraded.append(f"embedder: {exc}")
        return None


async def _guard(coro: Any, degraded: list[str], what: str) -> Any:
    if coro is None:
        return None
    try:
        return await coro
    except ChromaUnreachable as exc:
        degraded.append(f"{what}: {exc}")
        return None


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


async def _dense(
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
        return [(i, 1.0 - distance) for i, distance in hits]
    # one session: its turns' vectors by id, ranked here (Chroma's `where`-filtered search walks
    # most of the collection's graph whatever the filter keeps: see `ChromaStore.nearest_among`)
    db = await ctx.db()
    ids = [
        str(r[0])
        for r in await db.fetchall(
            "SELECT message_id FROM memory_turn WHERE session_id = ? LIMIT ?",
            (scope.session_id, SESSION_BY_ID_MAX + 1),
        )
    ]
    if len(ids) <= SESSION_BY_ID_MAX:
        hits = await store.nearest_by_id(ids, vector, config.dense_candidates)
    else:
        hits = await store.nearest(vector, config.dense_candidates, {"sessionId": scope.session_id})
    return [(i, 1.0 - distance) for i, distance in hits]


async def _summary_hits(
    ctx: Context, vector: list[float], scope: Scope, config: RecallConfig
) -> list[tuple[str, float, str | None, dict[str, Any]]]:
    """The nearest summary rows in scope: among the scope's own rows by id when it has few, else
    among the whole collection's nearest when its share holds enough, else Chroma's filtered search."""
    if scope.session_id is not None:
        return await ctx.store().nearest_among([f"summary_{scope.session_id}"], vector, config.summaries)
    if scope.project is None:
        return await ctx.store().query(vector, config.summaries, None)
    db = await ctx.db()
    store, want = ctx.store(), config.summaries
    rows = await db.fetchall(
        "SELECT id FROM session WHERE project = ? LIMIT ?", (scope.project, SUMMARIES_BY_ID_MAX + 1)
    )
    # the project's summary rows, when it has few enough to fetch by id
    own = [f"summary_{r[0]}" for r in rows] if len(rows) <= SUMMARIES_BY_ID_MAX else None
    if own is not None:
        width = 0 if len(own) <= SUMMARIES_BY_ID else await _wide_width(db, scope.project, want, len(own))
        if width == 0 or width > SUMMARIES_WIDE_MAX or len(own) * BY_ID_ROW_MS <= width * WIDE_ROW_MS:
            return await store.nearest_among(own, vector, want)
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
        return await store.nearest_among(own, vector, want)
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


async def _summaries(
    ctx: Context, vector: list[float], scope: Scope, config: RecallConfig
) -> list[dict[str, Any]]:
    hits = await _summary_hits(ctx, vector, scope, config)
    if not hits:
        return []
    best = max(1.0 - d for _, d, _, _ in hits) or 1.0
    items = []
    for rank, (row_id, distance, document, meta) in enumerate(hits):
        sid = str(meta.get("sessionId") or row_id.removeprefix("summary_"))
        if scope.exclude_session == sid and scope.exclude_from_ord == 0:
            continue
        items.append(
            {
                "kind": "summary",
                "id": row_id,
                "session_id": sid,
                "project": meta.get("project"),
                "message_id": None,
                "time": meta.get("timestamp"),
                "score": round(config.summary_weight * max(0.0, 1.0 - distance) / best, 6),
                "text": document or "",
                "title": meta.get("title"),
                "provenance": {
                    "revision": meta.get("dreamInputRevision"),
                    "found_by": ["dense"],
                    "ranks": {"dense": rank},
                    "cites": [],
                },
            }
        )
    return items


# -- the state store side (one thread hop; one read transaction on SQLite) ---------


def _lexical(
    conn: Conn,
    terms: list[str],
    scope: Scope,
    config: RecallConfig,
    retrievers: Collection[str],
    kinds: Collection[str],
    query: str,
) -> dict[str, Any]:
    # three retrievers, each ranking on its own: they need not see one state, and each
    # round of their reads goes to the server together (PostgreSQL: one round trip a round)
    nodes = graph_node_ids(query)
    with independent_reads_sync(conn):
        fts, graph, facts = read_together_sync(
            conn,
            [
                _fts(conn, terms, scope, config) if "fts" in retrievers and "turn" in kinds else _none({}),
                _graph_turns(nodes, scope) if "graph" in retrievers and "turn" in kinds else _none({}),
                _facts(nodes, scope, config) if "facts" in retrievers and "fact" in kinds else _none([]),
            ],
        )
    return {"fts": fts, "graph": graph, "facts": facts}


_T = TypeVar("_T")


def _none(value: _T) -> Reader[_T]:
    """A reader that reads nothing (a retriever left out)."""
    return value
    yield []  # a generator


# the FTS5 query ranks and limits on its own, then joins only its LIMIT rows
# (joining first makes SQLite score every match through the join: 6x slower)
FTS_SQL = """
SELECT t.id, t.message_id, t.session_id, t.speaker, t.ord, f.score
FROM (SELECT rowid, -bm25({table}, :w_body, :w_ctx, 0.0) AS score FROM {table}
      WHERE {table} MATCH :match
      ORDER BY bm25({table}, :w_body, :w_ctx, 0.0) LIMIT :n) AS f
JOIN memory_turn AS t ON t.id = f.rowid
ORDER BY f.score DESC
"""


def _excluded(scope: Scope, session_id: str, ord_: int) -> bool:
    return scope.exclude_session == session_id and ord_ >= scope.exclude_from_ord


# PostgreSQL's lexical search (schema_pg.LEXICAL). The GIN index intersects the terms' and the
# scope tokens' posting lists. PostgreSQL's ts_rank has no IDF (a common word counts as much
# as a rare one), so the score is bm25's shape built from parts it has: each term's ts_rank
# (weights {D, C, B, A}: scope 0, context, text; divided by 1 + log(length)) times the term's
# IDF, ln(1 + (N - df + 0.5) / (df + 0.5)), with df the term's matches in scope (one GIN count
# each) and N the table's row estimate (pg_class: O(1); a project's own count would walk it).
FTS_PG_DF_SQL = """
SELECT greatest((SELECT reltuples FROM pg_class WHERE oid = CAST('memory_fts' AS regclass)), 1) AS n{counts}
"""
FTS_PG_DF_TERM = ", (SELECT count(*) FROM memory_fts WHERE doc @@ {match}) AS d{i}"
FTS_PG_SQL = """
SELECT t.id, t.message_id, t.session_id, t.speaker, t.ord, f.score
FROM (SELECT id, {score} AS score FROM memory_fts WHERE doc @@ {match}
      ORDER BY score DESC LIMIT :n) AS f
JOIN memory_turn AS t ON t.id = f.id
ORDER BY f.score DESC
"""


def _fts_pg(terms: list[str], scope: Scope, config: RecallConfig) -> Reader[list[Any]]:
    """The best lexical matches on PostgreSQL: rows as `FTS_SQL` returns them."""
    tokens = [scope_token("p", scope.project)] if scope.project is not None else []
    tokens += [scope_token("s", scope.session_id)] if scope.session_id is not None else []

    def matching(query: str) -> str:
        return f"({query} && to_tsquery('simple', :scope))" if tokens else query

    top = max(config.fts_weights)
    # words of letters and digits only (`text.WORD`): no tsquery operator can appear in a term
    params: dict[str, Any] = {f"t{i}": term for i, term in enumerate(terms)}
    params["scope"] = " & ".join(tokens)
    term_query = [f"to_tsquery('english', :t{i})" for i in range(len(terms))]
    counts = "".join(FTS_PG_DF_TERM.format(i=i, match=matching(q)) for i, q in enumerate(term_query))
    [[df]] = yield [(FTS_PG_DF_SQL.format(counts=counts), params)]
    n = max(float(df[0]), float(sum(df[1:])))
    for i in range(len(terms)):
        params[f"i{i}"] = math.log(1 + (n - df[i + 1] + 0.5) / (df[i + 1] + 0.5))
    params["weights"] = [0.0, 0.0, config.fts_weights[1] / top, config.fts_weights[0] / top]
    params["n"] = config.candidates
    score = " + ".join(
        f"ts_rank(CAST(:weights AS real[]), doc, {q}, 1) * :i{i}"
        for i, q in enumerate(term_query)
        if df[i + 1]
    )
    if not score:
        return []
    match = matching("(" + " || ".join(term_query) + ")")
    [rows] = yield [(FTS_PG_SQL.format(score=score, match=match), params)]
    return list(rows)


def _fts(conn: Conn, terms: list[str], scope: Scope, config: RecallConfig) -> Reader[dict[int, Candidate]]:
    """The best FTS5 matches in the project's own table (every project's table when unscoped)."""
    match = fts_match(terms, None, scope.session_id)
    if match is None:
        return {}
    if engine_of(conn) == "postgresql":
        return _candidates((yield from _fts_pg(terms, scope, config)), scope)
    if scope.project is None:
        [found] = yield [(FTS_TABLES_SQL, ())]
        tables = [name for (name,) in found]
    else:
        table = fts_table(scope.project)
        [found] = yield [("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))]
        tables = [table] if found else []
    params = {"w_body": config.fts_weights[0], "w_ctx": config.fts_weights[1], "match": match}
    per_table = yield [(FTS_SQL.format(table=table), {**params, "n": config.candidates}) for table in tables]
    rows = [row for found in per_table for row in found]
    if len(tables) > 1:  # each table's bm25 is its own project's; the best of all of them
        rows = sorted(rows, key=lambda r: -r[5])[: config.candidates]
    return _candidates(rows, scope)


def _candidates(rows: Sequence[Any], scope: Scope) -> dict[int, Candidate]:
    found: dict[int, Candidate] = {}
    for rank, (row_id, mid, sid, speaker, ord_, score) in enumerate(rows):
        if not _excluded(scope, sid, ord_):
            found[row_id] = Candidate(row_id, mid, sid, speaker, {"fts": rank}, {"fts": float(score)})
    return found


def graph_node_ids(query: str) -> list[str]:
    """Dream's concept and entity node ids the query names (single words and runs of up to 3)."""
    raw = [unicodedata.normalize("NFC", w).casefold().strip("'’.-") for w in words(query)]
    ids: list[str] = []
    for term in query_terms(query):
        ids += [f"concept:{term}", f"entity:{term}"]
    for size in (2, 3):
        ids += [f"entity:{' '.join(raw[i : i + size])}" for i in range(len(raw) - size + 1)]
    return list(dict.fromkeys(ids))


def _in_list(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values))


def _graph_turns(nodes: list[str], scope: Scope) -> Reader[dict[str, float]]:
    """message id -> graph score: the query's concepts and entities, weighted by rarity."""
    if not nodes:
        return {}
    [counted] = yield [
        (
            f"SELECT dst, count(*) FROM graph_edge WHERE dst IN ({_in_list(nodes)}) AND kind = 'mentions' "
            "GROUP BY dst",
            nodes,
        )
    ]
    df = dict(counted)
    useful = [n for n, count in df.items() if count <= GRAPH_MAX_DF]
    if not useful:
        return {}
    filters, params = _scope_sql(scope, "t")
    [rows] = yield [
        (
            f"SELECT t.message_id, t.session_id, t.ord, e.dst FROM graph_edge AS e "
            f"JOIN memory_turn AS t ON t.message_id = substr(e.src, 6) "
            f"WHERE e.dst IN ({_in_list(useful)}) AND e.kind = 'mentions'{filters}",
            [*useful, *params],
        )
    ]
    scores: dict[str, float] = {}
    for mid, sid, ord_, dst in rows:
        if not _excluded(scope, sid, ord_):
            scores[mid] = scores.get(mid, 0.0) + 1.0 / math.log(2.0 + df[dst])
    return scores


def _scope_sql(scope: Scope, alias: str, session_column: str = "session_id") -> tuple[str, list[Any]]:
    sql, params = "", []
    if scope.project is not None:
        sql += f" AND {alias}.project = ?"
        params.append(scope.project)
    if scope.session_id is not None:
        sql += f" AND {alias}.{session_column} = ?"
        params.append(scope.session_id)
    return sql, params


def _facts(nodes: list[str], scope: Scope, config: RecallConfig) -> Reader[list[dict[str, Any]]]:
    """Typed relations that touch an entity the query names, in scope, as fact items."""
    entities = [n for n in nodes if n.startswith("entity:")]
    if not entities or config.facts <= 0:
        return []
    marks = _in_list(entities)
    filters, params = _scope_sql(scope, "s", "id")
    # the named entities' typed edges through the two indexes (src: primary key, dst: dst_idx),
    # then their sessions: "src IN .. OR dst IN .." made SQLite walk every edge of the project
    [rows] = yield [
        (
            f"SELECT e.src, e.dst, e.kind, e.session_id, e.weight, e.revision, a.label, b.label, s.project "
            f"FROM (SELECT src, dst, kind, session_id, weight, revision FROM graph_edge "
            f"      WHERE src IN ({marks}) AND kind IN {FACT_KINDS_SQL} "
            f"      UNION SELECT src, dst, kind, session_id, weight, revision FROM graph_edge "
            f"      WHERE dst IN ({marks}) AND kind IN {FACT_KINDS_SQL}) AS e "
            f"CROSS JOIN session AS s ON s.id = e.session_id "
            f"JOIN graph_node AS a ON a.id = e.src JOIN graph_node AS b ON b.id = e.dst "
            f"WHERE TRUE{filters} ORDER BY e.weight DESC, e.src, e.dst, e.kind, e.session_id LIMIT ?",
            [*entities, *entities, *params, config.facts * 4],
        )
    ]
    named = set(entities)
    # "goes with" is a fact only when the query names both sides
    kept = [row for row in rows if row[2] != "co_occurs" or (row[0] in named and row[1] in named)]
    kept = kept[: config.facts]
    # each fact's citing turns: one round for all of them
    cited = (yield [(FACT_CITES_SQL, (dst, src, sid)) for src, dst, _, sid, *_ in kept]) if kept else []
    facts = []
    for (src, dst, kind, sid, weight, revision, a, b, project), cites in zip(kept, cited, strict=True):
        both = src in named and dst in named
        relevance = (1.0 if both else 0.6) * min(1.0, 0.5 + 0.1 * float(weight))
        facts.append(
            {
                "kind": "fact",
                "id": f"fact:{src}|{kind}|{dst}|{sid}",
                "session_id": sid,
                "project": project,
                "message_id": None,
                "time": None,
                "score": round(config.fact_weight * relevance, 6),
                "text": f"{a} {RELATION_WORDS.get(kind, kind)} {b}",
                "provenance": {
                    "revision": revision,
                    "found_by": ["graph"],
                    "ranks": {},
                    "cites": [r[0] for r in cites],
                },
            }
        )
    return facts


FACT_CITES_SQL = (
    "SELECT substr(a.src, 6) FROM graph_edge AS a JOIN graph_edge AS b ON b.src = a.src "
    "AND b.dst = ? AND b.kind = 'mentions' AND b.session_id = a.session_id "
    "WHERE a.dst = ? AND a.kind = 'mentions' AND a.session_id = ? ORDER BY a.src LIMIT 5"
)


def _turn_items(
    conn: Conn,
    lexical: Mapping[str, Any],
    dense_hits: list[tuple[str, float]],
    scope: Scope,
    config: RecallConfig,
    query: str,
    k: int,
) -> list[dict[str, Any]]:
    """Fuse the turn lists, boost the named speaker, and build the best `k` turn items."""
    candidates: dict[str, Candidate] = {c.message_id: c for c in lexical["fts"].values()}
    rows = _index_rows(conn, [m for m, _ in dense_hits] + list(lexical["graph"]))
    for rank, (mid, sim) in enumerate(dense_hits):
        row = rows.get(mid)
        if (
            row is None
            or row["vector_digest"] != row["digest"]
            or _excluded(scope, row["session_id"], row["ord"])
        ):
            continue  # an orphan or stale vector: its turn was re-indexed or removed since
        cand = candidates.setdefault(mid, Candidate(row["id"], mid, row["session_id"], row["speaker"]))
        cand.ranks["dense"], cand.scores["dense"] = rank, sim
    graph = lexical["graph"]
    for rank, (mid, score) in enumerate(sorted(graph.items(), key=lambda kv: -kv[1])):
        row = rows.get(mid)
        if row is None:
            continue
        cand = candidates.setdefault(mid, Candidate(row["id"], mid, row["session_id"], row["speaker"]))
        cand.ranks["graph"], cand.scores["graph"] = rank, score
    if not candidates:
        return []
    fused = fuse(candidates, config)
    _boost_named_speaker(fused, candidates, query, config)
    top = sorted(fused, key=lambda m: (-fused[m], m))[:k]
    details = _turn_details(conn, top)
    top_score = max(fused.values()) or 1.0
    items = []
    for mid in top:
        cand, detail = candidates[mid], details.get(mid)
        if detail is None:
            continue
        items.append(
            {
                "kind": "turn",
                "id": mid,
                "session_id": cand.session_id,
                "project": detail["project"],
                "message_id": mid,
                "time": detail["time"],
                "score": round(fused[mid] / top_score, 6),
                "text": detail["text"],
                "speaker": cand.speaker,
                "role": detail["role"],
                "provenance": {
                    "revision": detail["revision"],
                    "found_by": sorted(cand.ranks),
                    "ranks": dict(sorted(cand.ranks.items())),
                    "cites": [mid],
                },
            }
        )
    return items


def fuse(candidates: Mapping[str, Candidate], config: RecallConfig) -> dict[str, float]:
    """One score per turn: min-max linear fusion or reciprocal rank fusion (config.fusion)."""
    weights = {"fts": config.lexical_weight, "dense": config.dense_weight, "graph": config.graph_weight}
    if config.fusion == "rrf":
        return {
            m: sum(weights[r] / (config.rrf_k + rank + 1) for r, rank in c.ranks.items())
            for m, c in candidates.items()
        }
    bounds: dict[str, tuple[float, float]] = {}
    for retriever in weights:
        values = [c.scores[retriever] for c in candidates.values() if retriever in c.scores]
        if values:
            bounds[retriever] = (min(values), max(values))
    fused = {}
    for mid, cand in candidates.items():
        total = 0.0
        for retriever, value in cand.scores.items():
            lo, hi = bounds[retriever]
            total += weights[retriever] * ((value - lo) / (hi - lo) if hi - lo > 1e-12 else 1.0)
        fused[mid] = total
    return fused


def _boost_named_speaker(
    fused: dict[str, float], candidates: Mapping[str, Candidate], query: str, config: RecallConfig
) -> None:
    """x(1 + boost) for the turns of the one speaker the query names (none when it names several)."""
    speakers = {c.speaker for c in candidates.values() if c.speaker not in ("", "user", "assistant")}
    named = {s for s in speakers if mentions_name(query, s)}
    if len(named) != 1 or config.speaker_boost <= 0:
        return
    for mid, cand in candidates.items():
        if cand.speaker in named:
            fused[mid] *= 1.0 + config.speaker_boost


def _index_rows(conn: Conn, message_ids: list[str]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    ids = list(dict.fromkeys(message_ids))
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        for r in conn.execute(
            f"SELECT id, message_id, session_id, speaker, ord, digest, vector_digest FROM memory_turn "
            f"WHERE message_id IN ({_in_list(chunk)})",
            chunk,
        ):
            rows[r[1]] = {
                "id": r[0],
                "session_id": r[2],
                "speaker": r[3],
                "ord": r[4],
                "digest": r[5],
                "vector_digest": r[6],
            }
    return rows


def _turn_details(conn: Conn, message_ids: list[str]) -> dict[str, dict[str, Any]]:
    if not message_ids:
        return {}
    out = {}
    for mid, project, role, when, revision, data in conn.execute(
        f"SELECT t.message_id, t.project, t.role, t.time, t.revision, m.data FROM memory_turn AS t "
        f"JOIN session_message AS m ON m.id = t.message_id WHERE t.message_id IN ({_in_list(message_ids)})",
        message_ids,
    ):
        parsed = json.loads(data)
        text = parsed.get("text") if isinstance(parsed, dict) else None
        out[mid] = {"project": project, "role": role, "time": when, "revision": revision, "text": text or ""}
    return out
