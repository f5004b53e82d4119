"""The memory commands' library calls: `ops.recall`, `ops.import_file`, `ops.list_projects`,
`ops.show_session`."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from backend.core.errors import BadInput, NotFound, OutOfReach, SessionNotFound
from backend.execution import importer
from backend.execution.sessions import validate_id
from backend.memory import recall as memory_recall
from backend.runtime.context import Context
from backend.store.db import Database, Row


async def recall(
    ctx: Context,
    query: str,
    *,
    project: str | None = None,
    session_id: str | None = None,
    k: int = 10,
    all_projects: bool = False,
    kinds: Collection[str] = memory_recall.KINDS,
    projects: Collection[str] | None = None,
) -> dict[str, Any]:
    """Ranked memory items for `query`, in one project (default `default`), one session, or all.

    `projects` keeps the caller to those projects (an API token): another project is refused,
    another project's session is not found, and with none named the only one reached is used.
    """
    if project is not None:
        validate_id("project", project, "--project")
        if all_projects:
            raise BadInput("--project and --all-projects contradict each other: pass one of them")
    if session_id is not None:
        validate_id("session id", session_id, "--session")
    memory_recall.validate(query, k, kinds)
    if projects is not None:
        project, all_projects = _in_reach(project, session_id, all_projects, projects)
    db = await ctx.db()
    if session_id is not None:
        owner = await db.scalar("SELECT project FROM session WHERE id = ?", (session_id,))
        if owner is None or (projects is not None and owner not in projects):
            raise SessionNotFound(
                f"no session {session_id!r} in {ctx.data.root}; check the id (`rem status`)"
            )
        if project is not None and owner != project:
            raise BadInput(f"session {session_id!r} is in project {owner!r}, not {project!r}: drop --project")
        project = owner
    scope = None if all_projects else (project or "default")
    result = await memory_recall.recall(ctx, query, project=scope, session_id=session_id, k=k, kinds=kinds)
    # nothing found: say whether that is because turns wait for the summarizer and Dream to index them
    result["not_indexed"] = None if result["items"] else await not_indexed(db, scope, session_id)
    return result


def _in_reach(
    project: str | None, session_id: str | None, all_projects: bool, projects: Collection[str]
) -> tuple[str | None, bool]:
    """The project a recall kept to `projects` searches (None with a session: the session's own)."""
    if all_projects:
        raise OutOfReach("recall across every project needs a caller that reaches every project")
    if project is not None and project not in projects:
        raise OutOfReach(f"project {project!r} is not one this caller may use; name one it reaches")
    if project is None and session_id is None:
        if len(projects) != 1:
            raise BadInput(f"name the project to recall from (one of {', '.join(sorted(projects))})")
        project = next(iter(projects))
    return project, False


# The raw turns (user prompts, completed replies) of a scope's sessions that the recall index
# lacks. Only sessions whose index can be behind are read (a summary still due, or Dream not at
# the published revision), so an indexed project costs an index scan of its sessions, not its turns.
NOT_INDEXED_SQL = """
SELECT count(*) AS turns, count(DISTINCT m.session_id) AS sessions FROM session_message AS m
WHERE m.session_id IN (
    SELECT s.id FROM session AS s
    LEFT JOIN summary_job AS j ON j.session_id = s.id
    LEFT JOIN dream_state AS d ON d.session_id = s.id
    WHERE {scope} (j.session_id IS NULL OR j.dirty_seq > j.clean_seq OR d.indexed_revision IS NULL
        OR d.input_revision IS NULL OR d.indexed_revision <> d.input_revision))
AND m.type IN ('user', 'assistant') AND (m.type = 'user' OR json_extract(m.data, '$.status') = 'completed')
AND NOT EXISTS (SELECT 1 FROM memory_turn AS t WHERE t.message_id = m.id)
"""


async def not_indexed(db: Database, project: str | None, session_id: str | None) -> dict[str, int]:
    """How many raw turns (in how many sessions) of a recall's scope are not in the recall index yet."""
    if session_id is not None:
        scope, params = "s.id = :scope AND", {"scope": session_id}
    elif project is not None:
        scope, params = "s.project = :scope AND", {"scope": project}
    else:
        scope, params = "", {}
    row = await db.fetchone(NOT_INDEXED_SQL.format(scope=scope), params)
    return {"turns": int(row["turns"]) if row else 0, "sessions": int(row["sessions"]) if row else 0}


async def list_projects(ctx: Context, *, projects: Collection[str] | None = None) -> dict[str, Any]:
    """Every project (or those of `projects`) with its session count, indexed turns and last activity."""
    db = await ctx.db()
    where, params = _in_projects("s.project", projects)
    # turns counted per session through memory_turn's session index, once (a count per project
    # scanned the whole table for each: minutes at 1 000 000 turns and a thousand projects)
    rows = await db.fetchall(
        "SELECT s.project, count(*) AS sessions, max(s.time_updated) AS last_active, "
        "coalesce(sum(t.n), 0) AS turns_indexed FROM session AS s "
        "LEFT JOIN (SELECT session_id, count(*) AS n FROM memory_turn GROUP BY session_id) AS t "
        f"ON t.session_id = s.id {where} GROUP BY s.project ORDER BY s.project",
        params,
    )
    return {"projects": [dict(r) for r in rows]}


async def show_session(ctx: Context, session_id: str, *, limit: int = 200) -> dict[str, Any]:
    """A session's transcript (newest `limit` messages) with its project and Dream/index state."""
    validate_id("session id", session_id, "SESSION")
    db = await ctx.db()
    session = await db.fetchone(
        "SELECT id, project, title, message_count, turn_count, time_created, time_updated FROM session "
        "WHERE id = ?",
        (session_id,),
    )
    if session is None:
        raise SessionNotFound(f"no session {session_id!r} in {ctx.data.root}; check the id (`rem status`)")
    rows = await db.fetchall(
        "SELECT * FROM (SELECT id, type, seq, time_created, data FROM session_message WHERE session_id = ? "
        "ORDER BY seq DESC LIMIT ?) ORDER BY seq",
        (session_id, limit),
    )
    messages = []
    for r in rows:
        data = json.loads(r["data"])
        messages.append(
            {"id": r["id"], "type": r["type"], "seq": r["seq"], "time": r["time_created"], "data": data}
        )
    dream = await db.fetchone(
        "SELECT input_revision, completed_revision, indexed_revision, digest_state FROM dream_state "
        "WHERE session_id = ?",
        (session_id,),
    )
    return {"session": dict(session), "messages": messages, "dream": dict(dream) if dream else None}


async def import_file(
    ctx: Context,
    path: Path,
    *,
    progress: importer.Progress | None = None,
    stop: importer.Stop | None = None,
) -> dict[str, Any]:
    """`rem import`: conversations from JSON Lines (validated per line, all or nothing per session,
    idempotent on ids); `stop()` ends it between two transactions."""
    ctx.require_writable("import")
    return await importer.import_file(await ctx.db(), path, actor=ctx.operator, progress=progress, stop=stop)


def _in_projects(column: str, projects: Collection[str] | None) -> tuple[str, dict[str, str]]:
    """A `WHERE` clause keeping rows of `projects` (None: every project), and its parameters."""
    if projects is None:
        return "", {}
    names = {f"scope{i}": p for i, p in enumerate(sorted(projects))}
    marks = ", ".join(f":{name}" for name in names) or "NULL"
    return f"WHERE {column} IN ({marks})", names


async def graph_neighbors(
    ctx: Context,
    node: str,
    *,
    project: str | None = None,
    limit: int = 25,
    projects: Collection[str] | None = None,
) -> dict[str, Any]:
    """The Dream graph around a node: its edges (both ways) with labels, kinds, weights, sessions.

    `node` is a node id (`entity:caroline`, `concept:garden`, `turn:<message id>`) or a plain
    label, looked up as an entity, then a concept. `projects` limits what is seen to those
    projects' edges: a node with none there is not found, and names no session outside them.
    """
    if not isinstance(node, str) or not node.strip():
        raise BadInput("name a graph node: an id like entity:caroline, or a label like Caroline")
    if not 1 <= limit <= 500:
        raise BadInput(f"limit {limit} is out of range: ask for 1 to 500 edges")
    db = await ctx.db()
    found = await _graph_node(db, node.strip())
    missing = NotFound(f"no graph node {node!r}; try an entity or concept named in a conversation")
    if found is None:
        raise missing
    scope = [project] if project else None
    if projects is not None:
        scope = [p for p in (scope or projects) if p in projects]
    where, params = _in_projects("s.project", scope)
    edges = await db.fetchall(
        "SELECT e.src, e.dst, e.kind, e.weight, e.session_id, s.project, n.label AS other_label, n.kind AS other_kind "
        "FROM graph_edge AS e JOIN session AS s ON s.id = e.session_id "
        "JOIN graph_node AS n ON n.id = CASE WHEN e.src = :id THEN e.dst ELSE e.src END "
        f"{where or 'WHERE TRUE'} AND (e.src = :id OR e.dst = :id) "
        "ORDER BY e.weight DESC, e.src, e.dst LIMIT :limit",
        {"id": found["id"], "limit": limit, **params},
    )
    if projects is not None:
        if not edges:
            raise missing
        home = await db.scalar("SELECT project FROM session WHERE id = ?", (found["session_id"],))
        if home not in projects:
            found["session_id"] = None  # a session outside the scope is never named
    return {"node": found, "edges": [_edge(r, found["id"]) for r in edges]}


async def _graph_node(db: Database, key: str) -> dict[str, Any] | None:
    """The node `key` names: an id, or a label looked up as an entity, then a concept."""
    candidates = [key] if ":" in key else [f"entity:{key.casefold()}", f"concept:{key.casefold()}"]
    for candidate in candidates:
        found = await db.fetchone(
            "SELECT id, kind, label, session_id FROM graph_node WHERE id = ?", (candidate,)
        )
        if found is not None:
            return dict(found)
    return None


def _edge(row: Row, node_id: str) -> dict[str, Any]:
    out = row["src"] == node_id
    return {
        "direction": "out" if out else "in",
        "kind": row["kind"],
        "other": row["dst"] if out else row["src"],
        "other_label": row["other_label"],
        "other_kind": row["other_kind"],
        "weight": row["weight"],
        "session_id": row["session_id"],
        "project": row["project"],
    }
