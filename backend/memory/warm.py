"""Warm a long-lived recall caller at start, so its first query is as fast as its hundredth.

A process's first recall pays for loading the embedder's model (WordLlama: importing it,
numpy and reading its weights, 1-3 s), opening the state store, resolving the Chroma server
and each project's collections. A server that answers recall (`rem mcp`) does that once,
before it says it is ready: one recall of a fixed text per project it serves (with
`--all-projects`, the most recently active ones), a few at most, all kinds. A failure is logged, never fatal: the first real query then pays, or
degrades, as it would have.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

from backend.core.errors import RemError
from backend.memory.recall import recall
from backend.runtime.context import Context

log = logging.getLogger("rem.memory.warm")

WARM_QUERY = "warm up recall"
# the projects warmed at most: each costs a recall and a collection lookup at start
WARM_PROJECTS = 8


async def warm_recall(ctx: Context, projects: Collection[str] | None) -> float:
    """Run one recall per served project (None: every project: the most recently active ones);
    returns the seconds it took."""
    started = time.perf_counter()
    try:
        named = sorted(projects)[:WARM_PROJECTS] if projects is not None else await recent_projects(ctx)
        scopes: list[str | None] = [*named] or [None]  # nothing yet: still the embedder and the imports
    except RemError as exc:  # no data dir yet, a locked store: the first query will say so
        log.warning("recall warm-up failed: %s", exc)
        return time.perf_counter() - started
    for project in scopes:
        try:
            result = await recall(ctx, WARM_QUERY, project=project, k=1)
        except RemError as exc:  # no data dir yet, a locked store: the first query will say so
            log.warning("recall warm-up (project %s) failed: %s", project, exc)
            break
        if result["degraded"]:
            log.warning("recall warm-up (project %s) degraded: %s", project, "; ".join(result["degraded"]))
    took = time.perf_counter() - started
    log.info("recall warmed in %.2f s", took)
    return took


# each project's last activity; a scan of session, once, at start (ms at 100 000 sessions)
RECENT_PROJECTS_SQL = "SELECT project FROM session GROUP BY project ORDER BY max(time_updated) DESC LIMIT ?"


async def recent_projects(ctx: Context) -> list[str]:
    """The most recently active projects, at most `WARM_PROJECTS` (each has its own turn collection)."""
    db = await ctx.db()
    rows = await db.fetchall_beside(RECENT_PROJECTS_SQL, (WARM_PROJECTS,))
    return [str(row["project"]) for row in rows if row["project"] is not None]
