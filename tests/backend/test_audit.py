"""The audit journal holds: who acted (claimed and OS), refusals journaled, operator events kept,
hash-chained and verified by `rem check`, replay's intent journaled before its Chroma write."""

from __future__ import annotations

import json
import os
import pwd
import stat
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend import ops
from backend.chroma.collection import ChromaStore
from backend.core.errors import LeaseNotFound, Refused, UsageError, WorkerNotFound
from backend.core.settings import OPERATOR_MAX_LENGTH, Settings, SettingsError
from backend.runtime.context import Context
from backend.store import journal_head, maintenance
from backend.store.db import Database
from backend.store.events import (
    KEYED_PREFIX,
    OPERATOR_KINDS,
    append_event,
    chain_link,
    journal_key,
    verify_operator_chain_sync,
)
from tests.helpers import rem_env, run_rem
from tests.summaries import base_metadata, row_id, stage_receipt

ME = pwd.getpwuid(os.geteuid()).pw_name


async def journal(db: Database, *kinds: str) -> list[dict[str, Any]]:
    marks = ",".join("?" * len(kinds))
    rows = await db.fetchall(f"SELECT * FROM event WHERE kind IN ({marks}) ORDER BY id", kinds)
    return [dict(r) for r in rows]


async def _operator_events(db: Database, n: int, *, actor: str = "alice", start: int = 1_000) -> None:
    for i in range(n):
        async with db.tx() as conn:
            await append_event(
                conn,
                kind=OPERATOR_KINDS[i % len(OPERATOR_KINDS)],
                actor=actor,
                target=f"t{i}",
                data={"i": i},
                now=start + i,
            )


async def chain(db: Database) -> dict[str, Any]:
    return await db.read_in_thread(verify_operator_chain_sync)


async def _tamper(db: Database, sql: str, params: tuple[Any, ...] = ()) -> None:
    """What someone with the file (not rem) can do: triggers dropped, rows changed."""
    async with db.tx() as conn:
        await conn.execute("DROP TRIGGER IF EXISTS event_no_update")
        await conn.execute("DROP TRIGGER IF EXISTS event_operator_kept")
        await conn.execute(sql, params)


async def test_operator_events_record_the_os_identity_next_to_the_claimed_operator(
    db_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_OPERATOR", "alice on call")
    ctx = Context(db_ctx.data, start_chroma=False)
    with pytest.raises(LeaseNotFound):
        await ops.release(ctx, "exe_gone")
    (event,) = await journal(await ctx.db(), "operator.refused")
    assert (event["actor"], event["os_uid"], event["os_user"]) == ("alice on call", os.geteuid(), ME)
    await ctx.close()


async def test_a_refused_release_drain_or_resume_leaves_a_journal_row(db_ctx: Context, frozen_clock) -> None:  # type: ignore[no-untyped-def]
    db = await db_ctx.db()
    async with db.tx() as conn:
        await conn.execute("INSERT INTO session (id, time_created, time_updated) VALUES ('s1', 1, 1)")
        await conn.execute(
            "INSERT INTO summary_job (session_id, status, owner_id, epoch, lease_expires_at, "
            "time_created, time_updated) VALUES ('s1', 'in_progress', 'summarizer-x', 3, ?, 1, 1)",
            (frozen_clock.now + 60_000,),
        )
    with pytest.raises(Refused, match="renewed or taken over"):
        await ops.release(db_ctx, "s1", expected_epoch=2)
    with pytest.raises(LeaseNotFound):
        await ops.release(db_ctx, "exe_gone")
    with pytest.raises(WorkerNotFound):
        await ops.drain(db_ctx, "nobody")
    with pytest.raises(Refused, match="not held"):
        await ops.resume(db_ctx, ["s1"])
    refused = await journal(db, "operator.refused")
    assert [(e["target"], json.loads(e["data"])["action"]) for e in refused] == [
        ("s1", "release"),
        ("exe_gone", "release"),
        ("nobody", "drain"),
        ("s1", "resume"),
    ]
    assert "epoch 3, not 2" in json.loads(refused[0]["data"])["reason"]
    assert await db.scalar("SELECT epoch FROM summary_job") == 3  # the refused release changed nothing
    assert await journal(db, "operator.release", "operator.drain", "operator.resume") == []
    assert (await chain(db))["ok"]


async def test_the_chain_links_every_operator_event_and_check_passes(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _operator_events(db, 6)
    rows = await journal(db, *OPERATOR_KINDS)
    assert rows[0]["chain_prev"] is None
    assert all(b["chain_prev"] == a["chain"] for a, b in zip(rows, rows[1:], strict=False))
    result = await chain(db)
    assert {k: result[k] for k in ("ok", "checked", "unchained", "broken", "count")} == {
        "ok": True,
        "checked": 6,
        "unchained": 0,
        "broken": None,
        "count": 6,
    }
    assert result["head"] == rows[-1]["chain"]
    report = await ops.check(db_ctx, verify_chroma=False)
    assert report["ok"] and "audit" in report["checked"]


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        ("UPDATE event SET data = '{\"i\":99}' WHERE id = :victim", "was edited"),
        ("UPDATE event SET actor = 'mallory' WHERE id = :victim", "was edited"),
        ("UPDATE event SET os_user = 'mallory' WHERE id = :victim", "was edited"),
        ("UPDATE event SET time = time + 1 WHERE id = :victim", "was edited"),
        ("DELETE FROM event WHERE id = :victim", "removed, inserted or reordered"),
        ("UPDATE event SET chain = NULL, chain_prev = NULL WHERE id = :victim", "carries no chain link"),
    ],
)
async def test_tampering_with_an_operator_event_is_found_and_named(
    db_ctx: Context, tamper: str, why: str
) -> None:
    db = await db_ctx.db()
    await _operator_events(db, 5)
    ids = [e["id"] for e in await journal(db, *OPERATOR_KINDS)]
    victim = ids[2]
    await _tamper(db, tamper, {"victim": victim})  # type: ignore[arg-type]
    result = await chain(db)
    first = victim if not tamper.startswith("DELETE") else ids[3]
    assert result["ok"] is False and result["broken"]["event_id"] == first
    report = await ops.check(db_ctx, verify_chroma=False)
    (finding,) = [f for f in report["violations"] if f["invariant"] == "8"]
    assert f"broken at event {first}" in finding["what"] and why in finding["what"]


async def test_rem_check_names_the_first_broken_link(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _operator_events(db, 4)
    victim = (await journal(db, *OPERATOR_KINDS))[1]["id"]
    await _tamper(db, "UPDATE event SET actor = 'someone else' WHERE id = ?", (victim,))
    await db_ctx.close()
    proc = run_rem("check", "--json", "--data", str(db_ctx.data.root), env=rem_env())
    assert proc.returncode == 1, proc.stderr
    (finding,) = [f for f in json.loads(proc.stdout)["violations"] if f["invariant"] == "8"]
    assert finding["rows"][0]["event_id"] == victim and "was edited" in finding["what"]


async def test_operator_events_are_never_pruned_nor_deleted(db_ctx: Context, frozen_clock) -> None:  # type: ignore[no-untyped-def]
    db = await db_ctx.db()
    await _operator_events(db, 3, start=1_000)
    async with db.tx() as conn:
        for i in range(5):
            await append_event(conn, kind="worker.started", actor="w", now=2_000 + i)
    frozen_clock.advance(maintenance.retention_ms() * 20)  # everything is far past retention
    assert await maintenance.prune_events(db) == 6  # the five and the schema.migrated row
    kept = [r[0] for r in await db.fetchall("SELECT kind FROM event ORDER BY id")]
    assert kept == [OPERATOR_KINDS[i] for i in range(3)]
    with pytest.raises(Exception, match="audit journal"):
        async with db.tx() as conn:
            await conn.execute("DELETE FROM event WHERE kind LIKE 'operator.%'")
    assert (await chain(db))["ok"]


class JournalWatchingStore(ChromaStore):
    """Records, at the moment of each upsert, which events the journal already holds."""

    def __init__(self, inner: ChromaStore, db: Database) -> None:
        super().__init__(inner._resolve, collection=inner.collection_name)
        self.db = db
        self.seen_at_write: list[list[str]] = []

    async def upsert(self, *args: Any, **kwargs: Any) -> None:
        kinds = [r[0] for r in await self.db.fetchall("SELECT kind FROM event ORDER BY id")]
        self.seen_at_write.append(kinds)
        await super().upsert(*args, **kwargs)


async def test_replay_journals_its_intent_before_writing_chroma_and_its_outcome_after(ctx: Context) -> None:
    db = await ctx.db()
    await stage_receipt(db, "s1", "summary of s1", base_metadata("s1"), now=1_000)  # no Chroma row yet
    watcher = JournalWatchingStore(ctx.store(), db)
    ctx._store = watcher
    result = await ops.replay(ctx, [row_id("s1")])
    assert result["counters"]["replayed"] == 1
    (at_write,) = watcher.seen_at_write
    assert at_write[-2:] == ["operator.replay_intent", "receipt.replaying"]
    kinds = [
        e["kind"] for e in await journal(db, "operator.replay_intent", "receipt.replaying", "operator.replay")
    ]
    assert kinds == ["operator.replay_intent", "receipt.replaying", "operator.replay"]
    (intent,) = await journal(db, "operator.replay_intent")
    assert json.loads(intent["data"])["targets"] == [row_id("s1")]
    assert (await chain(db))["ok"]


async def _recorded(db_ctx: Context, db: Database) -> journal_head.Head:
    head = await journal_head.HeadRecorder(db_ctx.data, db_ctx.store_name).record(db)
    assert head is not None
    assert journal_head.read_heads(db_ctx.data)[db_ctx.store_name] == head
    assert stat.S_IMODE(journal_head.head_file(db_ctx.data).stat().st_mode) == 0o600
    return head


def _audit_findings(report: dict[str, Any]) -> list[str]:
    return [f["what"] for f in report["violations"] if f["invariant"] == "8"]


async def test_removing_the_newest_operator_event_is_found_against_the_recorded_head(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _operator_events(db, 4)
    head = await _recorded(db_ctx, db)
    assert head.count == 4 and head.head == (await journal(db, *OPERATOR_KINDS))[-1]["chain"]
    assert _audit_findings(await ops.check(db_ctx, verify_chroma=False)) == []
    await _operator_events(db, 1, start=5_000)  # appended after the record: still extends it
    assert _audit_findings(await ops.check(db_ctx, verify_chroma=False)) == []
    newest = (await journal(db, *OPERATOR_KINDS))[-2]["id"]  # the newest one the head covers
    await _tamper(db, "DELETE FROM event WHERE id >= ?", (newest,))
    assert (await chain(db))["ok"], "what is left is a sound chain: only the recorded head tells"
    (what,) = _audit_findings(await ops.check(db_ctx, verify_chroma=False))
    assert "holds 3 chained operator events, fewer than the 4" in what and "newest were removed" in what
    # `rem up` keeps the evidence: the shortened journal is not recorded over it
    assert await journal_head.HeadRecorder(db_ctx.data, db_ctx.store_name).record(db) is None
    assert journal_head.read_heads(db_ctx.data)[db_ctx.store_name] == head


async def test_a_journal_re_chained_with_plain_sha256_and_a_forged_uid_is_found(db_ctx: Context) -> None:
    db = await db_ctx.db()
    await _operator_events(db, 3)
    await _recorded(db_ctx, db)
    rows = await journal(db, *OPERATOR_KINDS)
    # the forger rewrites who acted, then re-makes every link with plain SHA-256, as rem would
    async with db.tx() as conn:
        await conn.execute("DROP TRIGGER IF EXISTS event_no_update")
        previous = None
        for row in rows:
            content = (
                row["time"],
                row["kind"],
                row["actor"],
                row["session_id"],
                row["target"],
                row["data"],
                4242,
                "forged",
            )
            link = chain_link(previous, content)
            await conn.execute(
                "UPDATE event SET os_uid = 4242, os_user = 'forged', chain_prev = ?, chain = ? WHERE id = ?",
                (previous, link, row["id"]),
            )
            previous = link
    assert (await chain(db))["ok"], "a re-made plain chain is sound on its own"
    (what,) = _audit_findings(await ops.check(db_ctx, verify_chroma=False))
    assert "differs at operator event 3" in what and "re-chained or rewritten" in what


async def test_a_keyed_journal_cannot_be_re_chained_without_the_key(
    db_ctx: Context, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "journal.key"
    key_file.write_text("k" * 32)
    key_file.chmod(0o600)
    monkeypatch.setenv("REM_JOURNAL_KEY_FILE", str(key_file))
    db = await db_ctx.db()
    await _operator_events(db, 3)
    rows = await journal(db, *OPERATOR_KINDS)
    assert all(r["chain"].startswith(KEYED_PREFIX) for r in rows)
    assert (await chain(db))["ok"] is False  # without the key nothing keyed verifies
    assert (await db.read_in_thread(lambda conn: verify_operator_chain_sync(conn, journal_key())))["ok"]
    # re-made with plain SHA-256 from the second event on: a plain link after a keyed one
    async with db.tx() as conn:
        await conn.execute("DROP TRIGGER IF EXISTS event_no_update")
        previous = rows[0]["chain"]
        for row in rows[1:]:
            content = (
                row["time"],
                row["kind"],
                row["actor"],
                row["session_id"],
                row["target"],
                row["data"],
                0,
                "x",
            )
            link = chain_link(previous, content)
            await conn.execute(
                "UPDATE event SET os_uid = 0, os_user = 'x', chain_prev = ?, chain = ? WHERE id = ?",
                (previous, link, row["id"]),
            )
            previous = link
    (what,) = _audit_findings(await ops.check(db_ctx, verify_chroma=False))
    assert f"broken at event {rows[1]['id']}" in what and "not keyed" in what
    key_file.chmod(0o644)
    with pytest.raises(UsageError, match="REM_JOURNAL_KEY_FILE=.*mode 600"):
        journal_key()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=90))
def test_rem_operator_is_printable_and_at_most_64_characters(raw: str) -> None:
    try:
        value = Settings.operator.read(raw)
    except SettingsError as exc:
        message = str(exc)
        assert message.startswith("REM_OPERATOR=") and "\n" not in message and "\x1b" not in message
        stripped = raw.strip()
        assert len(stripped) > OPERATOR_MAX_LENGTH or not stripped.isprintable()
        return
    if value is None:
        assert not raw.strip()
        return
    assert value == raw.strip() and value.isprintable() and len(value) <= OPERATOR_MAX_LENGTH


def test_a_bad_rem_operator_stops_any_command_in_one_line(tmp_path: Any) -> None:
    for bad in ("alice\nrem: ok", "\x1b[31mroot\x1b[0m", "x" * 65):
        proc = run_rem("status", "--data", str(tmp_path / "d"), env=rem_env(REM_OPERATOR=bad))
        assert proc.returncode == 2
        assert proc.stderr.startswith("rem: error: REM_OPERATOR=") and proc.stderr.count("\n") == 1
        assert "\x1b" not in proc.stderr
