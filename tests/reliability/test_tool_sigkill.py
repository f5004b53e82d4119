"""The SIGKILL matrix of a tool call's life: real executors, rem's demo MCP server over stdio.

A column is one effect class (a find: `read`; a note: `idempotent`; a send: `effect`, allowed
here so it runs without an approval), driven in one data dir against one tool server's files:
one session per point, each admitted with a prompt the offline agent answers with one call of
that class, taken by its own executor (on a long lease, so the next victim never takes it) and
killed by SIGKILL at its point, in turn; then the dead owners' leases are released, as an
operator would, and one rescuer executor takes all five turns over:

* `arguments`: the call is durable (`pending`), nothing started (`tools.after_insert`);
* `running`: `running` and the key committed, the request not sent (`tools.after_start`);
* `sent`: the request is at the server (its delay; the kill comes when its log says `start`);
* `result`: the result came back, not committed (`tools.after_result`);
* `committed`: the result committed, the next model step not asked (`tools.after_finish`).

What must hold, counted from the tool server's own log, not rem's rows: an effect is never
started twice unless an operator's retry is journaled (a `running` or later effect becomes
`unknown`, the session held, and `rem drill sigkill --tools`'s operator resolves it from the
server's files: retry what never started, done what the outbox holds); a read or idempotent
call is re-run with the same key and completes; exactly one completed reply answers each input;
`rem check --settled` (its library call) is clean. Every column runs on SQLite and PostgreSQL;
the effect column is in test_tool_sigkill_effect.py and the others on PostgreSQL in
test_tool_sigkill_pg.py, so the columns spread over the test workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from backend import ops
from backend.dream.digester import Dreamer
from backend.execution import sessions
from backend.programs import drill_tools
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
# the victims' lease: long, so a later victim never takes an earlier one's session over (the rescuer
# gets them all, their leases released); the rescuer's is the case's short one
VICTIM_LEASE_MS = "600000"


@dataclass
class Case:
    root: Path
    tools: Path
    env: dict[str, str]
    effect: str = "effect"

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
    return bool(running == 0 and waiting == 0)


async def _wait_settled(db: Database, what: str) -> None:
    await await_until(lambda: _settled(db), timeout=120, interval=0.2, message=what)


def _victim(case: Case, point: str) -> subprocess.Popen[bytes]:
    """An executor with the point's fault (`sent`: none, the test kills it), on a long lease."""
    fault = POINTS[point]
    extra = {"REM_EXECUTION_LEASE_MS": VICTIM_LEASE_MS, **({"REM_FAULTS": fault} if fault else {})}
    return case.spawn(f"victim-{point}", **extra)


async def _killed(ctx: Context, case: Case, victim: subprocess.Popen[bytes], point: str, before: int) -> None:
    """The victim dies at its point by SIGKILL; `sent`: killed once the server logs a new start (a
    send: once `rem drill sigkill --mid-send`'s own look finds it in flight, held by this victim)."""
    tool = TOOLS[case.effect]
    if POINTS[point] is None and tool == drill_tools.EFFECT_TOOL:
        in_flight = partial(drill_tools.in_flight_owner, ctx, case.tools)
        owner = await await_until(in_flight, timeout=120, message="the drill to find a send in flight")
        assert f"-{victim.pid}-" in owner, (owner, victim.pid)
    elif POINTS[point] is None:
        started = lambda: len(case.starts(tool)) > before  # noqa: E731
        wait_until(started, timeout=120, message=f"{tool} started at the server")
    if POINTS[point] is None:
        os.kill(victim.pid, signal.SIGKILL)
    code = victim.wait(timeout=120)
    assert code == -signal.SIGKILL, (case.root / f"victim-{point}.log").read_text()[-3000:]


async def _kill_at_each_point(ctx: Context, case: Case) -> subprocess.Popen[bytes]:
    """One session per point, each taken by its own victim and killed there, in turn; the next
    process starts while one works (it waits idle: the only session is leased, for long). Returns
    the rescuer, started beside the last victim."""
    db, effect = await ctx.db(), case.effect
    tool, points = TOOLS[effect], list(POINTS)
    spawned = [_victim(case, points[0])]
    try:
        for i, point in enumerate(points):
            before = len(case.starts(tool))
            await sessions.admit(db, f"s-{point}", PROMPTS[effect], input_id=f"in-{point}")
            claimed = partial(
                db.scalar, "SELECT 1 FROM session_execution WHERE session_id = ?", (f"s-{point}",)
            )
            await await_until(claimed, timeout=120, message=f"the victim to claim s-{point}")
            last = i + 1 == len(points)
            spawned.append(case.spawn("rescuer") if last else _victim(case, points[i + 1]))
            await _killed(ctx, case, spawned[i], point, before)
    except BaseException:
        for proc in spawned:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        raise
    return spawned[-1]


async def sigkill_a_column(ctx: Context, tmp_path: Path, effect: str) -> None:
    """Every point of one effect class's column in one data dir, against one tool server's files:
    one session per point, each killed at its point in turn by its own executor, then one rescuer
    takes all five over (the dead owners' leases released, as an operator would)."""
    db = await ctx.db()
    case = _case(ctx, tmp_path)
    case.effect, tool = effect, TOOLS[effect]
    if effect == "read":  # something for the search to find
        (case.tools).mkdir(parents=True, exist_ok=True)
        (case.tools / "notes.jsonl").write_text(
            json.dumps({"id": "n0", "key": None, "text": "standup at 10"}) + "\n"
        )
    rescuer = await _kill_at_each_point(ctx, case)
    try:
        for row in await db.fetchall("SELECT id FROM session_execution"):
            await ops.release(ctx, row[0], force=True)
        await _wait_settled(db, "the takeovers to finish or park")
        calls = {r["session_id"][2:]: dict(r) for r in await db.fetchall("SELECT * FROM tool_call")}
        assert set(calls) == set(POINTS) and {c["tool"] for c in calls.values()} == {f"demo.{tool}"}
        if effect == "effect":
            await _resolve_as_the_drill(ctx, case, calls)
    finally:
        _stop(rescuer)
    for point, call in calls.items():
        await _verify(db, case, call, f"in-{point}", effect)
    # the summaries and Dream of the turns, so nothing is in flight for the settled check
    await Summarizer(ctx, once=True, synthesizer=CountingSynthesizer()).run()
    await Dreamer(ctx, once=True).run()
    report = await ops.check(ctx, settled=True)
    assert report["ok"], json.dumps(report["violations"], indent=1)[:4000]


async def _resolve_as_the_drill(ctx: Context, case: Case, calls: dict[str, Any]) -> None:
    """The unknown outcomes the kills left (`running`, `sent`, `result`) hold their sessions; the
    drill's operator (`rem drill sigkill --tools`) decides each from the server's own files: retry
    what never started, done what the outbox holds. Its decisions are the ones the matrix expects,
    journaled, and the server never did a send twice."""
    db = await ctx.db()
    unknown = {p for p, c in calls.items() if c["state"] == "unknown"}
    assert unknown == {p for p, flag in RESOLUTION.items() if flag}, calls
    for point in unknown:
        held = await db.scalar("SELECT held_reason FROM session WHERE id = ?", (f"s-{point}",))
        assert held == "tool_outcome_unknown"
    # the takeover's journal names the dead owner that had each call in flight (the timeline's "who")
    marked = await db.fetchall("SELECT target, actor, data FROM event WHERE kind = 'tool.outcome_unknown'")
    ran_by = {row[0]: (row[1], json.loads(row[2]).get("ran_by")) for row in marked}
    for point in unknown:
        taker, dead = ran_by[calls[point]["id"]]
        assert dead and dead.startswith("executor-") and dead != taker, (point, taker, dead)
    decided = [0]

    async def all_decided() -> bool:
        decided[0] += await drill_tools.resolve_unknown(ctx, case.tools)
        return decided[0] >= len(unknown)

    await await_until(
        all_decided, timeout=60, interval=0.2, message="the drill to resolve each unknown outcome"
    )
    assert decided[0] == len(unknown)
    journal = await db.fetchall("SELECT target, data FROM event WHERE kind = 'operator.resolve'")
    by_call = {row[0]: json.loads(row[1]) for row in journal}
    for point in unknown:
        data = by_call[calls[point]["id"]]
        assert "--" + data["decision"] == RESOLUTION[point] and data["decided_by"] == ctx.operator, data
    assert drill_tools.effects(case.tools)["duplicated"] == 0
    await _wait_settled(db, "the resolved turns to finish")


async def _verify(db: Database, case: Case, call: Any, input_id: str, effect: str) -> None:
    """The call completed, run under one key, its effect done once; one reply answers `input_id`."""
    final = await db.fetchone("SELECT * FROM tool_call WHERE id = ?", (call["id"],))
    assert final is not None and final["state"] == "completed", (input_id, dict(final or {}))
    key = final["idempotency_key"]
    starts = [s for s in case.log() if s["phase"] == "start" and s["key"] == key]
    assert starts and {s["tool"] for s in starts} == {TOOLS[effect]}  # every run, one key
    if effect == "effect":
        assert len(starts) <= 1 + final["retries"], starts  # never started twice without a journaled retry
        assert len(starts) == 1, (input_id, starts)
        assert [r["key"] for r in _records(case.tools / "outbox.jsonl")].count(key) == 1
    if effect == "idempotent":
        assert [r["key"] for r in _records(case.tools / "notes.jsonl")].count(key) == 1
    sid = final["session_id"]
    replies = await db.fetchall(
        "SELECT data FROM session_message WHERE session_id = ? AND type = 'assistant' "
        "AND json_extract(data, '$.status') = 'completed'",
        (sid,),
    )
    assert len(replies) == 1 and json.loads(replies[0][0])["answers"] == [input_id], (input_id, replies)
    assert await db.scalar("SELECT held_at FROM session WHERE id = ?", (sid,)) is None


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# the effect column runs in test_tool_sigkill_effect.py (SQLite and PostgreSQL), the read and
# idempotent columns on PostgreSQL in test_tool_sigkill_pg.py, so the columns spread over the test
# workers (a file runs whole on one)
@pytest.mark.parametrize("effect", ["read", "idempotent"])
async def test_sigkill_at_each_point_of_a_call(ctx: Context, tmp_path: Path, effect: str) -> None:
    await sigkill_a_column(ctx, tmp_path, effect)


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
    await _verify(db, case, await db.fetchone("SELECT * FROM tool_call"), "in-1", "effect")
