"""`rem replay` as a real subprocess: one JSON document, one-line errors, exit codes."""

from __future__ import annotations

import asyncio
import json

from backend.runtime.context import Context
from backend.summaries import receipts
from tests.helpers import rem_env, run_rem
from tests.summaries import base_metadata, job, row_id, stage_receipt


async def _staged(ctx: Context, sessions: list[str]) -> None:
    db = await ctx.db()
    for sid in sessions:
        metadata = base_metadata(sid)
        await stage_receipt(db, sid, f"summary of {sid}", metadata, now=1_000)
        await ctx.store().upsert([row_id(sid)], [f"summary of {sid}"], [metadata])


def _rem(ctx: Context, chroma_url: str, *args: str) -> tuple[int, str, str]:
    env = rem_env(REM_CHROMA_COLLECTION=ctx.collection, REM_OPERATOR="alice")
    proc = run_rem("replay", *args, "--data", str(ctx.data.root), "--chroma-url", chroma_url, env=env)
    return proc.returncode, proc.stdout, proc.stderr


async def test_dry_run_json_is_one_document_naming_the_differing_keys(ctx: Context, chroma_url: str) -> None:
    await _staged(ctx, ["s1", "s2"])
    await ctx.store().update_metadata([row_id("s2")], [{"memoryCount": 6.0, "graphDigested": True}])
    before = await job(await ctx.db(), "s2")

    rc, out, err = await asyncio.to_thread(_rem, ctx, chroma_url, "--all", "--dry-run", "--json")

    assert rc == 0, err
    doc = json.loads(out)
    assert doc["dry_run"] is True and doc["counters"]["present"] == 1 and doc["counters"]["mismatched"] == 1
    (row,) = doc["rows"]
    assert row["summary_id"] == "summary_s2" and row["outcome"] == "would_replay"
    assert row["keys"] == [
        {
            "key": "memoryCount",
            "reason": "type_differs",
            "expected": 6,
            "actual": 6.0,
            "expected_type": "int",
            "actual_type": "float",
        }
    ]
    assert await job(await ctx.db(), "s2") == before


async def test_replay_repairs_and_a_quarantined_receipt_exits_1(ctx: Context, chroma_url: str) -> None:
    await _staged(ctx, ["s1", "s2"])
    await ctx.store().delete([row_id("s1")])
    db = await ctx.db()
    async with db.tx() as conn:
        await conn.execute("UPDATE summary_job SET result_envelope = x'00ff' WHERE session_id = 's2'")

    rc, out, err = await asyncio.to_thread(_rem, ctx, chroma_url, "summary_s1", "summary_s2")

    assert rc == 1, err
    assert "summary_s2" in out and "quarantined" in out and "replayed 1" in out
    stored = (await ctx.store().get([row_id("s1")]))[row_id("s1")]
    assert receipts.is_present(receipts.decode((await job(db, "s1"))["result_envelope"]), stored)
    actor = await db.scalar("SELECT actor FROM event WHERE kind = 'operator.replay'")
    assert actor == "alice"


async def test_errors_are_one_line_with_the_right_exit_code(ctx: Context, chroma_url: str) -> None:
    await _staged(ctx, ["s1"])
    cases = [
        ((), 2, "SUMMARY_ID"),
        (("summary_missing",), 1, "no staged receipt for summary_missing"),
    ]
    for args, code, message in cases:
        rc, out, err = await asyncio.to_thread(_rem, ctx, chroma_url, *args)
        assert (rc, out) == (code, ""), (args, err)
        assert err.startswith("rem: error: ") and message in err and err.count("\n") == 1, err
    rc, out, err = await asyncio.to_thread(_rem, ctx, "http://127.0.0.1:9", "--all", "--json")
    assert (rc, out) == (3, "") and err.startswith("rem: error: ") and err.count("\n") == 1, err


def _check(ctx: Context, chroma_url: str) -> dict:  # type: ignore[type-arg]
    env = rem_env(REM_CHROMA_COLLECTION=ctx.collection)
    proc = run_rem("check", "--json", "--data", str(ctx.data.root), "--chroma-url", chroma_url, env=env)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def _check_text(ctx: Context, chroma_url: str) -> str:
    env = rem_env(REM_CHROMA_COLLECTION=ctx.collection)
    proc = run_rem("check", "--data", str(ctx.data.root), "--chroma-url", chroma_url, env=env)
    assert proc.returncode == 1, proc.stderr
    return proc.stdout


def _violating(report: dict) -> list[dict]:  # type: ignore[type-arg]
    return [row for f in report["violations"] for row in f["rows"]]


async def test_a_replaced_vector_alone_is_found_by_check_and_repaired_by_replay(
    ctx: Context, chroma_url: str
) -> None:
    await _staged(ctx, ["s1", "s2"])
    store = ctx.store()
    original = (await store.rows([row_id("s1")]))[row_id("s1")]
    forged = [0.0] * len(original.embedding)
    forged[0] = 1.0  # another writer points s1's vector somewhere else; document and metadata untouched
    await store._run(lambda c: c.update(ids=[row_id("s1")], embeddings=[forged]))
    assert (await store.get([row_id("s1")]))[row_id("s1")] == (original.document, original.metadata)

    report = await asyncio.to_thread(_check, ctx, chroma_url)
    assert report["ok"] is False
    (row,) = _violating(report)
    assert row["summary_id"] == "summary_s1"
    assert [(k["key"], k["reason"]) for k in row["keys"]] == [("embedding", "vector_differs")]
    # the text report holds plain values: enums as their values, a key's difference as
    # (key=value, ...), no Python repr (it printed {'summary_id': ...} and <KeyReason...: ...>)
    text = await asyncio.to_thread(_check_text, ctx, chroma_url)
    flat = " ".join(text.split())
    assert "summary_id: summary_s1 session_id: s1 outcome: would_replay verdict: keys_differ" in flat, text
    assert "keys: (key=embedding, reason=vector_differs, expected=" in flat, text
    assert not any(repr_ in text for repr_ in ("{'", "Reason.", "Outcome.", "<")), text

    rc, out, err = await asyncio.to_thread(_rem, ctx, chroma_url, "--all", "--json")
    assert rc == 0, err
    assert json.loads(out)["counters"]["replayed"] == 1
    repaired = (await store.rows([row_id("s1")]))[row_id("s1")]
    assert list(repaired.embedding) == list(original.embedding)
    assert (await asyncio.to_thread(_check, ctx, chroma_url))["ok"] is True


async def test_an_owned_key_attested_absent_is_found_and_removed_foreign_keys_untouched(
    ctx: Context, chroma_url: str
) -> None:
    db = await ctx.db()
    metadata = base_metadata("s1")
    del metadata["keywords"]  # the synthesis found no keywords: the receipt attests their absence
    await stage_receipt(db, "s1", "summary of s1", metadata, now=1_000)
    await ctx.store().upsert([row_id("s1")], ["summary of s1"], [metadata])
    # later, another writer adds the owned key, next to a Dream key
    await ctx.store().update_metadata([row_id("s1")], [{"keywords": ["planted"], "graphDigested": True}])

    report = await asyncio.to_thread(_check, ctx, chroma_url)
    (row,) = _violating(report)
    assert row["keys"][0]["key"] == "keywords" and row["keys"][0]["reason"] == "attested_absent"

    rc, out, err = await asyncio.to_thread(_rem, ctx, chroma_url, "summary_s1", "--json")
    assert rc == 0, err
    (result,) = json.loads(out)["rows"]
    assert result["outcome"] == "replayed"
    _, live = (await ctx.store().get([row_id("s1")]))[row_id("s1")]
    assert "keywords" not in live and live["graphDigested"] is True
    assert (await asyncio.to_thread(_check, ctx, chroma_url))["ok"] is True


async def test_markup_in_chroma_values_prints_as_itself(ctx: Context, chroma_url: str) -> None:
    await _staged(ctx, ["s1"])
    await ctx.store().update_metadata([row_id("s1")], [{"title": "[/oops] [bold]x[/bold] :thumbs_up:"}])
    rc, out, err = await asyncio.to_thread(_rem, ctx, chroma_url, "--all", "--dry-run")
    assert rc == 0 and "Traceback" not in err, err
    flat = " ".join(out.split())
    assert "[/oops]" in flat and "[bold]x[/bold]" in flat and ":thumbs_up:" in flat


def test_markup_in_paths_prints_as_itself(tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "[red]data[/red]"
    assert run_rem("init", "--data", str(root)).returncode == 0
    for command in ("status", "check"):
        proc = run_rem(command, "--data", str(root), env=rem_env(COLUMNS="400"))
        assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
        assert f"data dir {root}" in proc.stdout or f"rem check {root}" in proc.stdout, proc.stdout
