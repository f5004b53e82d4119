"""The SIGKILL matrix of a tool call's life: real executors, rem's demo MCP server over stdio.

Each case admits one prompt the offline agent answers with one call of an effect class (a
find: `read`; a note: `idempotent`; a send: `effect`, allowed here so it runs without an
approval), kills the executor with SIGKILL at one point of the call's life, and lets a second
executor take the turn over:

* `arguments`: the call is durable (`pending`), nothing started (`tools.after_insert`);
* `running`: `running` and the key committed, the request not sent (`tools.after_start`);
* `sent`: the request is at the server (its delay; the kill comes when its log says `start`);
* `result`: the result came back, not committed (`tools.after_result`);
* `committed`: the result committed, the next model step not asked (`tools.after_finish`).

What must hold, counted from the tool server's own log, not rem's rows: an effect is never
started twice unless an operator's retry is journaled (a `running` or later effect becomes
`unknown`, the session held, and the operator resolves it with the real `rem resolve`); a read
or idempotent call is re-run with the same key and completes; exactly one completed reply
answers the input; `rem check --settled` (its library call) is clean. SQLite runs the whole
matrix; PostgreSQL runs the effect column (the class whose duplicate would be a real harm).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backend import ops
from backend.dream.digester import Dreamer
from backend.execution import sessions
from backend.programs.demo_tools import server_config
from backend.runtime.context import Context
from backend.store.db import Database
from backend.summaries.summarizer import Summarizer
from tests.counting_synthesizer import CountingSynthesizer
from tests.helpers import await_until, rem_env, run_rem, spawn_rem, wait_until

POINTS = {
    "arguments": "tools.after_insert",
    "running": "tools.after_start",
    "sent": None,  # killed while the server works on it
    "result": "tools.after_result",
    "committed": "tools.after_finish",
}
PROMPTS = {
    "read": "Find the notes about the standup.",
    "idempotent": "Please note that the standup moved to 10:30.",
    "effect": "Send the weekly report to bob.",
}
TOOLS = {"read": "notes_search", "idempotent": "notes_add", "effect": "outbox_send"}
# how an operator resolves the unknown outcome each point leaves for an effect (None: none left)
RESOLUTION = {
    "arguments": None,
    "running": "--retry",
    "sent": "--done",
    "result": "--done",
    "committed": None,
}
DELAY_MS = 1500


@dataclass
class Case:
    root: Path
    tools: Path
    env: dict[str, str]

    def log(self) -> list[dict[str, Any]]:
        path = self.tools / "tools.log.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def starts(self, tool: str) -> list[dict[str, Any]]:
        return [e for e in self.log() if e["tool"] == tool and e["phase"] == "start"]

    def spawn(self, name: str, **extra: str) -> subprocess.Popen[bytes]:
        return spawn_rem(
            "daemon",
            "--role",
            "executor",
            "--data",
            str(self.root),
            env={**self.env, **extra},
            log=self.root / f"{name}.log",
        )


def _case(ctx: Context, tmp_path: Path) -> Case:
    tools = tmp_path / "tools"
    config = tmp_path / "mcp.json"
    server = server_config(tools, effect_delay_ms=DELAY_MS, delay_ms=DELAY_MS)
    rem = {"tools": {"demo.outbox_send": {"permission": "allow"}}}
    config.write_text(json.dumps({"mcpServers": {"demo": server}, "rem": rem}))
    env = rem_env(
        REM_MCP_CONFIG=str(config),
        REM_EXECUTION_LEASE_MS="1500",
        REM_AGENT_DELAY_MS="0",
        REM_CHROMA_AUTOSTART="0",
        REM_LOG="1",
        REM_TEST_MODE="1",
        REM_OPERATOR="alice",
    )
    if ctx.db_url:
        env["REM_DB_URL"] = ctx.db_url
    return Case(root=ctx.data.root, tools=tools, env=env)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _settled(db: Database) -> bool:
    """Nothing left to run: no execution but a parked one, no input waiting to be promoted."""
    running = await db.scalar(
        "SELECT count(*) FROM session_execution WHERE parked IS NULL OR parked = 'decided'"
    )
    waiting = await db.scalar("SELECT count(*) FROM session_input WHERE promoted_seq IS NULL")
    return running == 0 and waiting == 0


async def _wait_settled(db: Database, what: str) -> None:
    await await_until(lambda: _settled(db), timeout=120, interval=0.2, message=what)


def _kill_victim(case: Case, point: str, tool: str) -> None:
    fault = POINTS[point]
    victim = case.spawn("victim", **({"REM_FAULTS": fault} if fault else {}))
    try:
        if fault is None:
            wait_until(lambda: case.starts(tool), timeout=120, message=f"{tool} started at the server")
            os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(timeout=120) == -signal.SIGKILL, (case.root / "victim.log").read_text()[-3000:]
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


async def sigkill_a_call(ctx: Context, tmp_path: Path, point: str, effect: str) -> None:
    db = await ctx.db()
    case = _case(ctx, tmp_path)
    tool = TOOLS[effect]
    if effect == "read":  # something for the search to find
        (case.tools).mkdir(parents=True, exist_ok=True)
        (case.tools / "notes.jsonl").write_text(
            json.dumps({"id": "n0", "key": None, "text": "standup at 10"}) + "\n"
        )
    await sessions.admit(db, "s1", PROMPTS[effect], input_id="in-1")
    _kill_victim(case, point, tool)
    rescuer = case.spawn("rescuer")
    try:
        await _wait_settled(db, "the takeover to finish or park")
        call = await db.fetchone("SELECT * FROM tool_call")
        assert call is not None and call["tool"] == f"demo.{tool}"
        resolution = RESOLUTION[point] if effect == "effect" else None
        if resolution is not None:
            await _resolve(db, case, call, resolution)
    finally:
        _stop(rescuer)
    await _verify(db, case, call, point, effect)
    # the summary and Dream of the turn, so nothing is in flight for the settled check
    await Summarizer(ctx, once=True, synthesizer=CountingSynthesizer()).run()
    await Dreamer(ctx, once=True).run()
    report = await ops.check(ctx, settled=True)
    assert report["ok"], json.dumps(report["violations"], indent=1)[:4000]


async def _resolve(db: Database, case: Case, call: Any, flag: str) -> None:
    """The effect's outcome is unknown: the session is held, and an operator decides (the real CLI)."""
    assert call["state"] == "unknown" and call["effect"] == "effect"
    assert await db.scalar("SELECT held_reason FROM session WHERE id = 's1'") == "tool_outcome_unknown"
    args = ["resolve", call["id"], flag, "--data", str(case.root)]
    if flag == "--done":
        args += ["--result", "the outbox shows it sent"]
    proc = run_rem(*args, env=case.env)
    assert proc.returncode == 0, proc.stderr
    await _wait_settled(db, "the resolved turn to finish")


async def _verify(db: Database, case: Case, call: Any, point: str, effect: str) -> None:
    final = await db.fetchone("SELECT * FROM tool_call WHERE id = ?", (call["id"],))
    assert final is not None and final["state"] == "completed", dict(final or {})
    starts = case.starts(TOOLS[effect])
    assert {s["key"] for s in starts} == {final["idempotency_key"]}  # every run, one key
    if effect == "effect":
        retried = final["retries"]
        assert len(starts) <= 1 + retried, starts  # never started twice without a journaled retry
        assert len(starts) == 1
        assert len((case.tools / "outbox.jsonl").read_text().splitlines()) == 1
    if effect == "idempotent":
        assert len((case.tools / "notes.jsonl").read_text().splitlines()) == 1
    replies = await db.fetchall(
        "SELECT data FROM session_message WHERE session_id = 's1' AND type = 'assistant' "
        "AND json_extract(data, '$.status') = 'completed'"
    )
    assert len(replies) == 1 and json.loads(replies[0][0])["answers"] == ["in-1"]
    assert await db.scalar("SELECT held_at FROM session WHERE id = 's1'") is None


@pytest.mark.parametrize("effect", list(PROMPTS))
@pytest.mark.parametrize("point", list(POINTS))
async def test_sigkill_at_each_point_of_a_call(ctx: Context, tmp_path: Path, point: str, effect: str) -> None:
    await sigkill_a_call(ctx, tmp_path, point, effect)


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
@pytest.mark.parametrize("point", list(POINTS))
async def test_sigkill_at_each_point_of_an_effect_on_postgresql(
    ctx: Context, tmp_path: Path, point: str
) -> None:
    assert ctx.db_url
    await sigkill_a_call(ctx, tmp_path, point, "effect")


async def test_an_approval_request_survives_sigkills_and_runs_once_approved(
    ctx: Context, tmp_path: Path
) -> None:
    """`ask` (the effect's default): the turn parks; SIGKILLing its executor, and another pass of
    another executor, leave the request as it was; approved, the send runs once."""
    db = await ctx.db()
    case = _case(ctx, tmp_path)
    config = Path(case.env["REM_MCP_CONFIG"])
    config.write_text(json.dumps({**json.loads(config.read_text()), "rem": {}}))  # the default: ask
    await sessions.admit(db, "s1", PROMPTS["effect"], input_id="in-1")
    victim = case.spawn("victim")
    try:
        await await_until(
            lambda: db.scalar("SELECT count(*) FROM session_execution WHERE parked IS NOT NULL"),
            timeout=120,
            message="the turn to park for approval",
        )
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=60)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    once = run_rem("daemon", "--role", "executor", "--once", "--data", str(case.root), env=case.env)
    assert once.returncode == 0, once.stderr[-2000:]
    assert await db.scalar("SELECT state FROM tool_call") == "awaiting_approval"
    assert await db.scalar("SELECT held_reason FROM session WHERE id = 's1'") == "tool_awaiting_approval"
    assert case.starts("outbox_send") == []
    call_id = await db.scalar("SELECT id FROM tool_call")
    assert run_rem("approve", call_id, "--data", str(case.root), env=case.env).returncode == 0
    done = run_rem("daemon", "--role", "executor", "--once", "--data", str(case.root), env=case.env)
    assert done.returncode == 0, done.stderr[-2000:]
    await _verify(db, case, await db.fetchone("SELECT * FROM tool_call"), "arguments", "effect")
