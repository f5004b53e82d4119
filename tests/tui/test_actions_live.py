"""Console actions against live state: replay with a real Chroma server, execution lease release.

Each test drives the console with keys only (select, act, read the modal,
confirm) and then checks the database and Chroma, not the screen alone.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from backend.core import clock
from backend.runtime.context import Context
from backend.store.db import Database
from backend.summaries import receipts
from backend.summaries.summarizer import Summarizer
from tests.counting_synthesizer import CountingSynthesizer
from tests.summaries import job, row_id, seed_session
from tests.tui import scenes
from tests.tui.test_console import (
    SIZE,
    confirm_modal,
    console,
    loaded,
    press_confirm,
    select,
    table,
    until,
    write,
)
from tui.app import ConsoleApp


async def record_verdict(ctx: Context, db: Database, sid: str) -> receipts.Verdict:
    """What the verification pass records: the real verdict of the receipt vs the live row."""
    j = await job(db, sid)
    receipt = receipts.decode(j["result_envelope"], j["result_encoding"])
    live = (await ctx.store().get([row_id(sid)])).get(row_id(sid))
    verdict = receipts.verify(receipt, live)
    detail = verdict.detail()
    async with db.tx() as conn:
        await conn.execute(
            "UPDATE summary_job SET verdict = ?, verdict_detail = ?, verdict_checked_at = ? "
            "WHERE session_id = ?",
            (verdict.verdict, json.dumps(detail) if detail else None, clock.now_ms(), sid),
        )
    return verdict


@pytest.fixture
async def damaged(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Three summarized sessions; s1's owned `category` and s2's `title` were changed in Chroma."""
    monkeypatch.setenv("REM_CHROMA_COLLECTION", ctx.collection)  # the console's Context uses it
    db = await ctx.db()
    for sid in ("s1", "s2", "s3"):
        await seed_session(db, sid)
    await Summarizer(ctx, once=True, synthesizer=CountingSynthesizer()).run()
    store = ctx.store()
    await store.update_metadata([row_id("s1")], [{"category": "something else", "graphDigested": True}])
    await store.update_metadata([row_id("s2")], [{"title": None}])
    for sid in ("s1", "s2", "s3"):
        await record_verdict(ctx, db, sid)
    return {"db": db, "store": store}


def app_for(ctx: Context, **kwargs: Any) -> ConsoleApp:
    return console(ctx.data, chroma_url=ctx.chroma_url, **kwargs)


async def test_replay_selected_shows_the_dry_run_diff_then_repairs_the_row(
    ctx: Context, damaged: dict[str, Any]
) -> None:
    db, store = damaged["db"], damaged["store"]
    async with app_for(ctx).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        receipts_panel = table(app, "receipts")
        assert sorted(receipts_panel.shown_keys()) == [row_id("s1"), row_id("s2")]
        assert receipts_panel.cell_text(row_id("s1"), "keys") == "category"
        await pilot.press("3")
        await select(pilot, receipts_panel, row_id("s1"))
        await pilot.press("r")
        modal = await confirm_modal(pilot)
        assert modal.plan.targets == [row_id("s1")]
        assert (
            'category: receipt "' in modal.plan.preview and '→ Chroma "something else"' in modal.plan.preview
        )
        assert "mismatched 1" in modal.plan.preview  # the library's own dry-run counters
        await press_confirm(pilot)
        log = table(app, "actions")
        await until(pilot, lambda: log.all_records()[0]["outcome"] == "ok", "the replay result", timeout=30)
        assert "replayed 1" in log.all_records()[0]["message"]
        await until(pilot, lambda: row_id("s1") not in receipts_panel.shown_keys(), "the repaired row to go")
    j1 = await job(db, "s1")
    assert j1["verdict"] == "present" and j1["result_last_replayed_at"] is not None
    _, metadata = (await store.get([row_id("s1")]))[row_id("s1")]
    assert metadata["category"] != "something else" and metadata["graphDigested"] is True
    assert (await job(db, "s2"))["verdict"] == "keys_differ"  # only the selected one
    (event,) = await db.fetchall("SELECT * FROM event WHERE kind = 'operator.replay'")
    assert row_id("s1") in event["data"]


async def test_replay_all_names_the_count_and_repairs_every_mismatch(
    ctx: Context, damaged: dict[str, Any]
) -> None:
    db = damaged["db"]
    async with app_for(ctx).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("R")
        modal = await confirm_modal(pilot)
        assert modal.plan.title == "Replay all 2 mismatched receipts"
        assert modal.plan.params == {"summary_ids": None, "all_mismatched": True}
        assert "title: receipt" in modal.plan.preview and "(missing)" in modal.plan.preview
        await press_confirm(pilot)
        await until(
            pilot, lambda: not table(app, "receipts").shown_keys(), "every mismatch repaired", timeout=30
        )
    assert [(await job(db, s))["verdict"] for s in ("s1", "s2", "s3")] == ["present"] * 3


async def test_replay_with_chroma_down_is_refused_before_the_modal(
    ctx: Context, damaged: dict[str, Any]
) -> None:
    db = damaged["db"]
    before = await job(db, "s1")
    app = console(ctx.data, chroma_url="http://127.0.0.1:9")  # nothing listens there
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("R")
        log = table(app, "actions")
        await until(
            pilot,
            lambda: log.all_records() and log.all_records()[0]["outcome"] == "failed",
            "the dry run to fail",
            timeout=30,
        )
        assert "unreachable" in log.all_records()[0]["message"].lower()
        assert not any(type(s).__name__ == "ConfirmScreen" for s in app.screen_stack)
    assert await job(db, "s1") == before


async def test_releasing_an_expired_execution_lease_fences_the_dead_owner(incident_dir: Any) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("2", "l")  # the expired lease is first
        modal = await confirm_modal(pilot)
        assert modal.plan.params == {"lease_id": "exe_0002", "kind": "execution", "expected_epoch": 1}
        await press_confirm(pilot)
        log = table(app, "actions")
        await until(pilot, lambda: log.all_records()[0]["outcome"] == "ok", "the release")
        assert "epoch 1 → 2" in log.all_records()[0]["message"]
        leases = table(app, "leases")
        await until(pilot, lambda: leases.cell_text("execution:exe_0002", "epoch") == "2", "the new epoch")
    conn = sqlite3.connect(incident_dir.state_db)
    try:
        epoch, expires = conn.execute(
            "SELECT epoch, expires_at FROM session_execution WHERE id = 'exe_0002'"
        ).fetchone()
        (data,) = conn.execute("SELECT data FROM event WHERE kind = 'operator.release'").fetchone()
    finally:
        conn.close()
    assert epoch == 2 and expires == scenes.NOW
    assert json.loads(data)["owner_id"] == scenes.EXEC_B and json.loads(data)["owner_alive"] is False


async def test_unknown_lease_by_the_time_of_release_is_a_notification_not_a_crash(incident_dir: Any) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("2", "l")
        await confirm_modal(pilot)
        # the turn completed meanwhile: the execution row is gone
        write(incident_dir, "DELETE FROM session_execution WHERE id = 'exe_0002'")
        await press_confirm(pilot)
        log = table(app, "actions")
        await until(pilot, lambda: log.all_records()[0]["outcome"] == "failed", "the failure")
        assert "no execution lease" in log.all_records()[0]["message"]
        assert app.is_running


async def test_resuming_a_held_session_wakes_its_inputs_and_is_journaled(incident_dir: Any) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("1")  # the held session is in the backlog, after the waiting tool calls
        await select(pilot, table(app, "backlog"), "held:s-tango")
        await pilot.press("u")
        modal = await confirm_modal(pilot)
        assert modal.plan.params == {"session_id": "s-tango"}
        assert "held: auth: HTTP 401" in modal.plan.lines[0]
        await press_confirm(pilot)
        log = table(app, "actions")
        await until(pilot, lambda: log.all_records()[0]["outcome"] == "ok", "the resume")
        assert "resumed s-tango: 2 waiting input(s) woken" in log.all_records()[0]["message"]
        await until(pilot, lambda: "held:s-tango" not in table(app, "backlog").shown_keys(), "the hold gone")
    conn = sqlite3.connect(incident_dir.state_db)
    try:
        held = conn.execute("SELECT held_at FROM session WHERE id = 's-tango'").fetchone()[0]
        woken = conn.execute(
            "SELECT sum(wake_pending) FROM session_input WHERE session_id = 's-tango'"
        ).fetchone()
        (data,) = conn.execute("SELECT data FROM event WHERE kind = 'operator.resume'").fetchone()
    finally:
        conn.close()
    assert held is None and woken[0] == 2 and json.loads(data)["session_id"] == "s-tango"


async def test_resume_on_a_session_that_is_not_held_explains_itself(incident_dir: Any) -> None:
    async with console(incident_dir).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("8")  # sessions: the costliest (s-echo) is not held
        await pilot.press("u")
        await pilot.pause()
        assert len(app.screen_stack) == 1  # no confirmation for a session that is not held
        assert any("select a held session" in str(n.message) for n in app._notifications)
