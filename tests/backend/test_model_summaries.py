"""The `openai` synthesizer and embedder against a real local endpoint and a real Chroma server."""

from __future__ import annotations

import json

import pytest

from backend.chroma.collection import ChromaStore, EmbeddingFailed
from backend.models.embedder import OpenAIEmbedder
from backend.runtime.context import Context
from backend.summaries.openai_synthesizer import OpenAISynthesizer, parse_synthesis
from backend.summaries.summarizer import MAX_ATTEMPTS, Summarizer
from tests.fake_openai import FakeOpenAIServer, Scenario, bad_api_key, embedding_vector, server_error
from tests.summaries import job, row_id, seed_session

SUMMARY = {
    "title": "Payments service restart",
    "category": "operations",
    "keywords": ["payments", "restart", "Ledger"],
    "summary": "The user asked how to restart the payments service; the assistant gave the steps.",
}


async def _summarize(ctx: Context) -> None:
    await Summarizer(ctx, once=True, synthesizer=OpenAISynthesizer()).run()


async def test_the_model_summary_becomes_the_receipt_and_the_chroma_row(
    ctx: Context, fake_model: FakeOpenAIServer
) -> None:
    fake_model.set_default(Scenario(reply=json.dumps(SUMMARY)))
    db = await ctx.db()
    await seed_session(db, "s1")
    await _summarize(ctx)
    document, metadata = (await ctx.store().get([row_id("s1")]))[row_id("s1")]
    assert document == f"Payments service restart (6 turns)\n{SUMMARY['summary']}"
    assert metadata["title"] == SUMMARY["title"] and metadata["category"] == "operations"
    assert metadata["keywords"] == ["payments", "restart", "ledger"]
    assert metadata["summarizer"] == "openai:gpt-4o-mini"
    assert (await job(db, "s1"))["status"] == "completed"
    request = fake_model.requests()[0]
    assert request.body["response_format"] == {"type": "json_object"} and not request.body.get("stream")
    assert "restart the payments service" in request.messages[1]["content"]
    assert [tuple(r) for r in await db.fetchall("SELECT kind, outcome FROM model_call")] == [
        ("synthesis", "ok")
    ]


@pytest.mark.parametrize(
    "reply",
    ["Here is a summary: the user restarted payments.", '{"title": "t", "summary": ', '["a list"]', "{}"],
    ids=["prose", "truncated", "not-an-object", "missing-keys"],
)
async def test_a_reply_that_is_not_the_json_asked_for_fails_the_job_and_stages_nothing(
    ctx: Context, fake_model: FakeOpenAIServer, reply: str
) -> None:
    fake_model.set_default(Scenario(reply=reply))
    db = await ctx.db()
    await seed_session(db, "s1")
    for attempt in range(1, MAX_ATTEMPTS + 1):
        async with db.tx() as conn:  # skip the retry backoff
            await conn.execute("UPDATE summary_job SET lease_expires_at = NULL")
        await _summarize(ctx)
        j = await job(db, "s1")
        assert j["attempts"] == attempt and j["result_envelope"] is None and j["result_staged_at"] is None
        assert "bad_output" in j["last_error"]
    assert j["status"] == "failed"
    assert await ctx.store().get([row_id("s1")]) == {}
    failures = [
        json.loads(r[0]) for r in await db.fetchall("SELECT data FROM event WHERE kind = 'summary.failed'")
    ]
    assert [f["class"] for f in failures] == ["bad_output"] * MAX_ATTEMPTS and failures[-1]["parked"]


def test_parse_synthesis_accepts_a_fenced_object_only() -> None:
    fenced = "```json\n" + json.dumps(SUMMARY) + "\n```"
    assert parse_synthesis(fenced, 2).title == SUMMARY["title"]
    with pytest.raises(Exception, match="not JSON"):
        parse_synthesis("Sure! " + fenced, 2)


async def test_the_openai_embedder_writes_the_endpoints_vectors_and_retries_5xx(
    ctx: Context, fake_model: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_EMBEDDING_MODEL", "text-embedding-3-small")
    fake_model.push(server_error(503, times=1, path="/v1/embeddings"))
    store = ChromaStore(ctx.chroma_url_now, embedder=OpenAIEmbedder(), collection=ctx.collection + "_e")
    await store.upsert(["a", "b"], ["first document", "second document"], [{"k": 1}, {"k": 2}])
    raw = await store._run(lambda c: c.get(ids=["a", "b"], include=["embeddings"]))
    got = dict(zip(raw["ids"], raw["embeddings"], strict=True))
    assert list(got["a"]) == pytest.approx(embedding_vector("first document", 64), abs=1e-6)
    assert list(got["b"]) == pytest.approx(embedding_vector("second document", 64), abs=1e-6)
    paths = [r.path for r in fake_model.requests()]
    assert paths == ["/v1/embeddings", "/v1/embeddings"]  # one 503, then the batch


async def test_an_embedder_that_cannot_answer_is_a_dependency_down_not_a_crash(
    ctx: Context, fake_model: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_EMBEDDING_MODEL", "text-embedding-3-small")
    fake_model.push(bad_api_key(path="/v1/embeddings"))
    store = ChromaStore(ctx.chroma_url_now, embedder=OpenAIEmbedder(), collection=ctx.collection + "_e")
    with pytest.raises(EmbeddingFailed, match="auth"):
        await store.upsert(["a"], ["doc"], [{"k": 1}])
    assert await store.get(["a"]) == {}
