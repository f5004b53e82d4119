"""Recall's graph retrievers: the turns that mention the query's concepts and entities, the turns
that name the days it names, and the typed relations between the entities it names, from Dream's graph."""

from __future__ import annotations

import math
import unicodedata
from typing import Any

from backend.memory.config import RecallConfig
from backend.memory.dates import DaySpan
from backend.memory.scope import Scope, excluded, in_list
from backend.memory.text import query_terms, words
from backend.store.db import Reader

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
# how many turns mention each node
MENTION_COUNTS_SQL = (
    "SELECT dst, count(*) FROM graph_edge WHERE dst IN ({nodes}) AND kind = 'mentions' GROUP BY dst"
)
# the turns (in scope: `filters` on `t`) that mention each node
MENTIONING_TURNS_SQL = (
    "SELECT t.message_id, t.session_id, t.ord, e.dst FROM graph_edge AS e "
    "JOIN memory_turn AS t ON t.message_id = substr(e.src, 6) "
    "WHERE e.dst IN ({nodes}) AND e.kind = 'mentions'{filters}"
)


def graph_node_ids(query: str, terms: list[str] | None = None) -> list[str]:
    """Dream's concept and entity node ids the query names (single words and runs of up to 3).

    `terms`: the query's `query_terms` as the caller already has them.
    """
    raw = [unicodedata.normalize("NFC", w).casefold().strip("'’.-") for w in words(query)]
    ids: list[str] = []
    for term in query_terms(query) if terms is None else terms:
        ids += [f"concept:{term}", f"entity:{term}"]
    for size in (2, 3):
        ids += [f"entity:{' '.join(raw[i : i + size])}" for i in range(len(raw) - size + 1)]
    return list(dict.fromkeys(ids))


def graph_turns(nodes: list[str], scope: Scope) -> Reader[dict[str, float]]:
    """message id -> graph score: the query's concepts and entities, weighted by rarity."""
    if not nodes:
        return {}
    [counted] = yield [(MENTION_COUNTS_SQL.format(nodes=in_list(nodes)), nodes)]
    df = dict(counted)
    useful = [n for n, count in df.items() if count <= GRAPH_MAX_DF]
    if not useful:
        return {}
    filters, params = scope_sql(scope, "t")
    [rows] = yield [(MENTIONING_TURNS_SQL.format(nodes=in_list(useful), filters=filters), [*useful, *params])]
    scores: dict[str, float] = {}
    for mid, sid, ord_, dst in rows:
        if not excluded(scope, sid, ord_):
            scores[mid] = scores.get(mid, 0.0) + 1.0 / math.log(2.0 + df[dst])
    return scores


def scope_sql(scope: Scope, alias: str, session_column: str = "session_id") -> tuple[str, list[Any]]:
    """` AND ...` filters keeping rows of `alias` to the scope's project and session, and their values."""
    sql, params = "", []
    if scope.project is not None:
        sql += f" AND {alias}.project = ?"
        params.append(scope.project)
    if scope.session_id is not None:
        sql += f" AND {alias}.{session_column} = ?"
        params.append(scope.session_id)
    return sql, params


# the turns (in scope) whose time expressions name a day in a range of `date:` nodes (ISO ids
# sort by time, so the range is one seek of graph_edge_dst_idx)
DATED_TURNS_SQL = (
    "SELECT t.message_id, t.session_id, t.ord FROM graph_edge AS e "
    "JOIN memory_turn AS t ON t.message_id = substr(e.src, 6) "
    "WHERE e.dst BETWEEN ? AND ? AND e.kind = 'on'{filters} LIMIT ?"
)
DATED_TURNS_MAX = 200


def dated_turns(spans: list[DaySpan], scope: Scope) -> Reader[dict[str, float]]:
    """message id -> 1.0: the turns whose resolved days fall in the days the query names."""
    if not spans:
        return {}
    filters, params = scope_sql(scope, "t")
    sql = DATED_TURNS_SQL.format(filters=filters)
    found = yield [(sql, [*span.node_range(), *params, DATED_TURNS_MAX]) for span in spans]
    return {mid: 1.0 for rows in found for mid, sid, ord_ in rows if not excluded(scope, sid, ord_)}


def facts(nodes: list[str], scope: Scope, config: RecallConfig) -> Reader[list[dict[str, Any]]]:
    """Typed relations that touch an entity the query names, in scope, as fact items."""
    candidates = [n for n in nodes if n.startswith("entity:")]
    if not candidates or config.facts <= 0:
        return []
    # most of a query's words and word runs name no entity: probe the nodes first (one key
    # lookup each), so the edge search below looks up only the few that exist
    [found] = yield [(f"SELECT id FROM graph_node WHERE id IN ({in_list(candidates)})", candidates)]
    entities = [row[0] for row in found]
    if not entities:
        return []
    marks = in_list(entities)
    filters, params = scope_sql(scope, "s", "id")
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
