"""Recall's ranking of turns, in the order it happens (`rank_turns`): the retrievers' lists gathered
into one candidate per turn, fused into one score (times the named speaker's boost), expanded
(`backend.memory.expansion`: the graph hop, the fit of dates, the spread across sessions), and the
best turns built as items."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from backend.memory import expansion
from backend.memory.candidate import Candidate
from backend.memory.config import RecallConfig
from backend.memory.query import Query
from backend.memory.scope import Scope, excluded, in_list
from backend.memory.text import mentions_name
from backend.store.db import Conn


def rank_turns(
    conn: Conn,
    lexical: Mapping[str, Any],
    dense_hits: list[tuple[str, float]],
    query: Query,
    scope: Scope,
    config: RecallConfig,
    k: int,
) -> list[dict[str, Any]]:
    """The best `k` turns as items: gather, fuse, expand, spread across sessions, build."""
    candidates = gather(conn, lexical, dense_hits, scope)
    if not candidates:
        return []
    fused = fuse(candidates, config)
    _boost_named_speaker(fused, candidates, query.text, config)
    expansion.hop(conn, fused, candidates, query, scope, config)
    expansion.fit_dates(conn, fused, candidates, query, config)
    return _items(conn, candidates, expansion.diversify(fused, candidates, config, k))


def gather(
    conn: Conn, lexical: Mapping[str, Any], dense_hits: list[tuple[str, float]], scope: Scope
) -> dict[str, Candidate]:
    """One candidate per turn any turn retriever found, with each retriever's rank and score."""
    candidates: dict[str, Candidate] = {c.message_id: c for c in lexical["fts"].values()}
    rows = _index_rows(conn, [m for m, _ in dense_hits] + list(lexical["graph"]) + list(lexical["dates"]))
    _add_dense(candidates, rows, dense_hits, scope)
    _add_listed(candidates, rows, lexical["graph"], "graph")
    _add_listed(candidates, rows, lexical["dates"], "dates")
    return candidates


def _items(conn: Conn, candidates: dict[str, Candidate], ranked: dict[str, float]) -> list[dict[str, Any]]:
    """The ranked turns as items, scored relative to the best (a turn gone since is left out)."""
    details = _turn_details(conn, list(ranked))
    top_score = max(ranked.values(), default=0.0) or 1.0
    return [
        _turn_item(candidates[mid], detail, round(score / top_score, 6))
        for mid, score in ranked.items()
        if (detail := details.get(mid)) is not None
    ]


def _add_dense(
    candidates: dict[str, Candidate],
    rows: Mapping[str, dict[str, Any]],
    dense_hits: list[tuple[str, float]],
    scope: Scope,
) -> None:
    """The dense retriever's turns among the candidates, with their ranks and similarities."""
    for rank, (mid, sim) in enumerate(dense_hits):
        row = rows.get(mid)
        if (
            row is None
            or row["vector_digest"] != row["digest"]
            or excluded(scope, row["session_id"], row["ord"])
        ):
            continue  # an orphan or stale vector: its turn was re-indexed or removed since
        cand = candidates.setdefault(mid, _candidate(mid, row))
        cand.ranks["dense"], cand.scores["dense"] = rank, sim


def _add_listed(
    candidates: dict[str, Candidate],
    rows: Mapping[str, dict[str, Any]],
    found: Mapping[str, float],
    retriever: str,
) -> None:
    """A graph retriever's turns (message id -> score) among the candidates, with ranks and scores."""
    for rank, (mid, score) in enumerate(sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))):
        row = rows.get(mid)
        if row is not None:
            cand = candidates.setdefault(mid, _candidate(mid, row))
            cand.ranks[retriever], cand.scores[retriever] = rank, score


def _candidate(message_id: str, row: Mapping[str, Any]) -> Candidate:
    """A turn found first by a retriever that named only its message id (its index row read since)."""
    return Candidate(row["id"], message_id, row["session_id"], row["speaker"], time=row["time"])


def _turn_item(cand: Candidate, detail: Mapping[str, Any], score: float) -> dict[str, Any]:
    """One turn as a recall item, with its provenance."""
    mid = cand.message_id
    return {
        "kind": "turn",
        "id": mid,
        "session_id": cand.session_id,
        "project": detail["project"],
        "message_id": mid,
        "time": detail["time"],
        "score": score,
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


def fuse(candidates: Mapping[str, Candidate], config: RecallConfig) -> dict[str, float]:
    """One score per turn: min-max linear fusion or reciprocal rank fusion (config.fusion)."""
    weights = {
        "fts": config.lexical_weight,
        "dense": config.dense_weight,
        "graph": config.graph_weight,
        "dates": config.graph_weight,
    }
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
            f"SELECT id, message_id, session_id, speaker, ord, digest, vector_digest, time FROM memory_turn "
            f"WHERE message_id IN ({in_list(chunk)})",
            chunk,
        ):
            rows[r[1]] = {
                "id": r[0],
                "session_id": r[2],
                "speaker": r[3],
                "ord": r[4],
                "digest": r[5],
                "vector_digest": r[6],
                "time": r[7],
            }
    return rows


def _turn_details(conn: Conn, message_ids: list[str]) -> dict[str, dict[str, Any]]:
    if not message_ids:
        return {}
    out = {}
    for mid, project, role, when, revision, data in conn.execute(
        f"SELECT t.message_id, t.project, t.role, t.time, t.revision, m.data FROM memory_turn AS t "
        f"JOIN session_message AS m ON m.id = t.message_id WHERE t.message_id IN ({in_list(message_ids)})",
        message_ids,
    ):
        parsed = json.loads(data)
        text = parsed.get("text") if isinstance(parsed, dict) else None
        out[mid] = {"project": project, "role": role, "time": when, "revision": revision, "text": text or ""}
    return out
