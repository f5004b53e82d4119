"""Recall's fusion: one score per turn from the retrievers' lists, the named speaker's boost, and the
best turns as items."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backend.memory.config import RecallConfig
from backend.memory.scope import Scope, excluded, in_list
from backend.memory.text import mentions_name
from backend.store.db import Conn


@dataclass
class Candidate:
    """One turn found by at least one retriever."""

    row_id: int
    message_id: str
    session_id: str
    speaker: str = ""
    ranks: dict[str, int] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)


def turn_items(
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
    _add_dense(candidates, rows, dense_hits, scope)
    _add_graph(candidates, rows, lexical["graph"])
    if not candidates:
        return []
    fused = fuse(candidates, config)
    _boost_named_speaker(fused, candidates, query, config)
    return _best_items(conn, candidates, fused, k)


def _best_items(
    conn: Conn, candidates: dict[str, Candidate], fused: dict[str, float], k: int
) -> list[dict[str, Any]]:
    """The `k` best fused turns as items, scored relative to the best (a turn gone since is left out)."""
    top = sorted(fused, key=lambda m: (-fused[m], m))[:k]
    details = _turn_details(conn, top)
    top_score = max(fused.values()) or 1.0
    return [
        _turn_item(candidates[mid], detail, round(fused[mid] / top_score, 6))
        for mid in top
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
        cand = candidates.setdefault(mid, Candidate(row["id"], mid, row["session_id"], row["speaker"]))
        cand.ranks["dense"], cand.scores["dense"] = rank, sim


def _add_graph(
    candidates: dict[str, Candidate], rows: Mapping[str, dict[str, Any]], graph: Mapping[str, float]
) -> None:
    """The graph retriever's turns among the candidates, with their ranks and scores."""
    for rank, (mid, score) in enumerate(sorted(graph.items(), key=lambda kv: -kv[1])):
        row = rows.get(mid)
        if row is None:
            continue
        cand = candidates.setdefault(mid, Candidate(row["id"], mid, row["session_id"], row["speaker"]))
        cand.ranks["graph"], cand.scores["graph"] = rank, score


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
