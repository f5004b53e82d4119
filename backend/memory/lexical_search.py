"""Recall's lexical retriever: FTS5 over a project's turn table, or PostgreSQL's full-text index."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from backend.memory.candidate import Candidate
from backend.memory.config import RecallConfig
from backend.memory.scope import Scope, excluded
from backend.memory.text import FTS_TABLES_SQL, fts_match, fts_table, scope_token
from backend.store.db import Conn, Reader, engine_of

# the FTS5 query ranks and limits on its own, then joins only its LIMIT rows
# (joining first makes SQLite score every match through the join: 6x slower)
FTS_SQL = """
SELECT t.id, t.message_id, t.session_id, t.speaker, t.ord, f.score, t.time
FROM (SELECT rowid, -bm25({table}, :w_body, :w_ctx, 0.0) AS score FROM {table}
      WHERE {table} MATCH :match
      ORDER BY bm25({table}, :w_body, :w_ctx, 0.0) LIMIT :n) AS f
JOIN memory_turn AS t ON t.id = f.rowid
ORDER BY f.score DESC
"""


# whether the project's table exists: SQLite 3.37+ looks the name up in the schema it holds in
# memory; before, a scan of sqlite_master (every table, index and trigger: ~40 us a query)
TABLE_EXISTS_SQL = (
    "SELECT 1 FROM pragma_table_list(?)"
    if sqlite3.sqlite_version_info >= (3, 37)
    else "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
)


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
SELECT t.id, t.message_id, t.session_id, t.speaker, t.ord, f.score, t.time
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


def fts(conn: Conn, terms: list[str], scope: Scope, config: RecallConfig) -> Reader[dict[int, Candidate]]:
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
        [found] = yield [(TABLE_EXISTS_SQL, (table,))]
        tables = [table] if found else []
    params = {"w_body": config.fts_weights[0], "w_ctx": config.fts_weights[1], "match": match}
    per_table = yield [(FTS_SQL.format(table=table), {**params, "n": config.candidates}) for table in tables]
    rows = [row for found in per_table for row in found]
    if len(tables) > 1:  # each table's bm25 is its own project's; the best of all of them
        rows = sorted(rows, key=lambda r: -r[5])[: config.candidates]
    return _candidates(rows, scope)


def _candidates(rows: Sequence[Any], scope: Scope) -> dict[int, Candidate]:
    found: dict[int, Candidate] = {}
    for rank, (row_id, mid, sid, speaker, ord_, score, when) in enumerate(rows):
        if not excluded(scope, sid, ord_):
            found[row_id] = Candidate(row_id, mid, sid, speaker, {"fts": rank}, {"fts": float(score)}, when)
    return found
