"""A fleet of real executor daemons runs tool-using turns against a model that reports usage on every
step (tests/hostile_model.py's `tool_turn`, played by the fake OpenAI server): the steps that asked
for tools are counted in the session totals like the final replies, and `rem check --settled` (the
real command, its JSON and its human output) is clean afterwards, on both stores."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from backend.dream.digester import Dreamer
from backend.execution import sessions
from backend.runtime.context import Context
from backend.summaries.summarizer import Summarizer
from tests import hostile_model
from tests.counting_synthesizer import CountingSynthesizer
from tests.fake_openai import FakeOpenAIServer
from tests.helpers import await_until, rem_env, run_rem, spawn_rem

pytestmark = [pytest.mark.both_stores, pytest.mark.slow]

SESSIONS = 4


async def _settled(ctx: Context) -> bool:
    db = await ctx.db()
    running = await db.scalar("SELECT count(*) FROM session_execution")
    waiting = await db.scalar("SELECT count(*) FROM session_input WHERE promoted_seq IS NULL")
    return bool(running == 0 and waiting == 0)


async def test_check_settled_is_clean_after_a_fleet_ran_tool_turns(
    ctx: Context, tools_dir: Path, fake_model: FakeOpenAIServer, chroma_url: str, collection: str
) -> None:
    fake_model.set_default(hostile_model.tool_turn())
    db = await ctx.db()
    for i in range(SESSIONS):
        await sessions.admit(db, f"s{i}", f"Note the standup time ({i}).", input_id=f"in-{i}")
    env = rem_env(
        REM_AGENT="openai",
        REM_CHROMA_AUTOSTART="0",
        REM_CHROMA_URL=chroma_url,
        REM_CHROMA_COLLECTION=collection,
    )
    root = str(ctx.data.root)
    fleet = [
        spawn_rem("daemon", "--role", "executor", "--data", root, env=env, log=ctx.data.root / f"ex{n}.log")
        for n in range(2)
    ]
    try:
        await await_until(lambda: _settled(ctx), timeout=120, interval=0.2, message="the fleet's turns")
    finally:
        for proc in fleet:
            proc.send_signal(signal.SIGTERM)
        for proc in fleet:
            proc.wait(timeout=60)

    # every step reported usage (40 in, 8 of them cached; 9 out, 3 of them reasoning): the call
    # step's and the answer's are both in the totals
    totals = await db.fetchall(
        "SELECT tokens_input, tokens_output, tokens_reasoning, tokens_cache_read FROM session"
    )
    assert [tuple(t) for t in totals] == [(64, 12, 6, 16)] * SESSIONS
    assert await db.scalar("SELECT count(*) FROM tool_call WHERE state = 'completed'") == SESSIONS
    assert len(fake_model.requests()) == 2 * SESSIONS
    # the summaries and Dream of the turns, so nothing is in flight for the settled check
    await Summarizer(ctx, once=True, synthesizer=CountingSynthesizer()).run()
    await Dreamer(ctx, once=True).run()
    checked = run_rem("check", "--settled", "--json", "--data", root, env=env)
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-2000:]
    report = json.loads(checked.stdout)
    assert report["ok"] and "usage" in report["checked"], report
