"""Memory in the agent's context: what each step is given, recorded with the step.

For a step's prompts, recall the top items of the session's project,
leaving out the session's own latest turns (they are in the conversation
already), within a count and character budget (`REM_MEMORY_CONTEXT_ITEMS`,
`REM_MEMORY_CONTEXT_CHARS`, `REM_MEMORY_RECENT_TURNS`). The executor
records the result in the step's assistant row (`data.memory`) before the
agent sees it, so a recovered step reuses exactly what the interrupted one
was given, and `rem show` / the console's detail show it to an operator.

The executor never starts a Chroma server for this: with no Chroma running,
the step's memory is recalled from the lexical index and the graph alone.
"""

from __future__ import annotations

import logging
from typing import Any

from backend.core.errors import ChromaUnreachable, RemError
from backend.core.settings import settings
from backend.memory import recall as memory_recall
from backend.memory.text import clip
from backend.runtime.context import Context
from backend.store.db import Conn, Row

log = logging.getLogger("rem.memory")
ITEM_CHARS = 400


def chroma_running(ctx: Context) -> bool:
    """Whether a Chroma server is there to ask (never starts one)."""
    try:
        ctx.chroma(start=False)
    except ChromaUnreachable:
        return False
    return True


# the session's project and its newest turn in one read (recall would read the latter again)
SCOPE_SQL = f"SELECT project, ({memory_recall.TOP_ORD_SQL}) AS top FROM session WHERE id = ?"


def scope_row_sync(conn: Conn, session_id: str) -> Row | None:
    """The session's `SCOPE_SQL` row (None: no such session), for `memory_for_step`'s `scope`."""
    rows = conn.execute(SCOPE_SQL, (session_id, session_id)).fetchall()
    return rows[0] if rows else None


def step_query(prompts: list[str]) -> str | None:
    """The recall query for a step's prompts (None: memory in context is off, or nothing to ask)."""
    query = " ".join(p for p in prompts if p.strip())[: memory_recall.MAX_QUERY_CHARS]
    if settings.memory_context_items <= 0 or not query.strip():
        return None
    return query


def lexical_memory_sync(conn: Conn, session_id: str, query: str, row: Row | None) -> dict[str, Any]:
    """The step's memory with no Chroma to ask, in the caller's read on the database thread.

    `row`: the session's `scope_row_sync` row. Raises what recall meets (see `unavailable`).
    """
    project, asked = _asked(session_id, row)
    result = memory_recall.recall_lexical_sync(conn, query, top_ord=row["top"] if row else None, **asked)
    return _kept(result, project)


def _asked(session_id: str, row: Row | None) -> tuple[str, dict[str, Any]]:
    """The session's project, and what a step's recall asks for there (both recall paths)."""
    project = (row["project"] if row else None) or "default"
    return project, {
        "project": project,
        "k": settings.memory_context_items,
        "exclude_session": session_id,
        "exclude_recent": settings.memory_recent_turns,
    }


async def memory_for_step(
    ctx: Context, session_id: str, prompts: list[str], scope: tuple[Row | None] | None = None
) -> dict[str, Any] | None:
    """The recalled items for a step (None when memory in context is off or the query is empty).

    `scope`: the session's `scope_row_sync` row as the caller already read it
    (in a 1-tuple), saving that read.
    """
    query = step_query(prompts)
    if query is None:
        return None
    db = await ctx.db()
    try:
        if not chroma_running(ctx):  # the scope and the lexical side in one read
            return await db.read_beside(
                lambda c: lexical_memory_sync(
                    c, session_id, query, scope[0] if scope is not None else scope_row_sync(c, session_id)
                )
            )
        row = scope[0] if scope is not None else await db.read_beside(lambda c: scope_row_sync(c, session_id))
        project, asked = _asked(session_id, row)
        result = await memory_recall.recall(ctx, query, top_ord=(row["top"] if row else None,), **asked)
    except Exception as exc:  # memory is a help, not a dependency: the step runs without it
        return unavailable(session_id, exc)
    return _kept(result, project)


def unavailable(session_id: str, exc: BaseException) -> dict[str, Any]:
    """The memory of a step whose recall failed with `exc`: no items, the error named (and logged).

    Any error: a Chroma answer rem does not know must not fail the user's turn.
    """
    known = isinstance(exc, RemError)
    error = str(exc) if known else f"{type(exc).__name__}: {exc}"
    log.warning("memory for %s unavailable: %s", session_id, error, exc_info=not known)
    return {"items": [], "error": error}


def _kept(result: dict[str, Any], project: str) -> dict[str, Any]:
    return {"items": within_budget(result["items"], settings.memory_context_chars), "project": project}


def within_budget(items: list[dict[str, Any]], chars: int) -> list[dict[str, Any]]:
    """The items, best first, clipped, until the character budget is spent."""
    kept: list[dict[str, Any]] = []
    left = chars
    for item in items:
        text = clip(str(item["text"]), min(ITEM_CHARS, left))
        if left <= 0 or not text:
            break
        left -= len(text)
        kept.append(
            {
                "kind": item["kind"],
                "id": item["id"],
                "session_id": item["session_id"],
                "score": item["score"],
                "text": text,
                **({"speaker": item["speaker"]} if item.get("speaker") else {}),
            }
        )
    return kept
