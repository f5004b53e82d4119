"""The memory graph Dream builds from a session's raw turns, written idempotently.

Nodes (`graph_node`, ids are deterministic so a re-ingest can only update):

* `session:<sid>` (kind `session`) and `turn:<message_id>` (kind `turn`):
  owned by the session, stamped with the revision that wrote them;
* `concept:<key>` and `entity:<key>`: shared by every session that mentions
  them (`session_id` NULL), keyed by the casefolded NFC term;
* `date:<YYYY-MM-DD>`, `date:<YYYY-MM>`, `date:<YYYY>` (kind `date`, shared):
  the days, months and years a turn's time expressions name, resolved
  against the turn's own time (`backend.memory.dates`: "yesterday" said on
  8 May 2023 is `date:2023-05-07`); ISO ids, so a span of time is one range
  of graph_edge's dst index.

Edges (`graph_edge`, key `(src, dst, kind, session_id)`; the session is the
provenance): `has_turn` (session -> turn), `follows` (turn -> previous turn),
`mentions` (turn -> concept/entity, weight = count), `on` (turn -> date), `about` / `involves`
(session -> concept / entity), and typed entity relations (`uses`,
`depends_on`, `is_a`, `part_of`, `has_part`, `replaces`, `co_occurs`).

A new revision of a session replaces its turn/mention structure by
difference, not by rewriting it: the chunks upsert only rows that are new or
whose content (label, data, weight) changed, stamping them with the revision
that wrote them, so a session that gained one turn costs a few row writes,
not a rewrite of its whole graph (which made the WAL, and Dream's write
time, grow with session length). Re-running a revision after a crash finds
its rows already there and writes nothing twice. The sweep, in the same
transaction that attests R, deletes the session's edges and turn nodes that
R's plan does not contain (a turn superseded or edited away), and then the
shared nodes no edge reaches any more. A row's `revision` is therefore the
revision that last created or changed it; until the attestation commits,
rows of the previous revision remain visible.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiosqlite

from backend.dream.extractor import Extraction, Term
from backend.memory import dates
from backend.store.db import execute, executemany, fetchall, fetchone

TURN_LABEL_CHARS = 80

UPSERT_OWNED_NODE = """
INSERT INTO graph_node (id, kind, label, session_id, data, revision, time_created, time_updated)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET label = excluded.label, data = excluded.data,
    revision = excluded.revision, time_updated = excluded.time_updated
WHERE graph_node.label IS NOT excluded.label OR graph_node.data IS NOT excluded.data
"""
# shared nodes keep the label their first writer gave them; nothing else to update
INSERT_SHARED_NODE = """
INSERT INTO graph_node (id, kind, label, session_id, data, revision, time_created, time_updated)
VALUES (?, ?, ?, NULL, '{}', NULL, ?, ?)
ON CONFLICT (id) DO NOTHING
"""
UPSERT_EDGE = """
INSERT INTO graph_edge (src, dst, kind, session_id, weight, revision, time_created)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (src, dst, kind, session_id) DO UPDATE SET weight = excluded.weight,
    revision = excluded.revision
WHERE graph_edge.weight IS NOT excluded.weight
"""


@dataclass(frozen=True)
class Node:
    id: str
    kind: str
    label: str
    session_id: str | None = None
    data: str = "{}"


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    kind: str
    weight: float = 1.0


@dataclass
class Chunk:
    """Rows written in one transaction; edges only reach nodes of this or earlier chunks."""

    nodes: list[Node]
    edges: list[Edge]

    def __len__(self) -> int:
        return len(self.nodes) + len(self.edges)


def session_node_id(session_id: str) -> str:
    return f"session:{session_id}"


def turn_node_id(message_id: str) -> str:
    return f"turn:{message_id}"


def _turn_label(text: Any) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= TURN_LABEL_CHARS else flat[: TURN_LABEL_CHARS - 1] + "…"


def _shared(term: Term) -> Node:
    return Node(term.node_id, term.kind, term.label)


def _turn_node(session_id: str, turn: Mapping[str, Any]) -> Node:
    data = {"role": turn["role"], "time": turn["time"], "chars": len(str(turn.get("text") or ""))}
    return Node(
        turn_node_id(turn["id"]),
        "turn",
        _turn_label(turn.get("text")),
        session_id,
        json.dumps(data, sort_keys=True, ensure_ascii=False),
    )


def plan_nodes(
    session_id: str, title: str, turns: Sequence[Mapping[str, Any]], extraction: Extraction
) -> tuple[list[Node], dict[str, Node]]:
    """The session's own nodes (session, then turns) and the shared nodes by id."""
    session = Node(
        session_node_id(session_id),
        "session",
        title or session_id,
        session_id,
        json.dumps({"turns": len(turns)}),
    )
    nodes = [session] + [_turn_node(session_id, turn) for turn in turns]
    shared: dict[str, Node] = {}
    terms = [t for te in extraction.turns for t in te.mentions] + list(extraction.topics)
    terms += [t for r in extraction.relations for t in (r.src, r.dst)]
    for term in terms:
        shared.setdefault(term.node_id, _shared(term))
    for _, spans in turn_days(turns):
        for span in spans:
            for node in span.node_ids():
                shared.setdefault(node, Node(node, "date", _date_label(node)))
    return nodes, shared


def turn_days(turns: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[dates.DaySpan]]]:
    """Each turn's id and the spans of days its time expressions name, said at the turn's time."""
    return [(str(t["id"]), dates.resolve(str(t.get("text") or ""), int(t["time"]))) for t in turns]


def _date_label(node_id: str) -> str:
    """'7 May 2023', 'May 2023' or '2023' for a `date:` node id."""
    return dates.span_of_node(node_id).words()


def _turn_chain(sid: str, turns: Sequence[Mapping[str, Any]]) -> list[Edge]:
    """The session has each turn; each turn follows the one before it."""
    edges: list[Edge] = []
    previous: str | None = None
    for turn in turns:
        node = turn_node_id(turn["id"])
        edges.append(Edge(sid, node, "has_turn"))
        if previous is not None:
            edges.append(Edge(node, previous, "follows"))
        previous = node
    return edges


def plan_edges(session_id: str, turns: Sequence[Mapping[str, Any]], extraction: Extraction) -> list[Edge]:
    """Every edge of the session's graph, in a stable order."""
    sid = session_node_id(session_id)
    edges = _turn_chain(sid, turns)
    for te in extraction.turns:
        for term, count in sorted(te.mentions.items(), key=lambda item: item[0].node_id):
            edges.append(Edge(turn_node_id(te.turn_id), term.node_id, "mentions", float(count)))
    for turn_id, spans in turn_days(turns):
        nodes = dict.fromkeys(node for span in spans for node in span.node_ids())
        edges += [Edge(turn_node_id(turn_id), node, "on") for node in nodes]
    for term, count in sorted(extraction.topics.items(), key=lambda item: item[0].node_id):
        edges.append(Edge(sid, term.node_id, "about" if term.kind == "concept" else "involves", float(count)))
    for rel, count in sorted(
        extraction.relations.items(),
        key=lambda item: (item[0].src.node_id, item[0].kind, item[0].dst.node_id),
    ):
        edges.append(Edge(rel.src.node_id, rel.dst.node_id, rel.kind, float(count)))
    return edges


def plan_chunks(
    session_id: str, title: str, turns: Sequence[Mapping[str, Any]], extraction: Extraction, chunk_rows: int
) -> list[Chunk]:
    """The session's graph split into transactions of about `chunk_rows` rows.

    Each chunk carries the shared nodes its edges reach: another session's
    sweep may delete a shared node that no edge reaches yet, so a chunk never
    relies on one written by an earlier transaction.
    """
    owned, shared = plan_nodes(session_id, title, turns, extraction)
    rows: list[Node | Edge] = [*owned, *plan_edges(session_id, turns, extraction)]
    size = max(1, chunk_rows)
    chunks = []
    for start in range(0, len(rows), size):
        part = rows[start : start + size]
        edges = [r for r in part if isinstance(r, Edge)]
        needed = sorted({end for e in edges for end in (e.src, e.dst) if end in shared})
        chunks.append(Chunk([r for r in part if isinstance(r, Node)] + [shared[i] for i in needed], edges))
    return chunks


async def write_chunk(
    conn: aiosqlite.Connection, session_id: str, revision: str, chunk: Chunk, now: int
) -> None:
    """Upsert one chunk's rows (inside the caller's transaction); idempotent per revision."""
    owned = [n for n in chunk.nodes if n.session_id is not None]
    shared = [n for n in chunk.nodes if n.session_id is None]
    await executemany(
        conn,
        UPSERT_OWNED_NODE,
        [(n.id, n.kind, n.label, n.session_id, n.data, revision, now, now) for n in owned],
    )
    await executemany(conn, INSERT_SHARED_NODE, [(n.id, n.kind, n.label, now, now) for n in shared])
    await executemany(
        conn, UPSERT_EDGE, [(e.src, e.dst, e.kind, session_id, e.weight, revision, now) for e in chunk.edges]
    )


@dataclass(frozen=True)
class Plan:
    """The keys a revision's graph consists of: what its sweep keeps."""

    turn_nodes: frozenset[str]
    edges: frozenset[tuple[str, str, str]]


def plan_keys(chunks: Sequence[Chunk]) -> Plan:
    turns = frozenset(n.id for c in chunks for n in c.nodes if n.kind == "turn")
    edges = frozenset((e.src, e.dst, e.kind) for c in chunks for e in c.edges)
    return Plan(turns, edges)


async def sweep_session(conn: aiosqlite.Connection, session_id: str, plan: Plan) -> dict[str, int]:
    """Delete the session's edges and turn nodes not in `plan`, then orphaned shared nodes."""
    stale_edges = [
        (r["src"], r["dst"], r["kind"])
        for r in await fetchall(
            conn, "SELECT src, dst, kind FROM graph_edge WHERE session_id = ?", (session_id,)
        )
        if (r["src"], r["dst"], r["kind"]) not in plan.edges
    ]
    await executemany(
        conn,
        "DELETE FROM graph_edge WHERE src = ? AND dst = ? AND kind = ? AND session_id = ?",
        [(*key, session_id) for key in stale_edges],
    )
    stale_turns = [
        r["id"]
        for r in await fetchall(
            conn, "SELECT id FROM graph_node WHERE session_id = ? AND kind = 'turn'", (session_id,)
        )
        if r["id"] not in plan.turn_nodes
    ]
    await executemany(
        conn,
        "DELETE FROM graph_node WHERE id = ? AND session_id = ?",
        [(node, session_id) for node in stale_turns],
    )
    orphans = 0
    for end in sorted({end for key in stale_edges for end in key[:2]}):
        orphans += await execute(
            conn,
            "DELETE FROM graph_node WHERE id = ? AND session_id IS NULL "
            "AND NOT EXISTS (SELECT 1 FROM graph_edge WHERE src = ?) "
            "AND NOT EXISTS (SELECT 1 FROM graph_edge WHERE dst = ?)",
            (end, end, end),
        )
    return {"edges_removed": len(stale_edges), "turns_removed": len(stale_turns), "orphans_removed": orphans}


async def session_graph_counts(conn: aiosqlite.Connection, session_id: str) -> dict[str, int]:
    """How many nodes and edges the session owns."""
    row = await fetchone(
        conn,
        "SELECT (SELECT count(*) FROM graph_node WHERE session_id = :sid) AS nodes, "
        "(SELECT count(*) FROM graph_edge WHERE session_id = :sid) AS edges",
        {"sid": session_id},
    )
    assert row is not None  # a SELECT without FROM returns one row
    return {"nodes": int(row["nodes"]), "edges": int(row["edges"])}
