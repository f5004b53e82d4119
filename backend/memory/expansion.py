"""Recall's expansions, after fusion: the second hop through Dream's graph, the fit of dates, and the
spread of the top k across sessions. Each reads the fused scores and changes them in place.

* **hop**: the concepts and entities the best fused turns mention, weighted by
  rarity (a node most turns mention says nothing), lead to the other turns that
  mention them: the evidence of another session that shares the hits' words
  but not the question's ("what did Melanie paint": a hit about her sunset
  painting -> the turn about the sunrise she painted last year).
* **dates**: a question that names days ("in July 2022", "last week") favours
  turns said on those days or whose time words name them (Dream's `on` edges);
  a question asking when favours turns that name a day at all.
* **diversify**: each turn already ranked from the same session multiplies a
  turn's score by `session_decay` (a maximal-marginal-relevance pick with the
  session as the redundancy), so evidence from several sessions can share the
  k slots instead of one session's neighbouring turns filling them.
"""

from __future__ import annotations

import math
from collections import Counter

from backend.memory import dates
from backend.memory.candidate import Candidate
from backend.memory.config import RecallConfig
from backend.memory.graph_search import scope_sql
from backend.memory.query import Query
from backend.memory.scope import Scope, excluded, in_list
from backend.store.db import Conn

# a node more turns mention than this is too common to connect two of them
HOP_MAX_DF = 50
# the seeds' nodes the hop follows, those the best seeds share most first: each costs a count and its turns
HOP_MAX_NODES = 24
# the fused turns whose dates are looked at (the rest could not reach the top k anyway)
DATES_TOP = 50
SEED_NODES_SQL = "SELECT src, dst FROM graph_edge WHERE src IN ({ids}) AND kind = 'mentions'"
# how many turns mention a node, counted only up to HOP_MAX_DF + 1: a common concept may have
# thousands of mentions across projects, and all the hop needs to know is that it is too common
NODE_DF_TERM = (
    "SELECT ? AS node, count(*) AS df FROM "
    "(SELECT 1 FROM graph_edge WHERE dst = ? AND kind = 'mentions' LIMIT {limit}) AS m{i}"
)
HOP_TURNS_SQL = (
    "SELECT t.id, t.message_id, t.session_id, t.speaker, t.ord, t.time, e.dst FROM graph_edge AS e "
    "JOIN memory_turn AS t ON t.message_id = substr(e.src, 6) "
    "WHERE e.dst IN ({nodes}) AND e.kind = 'mentions'{filters}"
)
TURN_DAYS_SQL = "SELECT src, dst FROM graph_edge WHERE src IN ({ids}) AND kind = 'on'"


def best(fused: dict[str, float], n: int) -> list[str]:
    """The `n` best fused turns, best first (ties by message id: the same order every time)."""
    return sorted(fused, key=lambda m: (-fused[m], m))[:n]


def hop(
    conn: Conn,
    fused: dict[str, float],
    candidates: dict[str, Candidate],
    query: Query,
    scope: Scope,
    config: RecallConfig,
) -> None:
    """Turns sharing rare concepts and entities with the best fused turns gain up to `hop_weight`
    of the best score (new ones join the candidates); the query's own nodes were the first hop."""
    seeds = best(fused, config.hop_seeds)
    if not seeds or config.hop_weight <= 0:
        return
    top = fused[seeds[0]] or 1.0
    ids = [f"turn:{m}" for m in seeds]
    asked = set(query.nodes)
    reach: dict[str, float] = {}  # node -> the summed relative scores of the seeds that mention it
    for src, dst in conn.execute(SEED_NODES_SQL.format(ids=in_list(ids)), ids):
        if dst not in asked:
            reach[dst] = reach.get(dst, 0.0) + fused[src[5:]] / top
    nodes = sorted(reach, key=lambda n: (-reach[n], n))[:HOP_MAX_NODES]
    if not nodes:
        return
    counts = " UNION ALL ".join(NODE_DF_TERM.format(limit=HOP_MAX_DF + 1, i=i) for i in range(len(nodes)))
    df = dict(conn.execute(counts, [v for node in nodes for v in (node, node)]).fetchall())
    nodes = [n for n in nodes if 1 < df.get(n, 0) <= HOP_MAX_DF]  # shared by another turn, yet rare
    if not nodes:
        return
    filters, params = scope_sql(scope, "t")
    gained: dict[str, float] = {}
    for row_id, mid, sid, speaker, ord_, when, node in conn.execute(
        HOP_TURNS_SQL.format(nodes=in_list(nodes), filters=filters), [*nodes, *params]
    ):
        if not excluded(scope, sid, ord_):
            gained[mid] = gained.get(mid, 0.0) + reach[node] / math.log(2.0 + df[node])
            candidates.setdefault(mid, Candidate(row_id, mid, sid, speaker, time=when))
    most = max(gained.values(), default=0.0) or 1.0
    for rank, mid in enumerate(sorted(gained, key=lambda m: (-gained[m], m))):
        candidates[mid].ranks["hop"] = rank
        fused[mid] = fused.get(mid, 0.0) + config.hop_weight * top * gained[mid] / most


def fit_dates(
    conn: Conn, fused: dict[str, float], candidates: dict[str, Candidate], query: Query, config: RecallConfig
) -> None:
    """x(1 + date_boost) for the best turns said on, or naming, a day the query names; x(1 +
    when_boost) for those naming any day when it asks when and names none."""
    if not query.spans and not query.asks_when:
        return
    top = best(fused, DATES_TOP)
    days = _turn_days(conn, top)
    for mid in top:
        if query.spans:
            named = [dates.span_of_node(node) for node in days.get(mid, ())]
            own = candidates[mid].time
            said = [dates.DaySpan(d, d) for d in ([dates.day_of(own)] if own is not None else [])]
            if any(dates.overlaps(a, b) for a in query.spans for b in [*named, *said]):
                fused[mid] *= 1.0 + config.date_boost
        elif mid in days:
            fused[mid] *= 1.0 + config.when_boost


def _turn_days(conn: Conn, message_ids: list[str]) -> dict[str, list[str]]:
    """message id -> the `date:` nodes its time words name (Dream's `on` edges)."""
    ids = [f"turn:{m}" for m in message_ids]
    days: dict[str, list[str]] = {}
    if ids:
        for src, dst in conn.execute(TURN_DAYS_SQL.format(ids=in_list(ids)), ids):
            days.setdefault(src[5:], []).append(dst)
    return days


def diversify(
    fused: dict[str, float], candidates: dict[str, Candidate], config: RecallConfig, k: int
) -> dict[str, float]:
    """The `k` best turns once each turn's score is multiplied by `session_decay` for every turn of
    its session picked before it, with those scores (best first)."""
    pool = best(fused, 4 * k)
    if config.session_decay >= 1.0:
        return {m: fused[m] for m in pool[:k]}
    picked: dict[str, float] = {}
    per_session: Counter[str] = Counter()
    while pool and len(picked) < k:
        mid, score = pool[0], -1.0
        for m in pool:  # best first: a tie goes to the turn ranked higher before the spread
            adjusted = fused[m] * config.session_decay ** per_session[candidates[m].session_id]
            if adjusted > score:
                mid, score = m, adjusted
        picked[mid] = score
        per_session[candidates[mid].session_id] += 1
        pool.remove(mid)
    return picked
