"""import -> index -> recall, in-process on a real Chroma: by meaning, by keyword, scoped by project."""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from backend import ops
from backend.core.datadir import DataDir
from backend.core.errors import BadInput, SessionNotFound
from backend.dream.digester import Dreamer
from backend.runtime.context import Context
from backend.summaries.summarizer import Summarizer
from tests import pg
from tests.helpers import counter_drift
from tests.summaries import shared_embedder

# recall's reads go to both stores in rounds (`read_together_sync`): one pipeline each on PostgreSQL
pytestmark = pytest.mark.both_stores

LINES = [
    ("ops", "deploy", "d-1", "user", "Maya", "We moved the payments service to the new Kubernetes cluster."),
    ("ops", "deploy", "d-2", "assistant", "Bot", "Noted; retire the old cluster once the replicas catch up."),
    ("ops", "pets", "p-1", "user", "Maya", "My dog Biscuit loves running on the beach every morning."),
    ("ops", "pets", "p-2", "assistant", "Bot", "Sand and waves, a great start of the day for him."),
    ("ops", "food", "f-1", "user", "Ravi", "I baked sourdough bread with rye flour yesterday."),
    ("home", "money", "h-1", "user", "Sam", "The payments for the mortgage are due on the first."),
]


def write_jsonl(path: Path, rows: list[dict[str, Any]] | None = None) -> Path:
    rows = rows or [
        {
            "project": p,
            "session": s,
            "id": i,
            "role": r,
            "speaker": sp,
            "text": t,
            "time": 1_700_000_000_000 + n,
        }
        for n, (p, s, i, r, sp, t) in enumerate(LINES)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def settle(ctx: Context) -> None:
    """Summaries, Dream and the index, as the daemons do them."""
    await Summarizer(ctx, once=True).run()
    await Dreamer(ctx, once=True).run()


async def import_and_settle(ctx: Context, tmp_path: Path) -> Context:
    result = await ops.import_file(ctx, write_jsonl(tmp_path / "chats.jsonl"))
    assert result["ok"] and result["written"] == len(LINES)
    await settle(ctx)
    return ctx


@pytest.fixture
async def imported_own(ctx: Context, tmp_path: Path) -> Context:
    """LINES imported and settled in this test's own store and Chroma collection: for a test that
    writes (a re-summarized session, a rewritten summary row)."""
    return await import_and_settle(ctx, tmp_path)


@dataclasses.dataclass
class Settled:
    """LINES imported and settled once in a module (per store): a closed data dir, its
    PostgreSQL database (None on SQLite) and its Chroma collection, which no test writes."""

    data: DataDir
    db_name: str | None
    collection: str


@pytest.fixture(scope="module")
def settled_sets(request: pytest.FixtureRequest) -> Iterator[dict[str, Settled]]:
    """The module's settled imports by store, made on first use; their databases dropped at its end."""
    made: dict[str, Settled] = {}
    yield made
    for store, kept in made.items():
        if kept.db_name is not None:
            pg.drop_database(pg.store_server(store, request), kept.db_name)


async def _settled(
    store: str, sets: dict[str, Settled], request: pytest.FixtureRequest, chroma_url: str
) -> Settled:
    if store not in sets:
        root = request.getfixturevalue("tmp_path_factory").mktemp(f"imported-{store}")
        server = pg.store_server(store, request) if store.startswith("postgres") else None
        db_name = pg.fresh_database(server) if server is not None else None
        collection = f"t_{uuid.uuid4().hex[:12]}"
        ctx = Context(
            DataDir(root / "data"),
            chroma_url=chroma_url,
            collection=collection,
            db_url=server.url(db_name) if server is not None and db_name is not None else None,
        )
        try:
            await ctx.db()
            await import_and_settle(ctx, root)
        finally:
            await ctx.close()  # nothing holds the store open: it is copied per test
        sets[store] = Settled(ctx.data, db_name, collection)
    return sets[store]


@pytest.fixture
async def imported(
    store: str,
    settled_sets: dict[str, Settled],
    request: pytest.FixtureRequest,
    chroma_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Context]:
    """A Context of this test's own over a copy of the module's settled import (its data dir, and
    on PostgreSQL a database made from the settled one as a template), on the shared collection:
    for a test that only reads (import and settle cost ~0.75 s a test, 16 tests a store)."""
    kept = await _settled(store, settled_sets, request, chroma_url)
    data = DataDir(tmp_path / "data")
    shutil.copytree(kept.data.root, data.root, ignore=shutil.ignore_patterns("*-shm"))
    db_url, server, copy = None, None, f"t_{uuid.uuid4().hex[:12]}"
    if kept.db_name is not None:
        server = pg.store_server(store, request)
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {copy} TEMPLATE {kept.db_name}")
        db_url = server.url(copy)
        monkeypatch.setenv("REM_DB_URL", db_url)  # as the `db_url` fixture: rem processes use it too
    context = Context(data, chroma_url=chroma_url, collection=kept.collection, db_url=db_url)
    # the configured embedder loaded once per test process, as a daemon loads it once (WordLlama's
    # weights: ~0.15 s a Context); the warming test builds Contexts of its own, which load theirs
    context._embedder = shared_embedder()
    try:
        await context.db()
        yield context
    finally:
        await context.close()
        if server is not None:
            pg.drop_database(server, copy)
    drift = counter_drift(data.state_db)
    assert not drift, f"status counters drifted from their rows: {drift}"


def _turns(result: dict[str, Any]) -> list[str]:
    return [i["message_id"] for i in result["items"] if i["kind"] == "turn"]


async def test_recall_finds_a_turn_by_meaning_with_no_shared_word(imported: Context) -> None:
    result = await ops.recall(imported, "puppy playing at the seaside", project="ops", k=3, kinds=("turn",))
    assert result["terms"] == ["puppy", "playing", "seaside"]
    assert result["candidates"]["fts"] == 0  # no indexed turn shares a word with the query
    assert _turns(result)[0] == "p-1"
    top = result["items"][0]
    assert top["provenance"]["found_by"] == ["dense"] and top["speaker"] == "Maya"
    assert top["text"].startswith("My dog Biscuit") and top["session_id"] == "pets"
    assert top["provenance"]["revision"].startswith("sha256:")


@pytest.mark.both_stores
async def test_recall_finds_a_turn_by_keyword(imported: Context) -> None:
    result = await ops.recall(imported, "sourdough", project="ops", k=5)
    assert _turns(result)[0] == "f-1"
    assert "fts" in result["items"][0]["provenance"]["found_by"]


@pytest.mark.both_stores
async def test_recall_is_scoped_by_project(imported: Context) -> None:
    ops_only = await ops.recall(imported, "payments due", project="ops", k=10, kinds=("turn",))
    home_only = await ops.recall(imported, "payments due", project="home", k=10, kinds=("turn",))
    everywhere = await ops.recall(imported, "payments due", all_projects=True, k=10, kinds=("turn",))
    assert "h-1" not in _turns(ops_only) and {i["project"] for i in ops_only["items"]} == {"ops"}
    assert _turns(home_only) == ["h-1"]
    assert {"h-1", "d-1"} <= set(_turns(everywhere))
    default = await ops.recall(imported, "payments due", k=10)
    assert default["project"] == "default" and default["items"] == []


@pytest.mark.both_stores
async def test_recall_returns_summaries_and_session_scope(imported: Context) -> None:
    result = await ops.recall(imported, "dog on the beach", project="ops", k=10)
    kinds = {i["kind"] for i in result["items"]}
    assert {"turn", "summary"} <= kinds
    summary = next(i for i in result["items"] if i["kind"] == "summary")
    assert summary["id"].startswith("summary_") and summary["provenance"]["revision"].startswith("sha256:")
    scoped = await ops.recall(imported, "cluster", session_id="deploy", k=10)
    assert scoped["project"] == "ops" and {i["session_id"] for i in scoped["items"]} == {"deploy"}


async def test_bad_recall_input_is_refused_in_one_line(imported: Context) -> None:
    with pytest.raises(BadInput, match="empty"):
        await ops.recall(imported, "   ")
    with pytest.raises(BadInput, match="--k 0 is out of range"):
        await ops.recall(imported, "x", k=0)
    with pytest.raises(SessionNotFound, match="no session 'nope'"):
        await ops.recall(imported, "x", session_id="nope")
    with pytest.raises(BadInput, match="malformed project"):
        await ops.recall(imported, "x", project="bad project")


@pytest.mark.both_stores
async def test_recall_without_chroma_degrades_to_lexical(imported: Context) -> None:
    offline = Context(
        imported.data, start_chroma=False, collection=imported.collection, db_url=imported.db_url
    )
    try:
        result = await ops.recall(offline, "sourdough", project="ops")
    finally:
        await offline.close()
    assert _turns(result)[0] == "f-1"
    assert any(d.startswith("dense:") for d in result["degraded"])


async def test_import_twice_changes_nothing(ctx: Context, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "chats.jsonl")
    first = await ops.import_file(ctx, path)
    db = await ctx.db()
    before = [
        tuple(r)
        for r in await db.fetchall("SELECT id, session_id, seq, data FROM session_message ORDER BY id")
    ]
    second = await ops.import_file(ctx, path)
    after = [
        tuple(r)
        for r in await db.fetchall("SELECT id, session_id, seq, data FROM session_message ORDER BY id")
    ]
    assert (first["written"], second["written"], second["already_imported"]) == (6, 0, 6)
    assert before == after
    sessions = {r[0]: r[1] for r in await db.fetchall("SELECT id, project FROM session")}
    assert sessions == {"deploy": "ops", "pets": "ops", "food": "ops", "money": "home"}


async def test_a_bad_line_leaves_its_whole_session_out_and_names_the_line(
    ctx: Context, tmp_path: Path
) -> None:
    rows = [
        {"project": "p", "session": "good", "id": "g-1", "role": "user", "text": "fine", "time": 1},
        {"project": "p", "session": "bad", "id": "b-1", "role": "user", "text": "fine too", "time": 1},
        {"project": "p", "session": "bad", "id": "b-2", "role": "robot", "text": "wrong role", "time": 2},
        {
            "project": "p",
            "session": "bad",
            "id": "b-3",
            "role": "user",
            "text": "after the bad one",
            "time": 3,
        },
    ]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    with path.open("a") as handle:
        handle.write('{"session": "bad", "id": "b-4", "role": "user", "text": 5, "time": 4}\n[1, 2]\n')
    result = await ops.import_file(ctx, path)
    assert not result["ok"] and result["written"] == 1 and result["sessions_skipped"] == ["bad"]
    assert [(e["line"], e["error"]) for e in result["errors"]] == [
        (3, "role 'robot' must be user or assistant"),
        (5, "text must be non-empty text"),
        (6, "a line must be a JSON object, not list"),
    ]
    db = await ctx.db()
    assert await db.scalar("SELECT count(*) FROM session_message WHERE session_id = 'bad'") == 0
    assert await db.scalar("SELECT count(*) FROM session WHERE id = 'bad'") == 0
    # the file fixed, the same import completes the session
    fixed = write_jsonl(
        tmp_path / "fixed.jsonl", [r if r["id"] != "b-2" else {**r, "role": "assistant"} for r in rows]
    )
    again = await ops.import_file(ctx, fixed)
    assert again["ok"] and again["written"] == 3 and again["already_imported"] == 1


async def test_import_refuses_an_id_that_names_another_message(ctx: Context, tmp_path: Path) -> None:
    await ops.import_file(ctx, write_jsonl(tmp_path / "a.jsonl"))
    clash = [
        {"project": "ops", "session": "pets", "id": "p-1", "role": "user", "text": "different", "time": 5}
    ]
    result = await ops.import_file(ctx, write_jsonl(tmp_path / "b.jsonl", clash))
    assert result["errors"] == [
        {"line": 1, "session": "pets", "error": "id 'p-1' already names a different message"}
    ]


@pytest.mark.both_stores
async def test_imported_sessions_pass_rem_check_once_settled(imported: Context) -> None:
    report = await ops.check(imported, settled=True)
    assert report["ok"], report["violations"]


async def test_recall_returns_graph_facts_in_scope_with_the_turns_they_cite(
    ctx: Context, tmp_path: Path
) -> None:
    rows = [
        {"project": p, "session": s, "id": i, "role": "user", "text": t, "time": 1_700_000_000_000 + n}
        for n, (p, s, i, t) in enumerate(
            [
                ("infra", "db", "i-1", "The Billing Service depends on Postgres for every invoice."),
                ("infra", "db", "i-2", "Lunch was late today."),
                ("lab", "db2", "l-1", "The Billing Service uses Redis in the lab."),
            ]
        )
    ]
    assert (await ops.import_file(ctx, write_jsonl(tmp_path / "facts.jsonl", rows)))["ok"]
    await settle(ctx)
    result = await ops.recall(ctx, "what does the Billing Service need?", project="infra", k=10)
    facts = [i for i in result["items"] if i["kind"] == "fact"]
    assert [f["text"] for f in facts] == ["Billing Service depends on Postgres"]
    fact = facts[0]
    assert fact["project"] == "infra" and fact["session_id"] == "db"
    assert fact["provenance"]["cites"] == ["i-1"] and fact["provenance"]["found_by"] == ["graph"]
    lab = await ops.recall(ctx, "what does the Billing Service need?", project="lab", k=10)
    assert [i["text"] for i in lab["items"] if i["kind"] == "fact"] == ["Billing Service uses Redis"]


async def test_summaries_ranked_by_id_equal_chromas_filtered_search(imported: Context) -> None:
    # recall ranks a small project's summaries among its own rows, fetched by id
    vector = (imported.embedder().embed(["dog on the beach"]))[0]
    db = await imported.db()
    ids = [f"summary_{r[0]}" for r in await db.fetchall("SELECT id FROM session WHERE project = 'ops'")]
    by_id = await imported.store().nearest_among([*ids, "summary_nope"], vector, 5)
    filtered = await imported.store().query(vector, 5, {"project": "ops"})
    assert [h[0] for h in by_id] == [h[0] for h in filtered] and len(by_id) == 3
    assert [round(h[1], 4) for h in by_id] == [round(h[1], 4) for h in filtered]
    assert [(h[2], h[3]) for h in by_id] == [(h[2], h[3]) for h in filtered]
    assert await imported.store().nearest_among([], vector, 5) == []


@pytest.mark.both_stores
async def test_a_large_projects_summaries_equal_chromas_filtered_search_on_every_path(
    imported: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a project past SUMMARIES_BY_ID is answered from the whole collection's nearest rows when
    # enough of them are its own (first the fewest, then as many as its share needs), else by
    # Chroma's filtered search: whichever path answers, the same rows
    from backend.memory import vector_search
    from backend.memory.config import recall_config
    from backend.memory.scope import Scope

    monkeypatch.setattr(vector_search, "SUMMARIES_BY_ID", 0)
    monkeypatch.setattr(vector_search, "SUMMARIES_BY_ID_MAX", 0)
    # 4 sessions, 3 in ops, 1 in home: first the nearest row; then, for home (a quarter of the
    # sessions, 0.5 x 4 rows), the nearest 2; ops (0.5 x 4/3 rows: not past the first) is filtered
    monkeypatch.setattr(vector_search, "SUMMARIES_WIDE_MIN", 1)
    monkeypatch.setattr(vector_search, "SUMMARIES_WIDE_MARGIN", 0.5)
    config = dataclasses.replace(recall_config(), summaries=1)
    store = imported.store()
    calls: list[str] = []
    query, nearest = store.query, store.nearest

    async def counted_query(embedding: Any, n: int, where: Any = None) -> Any:
        calls.append("filtered" if where is not None else "first")
        return await query(embedding, n, where)

    async def counted_nearest(embedding: Any, n: int, where: Any = None) -> Any:
        calls.append("wide")
        return await nearest(embedding, n, where)

    monkeypatch.setattr(type(store), "query", lambda self, *a, **kw: counted_query(*a, **kw))
    monkeypatch.setattr(type(store), "nearest", lambda self, *a, **kw: counted_nearest(*a, **kw))
    answered_by = set()
    texts = ("dog on the beach", "mortgage payments", "sourdough bread", "kubernetes cluster", "rent")

    async def same_as_filtered() -> None:
        for text in texts:
            vector = imported.embedder().embed([text])[0]
            for project in ("ops", "home"):
                calls.clear()
                hits = await vector_search.summary_hits(imported, vector, Scope(project), config)
                answered_by.add(calls[-1] if calls else "by id")
                expected = await query(vector, 1, {"project": project})
                assert [h[0] for h in hits] == [h[0] for h in expected], (text, project, calls)
                # Chroma's float32 distance, or the same ranked here from the fetched vectors
                assert all(abs(h[1] - e[1]) < 1e-4 for h, e in zip(hits, expected, strict=True))
                assert [(h[2], h[3]) for h in hits] == [(h[2], h[3]) for h in expected]

    await same_as_filtered()
    assert answered_by == {"first", "wide", "filtered"}
    # a project of at most SUMMARIES_BY_ID_MAX sessions: the wide query where it costs less than
    # fetching the project's rows by id, by id where not, and by id when the wide one falls short
    monkeypatch.setattr(vector_search, "SUMMARIES_BY_ID_MAX", 10)
    monkeypatch.setattr(vector_search, "BY_ID_ROW_MS", 1.0)
    answered_by.clear()
    await same_as_filtered()
    assert answered_by == {"wide", "by id"}


async def test_a_session_scoped_dense_search_by_id_equals_chromas_filtered_search(
    imported: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `rem recall --session` ranks the session's own turn vectors, fetched by id; past
    # SESSION_BY_ID_MAX turns it falls back to Chroma's filtered search: the same rows either way
    from backend.memory import vector_search
    from backend.memory.config import recall_config
    from backend.memory.scope import Scope

    store = imported.turn_store("ops")
    for query in ("dog on the beach", "moving the payments service", "bread"):
        vector = imported.embedder().embed([query])[0]
        filtered = await store.nearest(vector, 10, {"sessionId": "deploy"})
        scope = Scope("ops", "deploy", None)
        by_id = await vector_search.dense(imported, vector, scope, recall_config())
        assert [h[0] for h in by_id] == [h[0] for h in filtered]
        assert {h[0] for h in by_id} == {"d-1", "d-2"}  # the session's turns, no other
        assert [round(h[1], 4) for h in by_id] == [round(1.0 - h[1], 4) for h in filtered]
        monkeypatch.setattr(vector_search, "SESSION_BY_ID_MAX", 1)  # "deploy" has 2 turns: filtered
        fallback = await vector_search.dense(imported, vector, scope, recall_config())
        assert fallback == [(i, 1.0 - d) for i, d in filtered]
        monkeypatch.setattr(vector_search, "SESSION_BY_ID_MAX", 300)
    assert await store.nearest_by_id([], vector, 5) == []
    assert await store.nearest_by_id(["nope"], vector, 5) == []


async def test_warming_a_recall_caller_loads_its_embedder_and_opens_its_store(imported: Context) -> None:
    """`rem mcp` warms before it answers `initialize`: after `warm_recall` the embedder's model is
    loaded and the store open, so the first query pays for neither; a failure is not fatal."""
    from backend.chroma.embedder import WordLlamaEmbedder
    from backend.memory.warm import warm_recall

    fresh = Context(
        imported.data, chroma_url=imported.chroma_url, collection=imported.collection, db_url=imported.db_url
    )
    try:
        assert fresh._embedder is None and fresh._db is None
        await warm_recall(fresh, {"ops", "home"})
        embedder = fresh._embedder
        assert embedder is not None and fresh._db is not None
        if isinstance(embedder, WordLlamaEmbedder):
            assert embedder._model is not None
        assert set(fresh._turn_stores) == {"ops", "home"}
        found = await ops.recall(fresh, "puppy at the seaside", project="ops", k=3)
        assert _turns(found)[0] == "p-1"
    finally:
        await fresh.close()
    everywhere = Context(
        imported.data, chroma_url=imported.chroma_url, collection=imported.collection, db_url=imported.db_url
    )
    try:
        await warm_recall(everywhere, None)  # --all-projects: the most recently active projects
        assert set(everywhere._turn_stores) == {"ops", "home"}
    finally:
        await everywhere.close()
    nowhere = DataDir(imported.data.root.parent / "nowhere")
    gone = Context(nowhere, read_only=True, start_chroma=False, db_url=None)
    try:
        assert await warm_recall(gone, None) >= 0  # no data dir: logged, not raised
    finally:
        await gone.close()


def _summary_text(result: dict[str, Any], session_id: str) -> str:
    return str(
        next(i["text"] for i in result["items"] if i["kind"] == "summary" and i["session_id"] == session_id)
    )


async def test_a_resummarized_session_is_recalled_with_its_new_summary_not_the_kept_one(
    imported_own: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # recall keeps the summary rows it fetched under their job's version (`vector_search.summary_rows`):
    # the next recall fetches nothing, and a session summarized again is fetched again
    store = imported_own.store()
    fetches: list[int] = []
    run = store._run

    async def counted(fn: Any) -> Any:
        fetches.append(1)
        return await run(fn)

    monkeypatch.setattr(store, "_run", counted)
    first = await ops.recall(imported_own, "dog on the beach", project="ops", k=10)
    before = _summary_text(first, "pets")
    assert before == (await store.get(["summary_pets"]))["summary_pets"].document
    fetches.clear()
    assert (await ops.recall(imported_own, "dog on the beach", project="ops", k=10))["items"] == first[
        "items"
    ]
    assert fetches == []  # every summary row was kept: no request to Chroma's summary collection
    line = {"project": "ops", "session": "pets", "id": "p-3", "role": "user", "speaker": "Maya"}
    line.update(text="Biscuit also chases the seagulls along the harbor wall.", time=1_700_000_000_100)
    assert (await ops.import_file(imported_own, write_jsonl(tmp_path / "more.jsonl", [line])))["written"] == 1
    await settle(imported_own)
    after = (await store.get(["summary_pets"]))["summary_pets"].document
    assert after != before and "seagulls" in str(after)
    again = await ops.recall(imported_own, "dog on the beach", project="ops", k=10)
    assert _summary_text(again, "pets") == after


async def test_a_summary_row_is_fetched_afresh_while_its_job_is_leased(imported_own: Context) -> None:
    # a writer rewrites the row under a summary_job lease, and releases it only once the row reads
    # back: a row read while its job is leased is not kept, so the rewrite shows on the next recall
    from backend.store.db import execute

    store, db = imported_own.store(), await imported_own.db()
    first = await ops.recall(imported_own, "dog on the beach", project="ops", k=10)
    async with db.tx() as conn:
        await execute(
            conn,
            "UPDATE summary_job SET owner_id = 'a-writer', epoch = epoch + 1, lease_expires_at = ? "
            "WHERE session_id = 'pets'",
            (2**62,),
        )
    assert _summary_text(await ops.recall(imported_own, "dog on the beach", project="ops", k=10), "pets") == (
        _summary_text(first, "pets")
    )
    row = (await store.get(["summary_pets"]))["summary_pets"]
    await store.upsert(["summary_pets"], ["Biscuit, rewritten: the beach, every morning."], [row.metadata])
    during = await ops.recall(imported_own, "dog on the beach", project="ops", k=10)
    assert _summary_text(during, "pets") == "Biscuit, rewritten: the beach, every morning."
