"""`rem reindex`: a data dir written with one embedder is rebuilt with another, from state.db alone."""

from __future__ import annotations

import pytest

from backend import ops
from backend.chroma.embedder import WordLlamaEmbedder
from backend.chroma.ownership import summary_row_id
from backend.core.datadir import DataDir
from backend.core.errors import EmbedderMismatch
from backend.dream.digester import Dreamer
from backend.runtime.context import Context
from backend.summaries import receipts
from backend.summaries.summarizer import Summarizer
from tests.counting_synthesizer import CountingSynthesizer
from tests.summaries import job, seed_session


async def _settled_with(
    data_dir: DataDir, chroma_url: str, collection: str, monkeypatch: pytest.MonkeyPatch, embedder: str
) -> Context:
    monkeypatch.setenv("REM_EMBEDDER", embedder)
    ctx = Context(data_dir, chroma_url=chroma_url, collection=collection)
    await seed_session(await ctx.db(), "s1")
    await seed_session(await ctx.db(), "s2", start=5_000)
    await Summarizer(ctx, once=True, synthesizer=CountingSynthesizer()).run()  # type: ignore[arg-type]
    await Dreamer(ctx, once=True).run()
    return ctx


async def test_reindex_rebuilds_hashing_vectors_with_wordllama_and_loses_nothing(
    data_dir: DataDir, chroma_url: str, collection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await _settled_with(data_dir, chroma_url, collection, monkeypatch, "hashing")
    before = await old.store().get([summary_row_id("s1"), summary_row_id("s2")])
    assert before[summary_row_id("s1")][1]["graphDigested"] is True  # Dream's overlay is there
    turn_ids = [r[0] for r in await (await old.db()).fetchall("SELECT message_id FROM memory_turn")]
    await old.close()

    monkeypatch.setenv("REM_EMBEDDER", "wordllama")
    ctx = Context(data_dir, chroma_url=chroma_url, collection=collection)
    try:
        with pytest.raises(EmbedderMismatch, match="run `rem reindex`"):
            await ctx.store().count()
        with pytest.raises(EmbedderMismatch):
            await ctx.turn_store("default").count()
        embedded: list[str] = []
        real_embed = WordLlamaEmbedder.embed

        def counting_embed(self: WordLlamaEmbedder, texts: list[str]) -> list[list[float]]:
            embedded.extend(texts)
            return real_embed(self, texts)

        monkeypatch.setattr(WordLlamaEmbedder, "embed", counting_embed)
        result = await ops.reindex(ctx)
        monkeypatch.setattr(WordLlamaEmbedder, "embed", real_embed)
        assert result["embedder"] == WordLlamaEmbedder.name and result["dim"] == 256
        assert result["summaries"]["receipts"]["scanned"] == 2
        assert result["summaries"]["receipts"]["quarantined"] == 0
        # each receipt's record of its vector now names the new embedder's vector
        assert result["summaries"]["vector_records"] == {"reissued": 2, "skipped": 0, "unchanged": 0}
        assert result["turns"] == {"collections_dropped": 1, "vectors": len(turn_ids), "pending": 0}

        after = await ctx.store().get([summary_row_id("s1"), summary_row_id("s2")])
        # each summary embedded once: the vector its receipt records is the one its row was written with
        for sid in ("s1", "s2"):
            assert embedded.count(after[summary_row_id(sid)][0] or "") == 1, embedded
        assert ctx.store().forget_kept() == 0  # nothing left behind
        db = await ctx.db()
        for sid in ("s1", "s2"):
            j = await job(db, sid)
            receipt = receipts.decode(j["result_envelope"], j["result_encoding"])
            assert receipts.is_present(receipt, after[summary_row_id(sid)])
            # read with its vector, the row is the one the re-recorded receipt attests
            live = (await ctx.store().rows([summary_row_id(sid)]))[summary_row_id(sid)]
            assert receipts.verify(receipt, live).verdict == receipts.ReceiptVerdict.PRESENT
            # Dream's keys came back from dream_state, equal to what they were
            for key in ("graphDigested", "dreamCompletedRevision", "digestState"):
                assert after[summary_row_id(sid)][1][key] == before[summary_row_id(sid)][1][key]
        raw = await ctx.store()._run(lambda c: c.get(ids=[summary_row_id("s1")], include=["embeddings"]))
        document = after[summary_row_id("s1")][0] or ""
        assert list(raw["embeddings"][0]) == pytest.approx(WordLlamaEmbedder().embed([document])[0], abs=1e-5)
        assert sorted(await ctx.turn_store("default").all_ids()) == sorted(turn_ids)
        meta = await ctx.store()._run(lambda c: c.metadata)
        assert meta["rem:embedder"] == WordLlamaEmbedder.name
        report = await ops.check(ctx, settled=True)
        # (seeded sessions have no admitted inputs: only the Chroma-side findings apply here)
        chroma_side = [
            f
            for f in report["violations"]
            if f["invariant"] in ("4", "9") or "receipt" in f["what"] or "Chroma" in f["what"]
        ]
        assert "chroma" in report["checked"] and chroma_side == []
        # a second run is a no-op in effect: same rows, still verified
        again = await ops.reindex(ctx)
        assert again["turns"]["pending"] == 0 and again["summaries"]["receipts"]["quarantined"] == 0
        assert again["summaries"]["vector_records"] == {"reissued": 0, "skipped": 0, "unchanged": 2}
    finally:
        await ctx.close()
