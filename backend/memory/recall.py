"""Recall: ranked memory items (turns, session summaries, graph facts) for a free-text query.

One query's path, in order (each step names the module that does it):

1. **the query** (`query.parse`): its non-stop words, the Dream concept and
   entity nodes it names, the days it names ("in July 2022", "last week":
   `dates`), and whether it asks when.
2. **the retrievers, side by side** (`recall.retrieve`): on the state store, in
   one read, FTS5 over the project's own turn table (`lexical_search`), the
   turns that mention the query's nodes, the turns whose time words name its
   days, and the typed facts between its entities (`graph_search`); on Chroma,
   at the same time, the query's vector against the project's turn vectors
   and its summaries (`vector_search`).
3. **fusion and expansion** (`fusion.rank_turns`, one more read): one candidate
   per turn, one score (min-max linear or reciprocal rank, times a boost for the
   one speaker the query names), then `expansion`: the second hop through the
   graph from the best turns, the fit of dates, and the spread of the top k
   across sessions.
4. **the result** (`recall.result`): turns, summaries and facts ranked together,
   each with its provenance (the revision it was indexed or written at, the
   retrievers that found it and at what rank, the turns it cites).

A Chroma outage degrades recall to the state store's side and says so in
`degraded`. The knobs are `backend.memory.config.RecallConfig`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from backend.core.errors import BadInput, ChromaUnreachable
from backend.memory import fusion, graph_search, lexical_search, vector_search
from backend.memory.config import RecallConfig, recall_config
from backend.memory.query import Query, parse
from backend.memory.scope import Scope
from backend.runtime.context import Context
from backend.store.db import Conn, Reader, independent_reads_sync, read_together_sync

KINDS = ("turn", "summary", "fact")
RETRIEVERS = ("fts", "dense", "graph", "dates", "summaries", "facts")
MAX_K = 200
MAX_QUERY_CHARS = 4000


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
    asked = parse(query)
    if not _wants_vectors(retrievers, kinds):
        # no vector side to wait for: the whole of recall in one thread hop
        return await db.read_beside(
            lambda c: _recall_lexical_sync(c, asked, scope, config, retrievers, kinds, k, started)
        )
    found = await retrieve(ctx, asked, scope, config, retrievers, kinds)
    found.turns = await db.read_beside(
        lambda c: fusion.rank_turns(c, found.lexical, found.dense_hits or [], asked, scope, config, k)
    )
    return result(asked, scope, k, kinds, found, started)


async def retrieve(
    ctx: Context,
    query: Query,
    scope: Scope,
    config: RecallConfig,
    retrievers: Collection[str],
    kinds: Collection[str],
) -> Found:
    """Every retriever asked, side by side: the state store's in one read on a database thread
    (PostgreSQL: the reading connection's, beside the writes) while the vector side waits on Chroma."""
    db = await ctx.db()
    degraded: list[str] = []
    # the vector side first: its one short read queues ahead of the lexical reads
    (dense_hits, summaries), lexical = await asyncio.gather(
        _vector_side(ctx, query.text, scope, config, retrievers, kinds, degraded),
        db.read_beside(lambda c: _lexical(c, query, scope, config, retrievers, kinds)),
    )
    return Found(lexical, [], dense_hits, summaries, degraded)


def recall_lexical_sync(
    conn: Conn,
    query: str,
    *,
    project: str | None,
    k: int,
    exclude_session: str,
    exclude_recent: int,
    top_ord: int | None,
) -> dict[str, Any]:
    """`recall` with no vector side (no Chroma to ask), for a caller on the database thread:
    the turns and facts of `project`, leaving out `exclude_session`'s `exclude_recent` newest
    turns (its newest being `top_ord`), in the caller's read. Same result shape as `recall`."""
    validate(query, k, KINDS)
    started = time.perf_counter()
    scope = Scope(project, None, exclude_session)
    scope.exclude_from_ord = first_excluded_ord(top_ord, exclude_recent)
    retrievers = ("fts", "graph", "dates", "facts")
    asked = parse(query)
    return _recall_lexical_sync(conn, asked, scope, recall_config(), retrievers, KINDS, k, started)


def _recall_lexical_sync(
    conn: Conn,
    query: Query,
    scope: Scope,
    config: RecallConfig,
    retrievers: Collection[str],
    kinds: Collection[str],
    k: int,
    started: float,
) -> dict[str, Any]:
    """Recall with the state store's retrievers only, in the caller's read."""
    lexical = _lexical(conn, query, scope, config, retrievers, kinds)
    turns = fusion.rank_turns(conn, lexical, [], query, scope, config, k)
    return result(query, scope, k, kinds, Found(lexical, turns, None, None, []), started)


@dataclass
class Found:
    """What the retrievers found: the lexical side's, the fused turns, the vector side's."""

    lexical: dict[str, Any]
    turns: list[dict[str, Any]]
    dense_hits: Any
    summaries: Any
    degraded: list[str]


def result(
    query: Query, scope: Scope, k: int, kinds: Collection[str], found: Found, started: float
) -> dict[str, Any]:
    """Recall's answer: the `k` best items of every kind asked for, and how they were found."""
    items = found.turns + (found.summaries or []) + found.lexical["facts"]
    items.sort(key=lambda item: (-item["score"], item["id"]))
    items = [i for i in items if i["kind"] in kinds][:k]
    return {
        "query": query.text,
        "project": scope.project,
        "session": scope.session_id,
        "k": k,
        "terms": query.terms,
        "items": items,
        "candidates": _candidate_counts(found.lexical, found.dense_hits, found.summaries),
        "degraded": found.degraded,
        "took_ms": round((time.perf_counter() - started) * 1000, 2),
    }


def _wants_vectors(retrievers: Collection[str], kinds: Collection[str]) -> bool:
    """Whether recall asks Chroma anything: dense turns or summaries."""
    return ("dense" in retrievers and "turn" in kinds) or ("summaries" in retrievers and "summary" in kinds)


async def _vector_side(
    ctx: Context,
    query: str,
    scope: Scope,
    config: RecallConfig,
    retrievers: Collection[str],
    kinds: Collection[str],
    degraded: list[str],
) -> tuple[Any, Any]:
    """The scope's summary rows (a state store read), the query vector, then the turn and summary
    searches at once (threads, HTTP)."""
    want_dense = "dense" in retrievers and "turn" in kinds
    want_summaries = "summaries" in retrievers and "summary" in kinds
    # read before anything else is awaited: it queues on the store's thread ahead of the lexical reads
    rows = await vector_search.summary_rows(ctx, scope) if want_summaries else None
    vector = await _settle(_query_vector(ctx, query), degraded)
    if vector is None:
        return None, None
    dense_task = vector_search.dense(ctx, vector, scope, config) if want_dense else None
    summary_task = vector_search.summaries(ctx, vector, scope, config, rows) if want_summaries else None
    return await asyncio.gather(
        _guard(dense_task, degraded, "dense"), _guard(summary_task, degraded, "summaries")
    )


def _candidate_counts(lexical: Mapping[str, Any], dense_hits: Any, summaries: Any) -> dict[str, int | None]:
    """How many candidates each retriever found (None: it did not run, or its side was down)."""
    return {
        "fts": len(lexical["fts"]),
        "dense": None if dense_hits is None else len(dense_hits),
        "graph": len(lexical["graph"]),
        "dates": len(lexical["dates"]),
        "summaries": None if summaries is None else len(summaries),
        "facts": len(lexical["facts"]),
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


# -- the state store side (one thread hop; one read transaction on SQLite) ---------


def _lexical(
    conn: Conn,
    query: Query,
    scope: Scope,
    config: RecallConfig,
    retrievers: Collection[str],
    kinds: Collection[str],
) -> dict[str, Any]:
    """The state store's retrievers, each ranking on its own: they need not see one state, and each
    round of their reads goes to the server together (PostgreSQL: one round trip a round)."""
    turns = "turn" in kinds
    with independent_reads_sync(conn):
        fts, graph, dated, facts = read_together_sync(
            conn,
            [
                lexical_search.fts(conn, query.terms, scope, config)
                if "fts" in retrievers and turns
                else _none({}),
                graph_search.graph_turns(query.nodes, scope)
                if "graph" in retrievers and turns
                else _none({}),
                graph_search.dated_turns(query.spans, scope)
                if "dates" in retrievers and turns
                else _none({}),
                graph_search.facts(query.nodes, scope, config)
                if "facts" in retrievers and "fact" in kinds
                else _none([]),
            ],
        )
    return {"fts": fts, "graph": graph, "dates": dated, "facts": facts}


_T = TypeVar("_T")


def _none(value: _T) -> Reader[_T]:
    """A reader that reads nothing (a retriever left out)."""
    return value
    yield []  # a generator
