"""Deterministic data dirs for the console's tests, snapshots and screenshots.

Each scene writes real rows (through the real schema, with foreign keys on)
into a fresh data dir, at times relative to a fixed `now`, so that a frozen
clock makes every rendering identical run after run.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from backend.core.datadir import DataDir
from backend.runtime.context import Context

NOW = 1_800_000_000_000  # FrozenClock's default start
REV_A = "sha256:" + "a1" * 32
REV_B = "sha256:" + "b2" * 32
REV_C = "sha256:" + "c3" * 32


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    """asyncio.run, also from inside a running loop (Pilot tests) via a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _init(data: DataDir) -> None:
    ctx = Context(data, start_chroma=False)
    try:
        await ctx.db()
    finally:
        await ctx.close()


class Scene:
    """A writer of console-relevant rows into one data dir's state.db."""

    def __init__(self, root: Path, now: int = NOW) -> None:
        self.data = DataDir(Path(root))
        self.now = now
        _run(_init(self.data))
        self.conn = sqlite3.connect(self.data.state_db, isolation_level=None, timeout=10)
        self.conn.execute("PRAGMA foreign_keys = ON")
        self._msg = 0

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Scene:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tx(self, fn: Callable[[], None]) -> None:
        """Run `fn` as one committed write transaction (one data_version bump); nests."""
        if self.conn.in_transaction:
            fn()
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            fn()
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def x(self, sql: str, *params: Any) -> None:
        self.conn.execute(sql, params)

    # -- rows ------------------------------------------------------------------
    def session(self, sid: str, *, ago_ms: int = 3_600_000) -> None:
        self.x(
            "INSERT OR IGNORE INTO session (id, title, time_created, time_updated) VALUES (?,?,?,?)",
            sid,
            f"session {sid}",
            self.now - ago_ms,
            self.now - ago_ms,
        )

    def worker(
        self,
        owner: str,
        role: str,
        pid: int,
        *,
        beat_ago_ms: int = 500,
        state: str = "running",
        up_ms: int = 600_000,
        host: str = "ops-1",
    ) -> None:
        self.x(
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state) "
            "VALUES (?,?,?,?,?,?,?)",
            owner,
            role,
            pid,
            host,
            self.now - up_ms,
            self.now - beat_ago_ms,
            state,
        )

    def execution(
        self, exe: str, sid: str, owner: str, *, epoch: int, left_ms: int, phase: str = "unknown"
    ) -> None:
        self.session(sid)
        self.x(
            "INSERT INTO session_execution (id, session_id, owner_id, epoch, phase, time_created, "
            "time_renewed, expires_at) VALUES (?,?,?,?,?,?,?,?)",
            exe,
            sid,
            owner,
            epoch,
            phase,
            self.now - 40_000,
            self.now + left_ms - 30_000,
            self.now + left_ms,
        )
        self.x("UPDATE session SET lease_epoch = ? WHERE id = ?", epoch, sid)

    def inputs(self, sid: str, count: int, *, oldest_ago_ms: int) -> None:
        self.session(sid)
        for i in range(count):
            self.x(
                "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, "
                "wake_pending, time_created) VALUES (?,?,?,?,?,1,?)",
                f"in_{sid}_{i}",
                sid,
                json.dumps({"text": f"prompt {i}"}),
                "queue",
                100 + i,
                self.now - oldest_ago_ms + i * 1000,
            )

    def message(self, sid: str, kind: str = "synthetic") -> str:
        self._msg += 1
        mid = f"msg_{sid}_{self._msg}"
        self.x(
            "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data) "
            "VALUES (?,?,?,?,?,?,?)",
            mid,
            sid,
            kind,
            1000 + self._msg,
            self.now,
            self.now,
            json.dumps({"text": "continue"}),
        )
        return mid

    def recovery(
        self,
        exe: str,
        sid: str,
        *,
        phase: str = "unknown",
        attempts: int = 1,
        error: str | None = None,
        ago_ms: int = 20_000,
    ) -> None:
        self.session(sid)
        self.x(
            "INSERT INTO session_recovery (execution_id, session_id, continuation_message_id, phase, "
            "wake_pending, wake_attempts, recovery_error, time_created) VALUES (?,?,?,?,?,?,?,?)",
            exe,
            sid,
            self.message(sid),
            phase,
            0 if error else 1,
            attempts,
            error,
            self.now - ago_ms,
        )

    def summary(
        self,
        sid: str,
        *,
        status: str = "completed",
        verdict: str | None = "present",
        keys: list[dict[str, Any]] | None = None,
        checked_ago_ms: int = 30_000,
        quarantine: str | None = None,
        attempts: int = 1,
        error: str | None = None,
        stale: bool = False,
    ) -> None:
        self.session(sid)
        detail = json.dumps({"keys": keys}) if keys is not None else None
        self.x(
            "INSERT INTO summary_job (session_id, status, attempts, last_error, dirty_seq, clean_seq, "
            "result_staged_at, verdict, verdict_detail, verdict_checked_at, quarantined_at, "
            "quarantine_reason, time_created, time_updated) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            sid,
            status,
            attempts,
            error,
            3 if stale else 2,
            2,
            self.now - 600_000,
            verdict,
            detail,
            None if verdict is None else self.now - checked_ago_ms,
            self.now - checked_ago_ms if quarantine else None,
            quarantine,
            self.now - 900_000,
            self.now - checked_ago_ms,
        )

    def dream(
        self,
        sid: str,
        *,
        input_rev: str | None,
        completed_rev: str | None,
        state: str = "pending",
        attempts: int = 0,
        defer: str | None = None,
        published_ago_ms: int = 60_000,
    ) -> None:
        self.session(sid)
        self.x(
            "INSERT INTO dream_state (session_id, input_revision, completed_revision, digest_state, "
            "digest_attempts, defer_reason, time_published, time_updated) VALUES (?,?,?,?,?,?,?,?)",
            sid,
            input_rev,
            completed_rev,
            state,
            attempts,
            defer,
            self.now - published_ago_ms,
            self.now - published_ago_ms,
        )

    def usage(
        self,
        sid: str,
        *,
        tokens: tuple[int, int, int, int],
        cost: float,
        turns: int,
        model: str = "gpt-4o-mini",
        error: dict[str, Any] | None = None,
        held: str | None = None,
    ) -> None:
        """A session's model totals (input, output, reasoning, cache read), last error, hold."""
        self.session(sid)
        self.x(
            "UPDATE session SET tokens_input = ?, tokens_output = ?, tokens_reasoning = ?, "
            "tokens_cache_read = ?, cost = ?, turn_count = ?, model = ?, model_error = ?, held_at = ?, "
            "held_reason = ? WHERE id = ?",
            *tokens,
            cost,
            turns,
            model,
            json.dumps(error) if error else None,
            self.now - 95_000 if held else None,
            held,
            sid,
        )

    def model_calls(
        self, outcomes: list[tuple[str, int | None, float | None]], *, every_ms: int = 1_500
    ) -> None:
        """Model request attempts, oldest first, ending now: (outcome, status, time to first token)."""
        for i, (outcome, status, ttft) in enumerate(outcomes):
            self.x(
                "INSERT INTO model_call (time, owner_id, kind, endpoint, model, session_id, attempt, outcome, "
                "status, ttft_ms, duration_ms, error) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                self.now - (len(outcomes) - i) * every_ms,
                EXEC_A,
                "chat",
                "api.openai.com/v1",
                "gpt-4o-mini",
                "s-alpha",
                2 if i and outcomes[i - 1][0] != "ok" else 1,
                outcome,
                status,
                ttft,
                (ttft or 0) + 2_400,
                None if outcome == "ok" else f"HTTP {status} {outcome}",
            )

    def tool_call(
        self,
        call_id: str,
        exe: str,
        sid: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        state: str,
        owner: str | None,
        epoch: int | None,
        ago_ms: int,
        step: int = 1,
        idx: int = 0,
        effect: str = "effect",
        permission: str = "ask",
        result: str | None = None,
        starts: int = 0,
    ) -> None:
        """One agent tool call row, as the executor writes it (started 1 s after it was made)."""
        self.session(sid)
        made = self.now - ago_ms
        started = made + 1_000 if starts else None
        finished = started + 500 if started is not None and result is not None else None
        self.x(
            "INSERT INTO tool_call (id, session_id, execution_id, step, idx, model_call_id, tool, "
            "arguments, effect, effect_source, permission, state, idempotency_key, owner_id, epoch, "
            "starts, result, result_bytes, time_created, time_started, time_finished, time_updated) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            call_id,
            sid,
            exe,
            step,
            idx,
            f"model-{call_id}",
            tool,
            json.dumps(arguments, sort_keys=True),
            effect,
            "annotation",
            permission,
            state,
            f"rk_{exe}_{step}_{idx}",
            owner,
            epoch,
            starts,
            result,
            None if result is None else len(result.encode()),
            made,
            started,
            finished,
            finished or started or made,
        )

    def event(
        self,
        kind: str,
        actor: str,
        *,
        ago_ms: int,
        session_id: str | None = None,
        target: str | None = None,
        **data: Any,
    ) -> None:
        self.x(
            "INSERT INTO event (time, kind, actor, session_id, target, data) VALUES (?,?,?,?,?,?)",
            self.now - ago_ms,
            kind,
            actor,
            session_id,
            target,
            json.dumps(data, sort_keys=True),
        )


# -- the scenes ------------------------------------------------------------------------
EXEC_A = "executor-ops-1-4101-a1b2c3"
EXEC_B = "executor-ops-1-4102-d4e5f6"
SUMM = "summarizer-ops-1-4103-778899"
DREAM = "dream-ops-1-4104-aabbcc"


def healthy(scene: Scene) -> None:
    """Two executors mid-turn, a summarizer and a Dream daemon, inputs flowing."""

    def rows() -> None:
        scene.worker(EXEC_A, "executor", 4101, beat_ago_ms=400)
        scene.worker(EXEC_B, "executor", 4102, beat_ago_ms=1_100)
        scene.worker(SUMM, "summarizer", 4103, beat_ago_ms=900)
        scene.worker(DREAM, "dream", 4104, beat_ago_ms=1_700)
        scene.execution("exe_0001", "s-alpha", EXEC_A, epoch=3, left_ms=27_000, phase="unknown")
        scene.execution("exe_0002", "s-bravo", EXEC_B, epoch=1, left_ms=18_000, phase="safe")
        scene.inputs("s-charlie", 3, oldest_ago_ms=4_000)
        scene.inputs("s-delta", 1, oldest_ago_ms=1_500)
        for sid in ("s-alpha", "s-bravo", "s-echo", "s-foxtrot"):
            scene.summary(sid)
        scene.dream("s-echo", input_rev=REV_A, completed_rev=REV_A, state="digested")
        scene.usage("s-alpha", tokens=(48_210, 9_880, 1_204, 22_400), cost=0.0171, turns=14)
        scene.usage("s-bravo", tokens=(5_120, 1_430, 0, 0), cost=0.0016, turns=3)
        scene.usage("s-echo", tokens=(212_004, 35_120, 8_800, 96_000), cost=0.0644, turns=41)
        scene.model_calls([("ok", None, 310.0 + 40 * (i % 5)) for i in range(24)])
        for i, (kind, actor, sid) in enumerate(
            [
                ("worker.started", EXEC_A, None),
                ("worker.started", EXEC_B, None),
                ("input.admitted", "cli", "s-alpha"),
                ("execution.claimed", EXEC_A, "s-alpha"),
                ("input.admitted", "cli", "s-bravo"),
                ("execution.claimed", EXEC_B, "s-bravo"),
                ("summary.completed", SUMM, "s-echo"),
                ("dream.completed", DREAM, "s-echo"),
                ("input.admitted", "cli", "s-charlie"),
                ("execution.step", EXEC_A, "s-alpha"),
            ]
        ):
            scene.event(
                kind,
                actor,
                ago_ms=60_000 - i * 5_000,
                session_id=sid,
                target="exe_0001" if sid == "s-alpha" else sid,
            )

    scene.tx(rows)


def killed_executor(scene: Scene) -> None:
    """Executor B was SIGKILLed 42 s ago: its lease expired 12 s ago, nobody took over yet."""

    def rows() -> None:
        scene.x("UPDATE worker SET heartbeat_at = ? WHERE owner_id = ?", scene.now - 42_000, EXEC_B)
        scene.x(
            "UPDATE session_execution SET expires_at = ?, time_renewed = ? WHERE id = 'exe_0002'",
            scene.now - 12_000,
            scene.now - 42_000,
        )
        scene.event(
            "execution.step",
            EXEC_B,
            ago_ms=42_500,
            session_id="s-bravo",
            target="exe_0002",
            step=4,
            phase="unknown",
        )

    scene.tx(rows)


def receipt_mismatches(scene: Scene) -> None:
    """Four receipts the verification pass found wrong, one of each verdict."""

    def rows() -> None:
        scene.summary(
            "s-golf",
            verdict="keys_differ",
            checked_ago_ms=8_000,
            keys=[
                {
                    "key": "title",
                    "expected": "Deploy rollback plan",
                    "actual": "Deploy plan",
                    "reason": "changed",
                },
                {"key": "dreamInputRevision", "expected": REV_B, "actual": None, "reason": "missing"},
            ],
        )
        scene.summary("s-hotel", verdict="missing", checked_ago_ms=9_000, keys=[])
        scene.summary(
            "s-india",
            verdict="document_differs",
            checked_ago_ms=15_000,
            keys=[
                {"key": "keywords", "expected": ["lease", "epoch"], "actual": ["lease"], "reason": "changed"},
            ],
        )
        scene.summary(
            "s-juliet",
            verdict="quarantined",
            checked_ago_ms=20_000,
            quarantine="envelope is not valid JSON (byte 212)",
        )
        scene.event(
            "receipt.verified",
            SUMM,
            ago_ms=8_000,
            session_id="s-golf",
            target="summary_s-golf",
            verdict="keys_differ",
            keys=["title", "dreamInputRevision"],
        )
        scene.event(
            "receipt.quarantined",
            SUMM,
            ago_ms=20_000,
            session_id="s-juliet",
            target="summary_s-juliet",
            reason="envelope is not valid JSON",
        )

    scene.tx(rows)


def dream_drift(scene: Scene) -> None:
    """One session per drift class, plus a parked recovery and a failed summary."""

    def rows() -> None:
        scene.dream("s-kilo", input_rev=REV_B, completed_rev=None, published_ago_ms=30_000)
        scene.dream("s-lima", input_rev=REV_C, completed_rev=REV_B, published_ago_ms=45_000)
        scene.dream(
            "s-mike",
            input_rev=REV_A,
            completed_rev=None,
            state="deferred",
            attempts=2,
            defer="graph busy",
            published_ago_ms=120_000,
        )
        scene.dream(
            "s-november",
            input_rev=REV_B,
            completed_rev=REV_A,
            state="undigestible",
            attempts=5,
            defer="extraction failed 5 times",
            published_ago_ms=900_000,
        )
        scene.dream(
            "s-oscar", input_rev=REV_A, completed_rev=None, state="legacy", published_ago_ms=3_600_000
        )
        scene.summary("s-papa", stale=True, checked_ago_ms=5_000)
        scene.summary("s-quebec", status="failed", verdict=None, attempts=3, error="Chroma unreachable")
        scene.recovery("exe_0099", "s-romeo", attempts=10, error="wake budget exhausted (10)", ago_ms=300_000)
        scene.recovery("exe_0098", "s-sierra", phase="ready", attempts=1, ago_ms=3_000)

    scene.tx(rows)


def model_trouble(scene: Scene) -> None:
    """The endpoint rate-limits (retries) and one session hit a 401: held, two inputs asleep."""

    def rows() -> None:
        scene.model_calls(
            [("ok", None, 350.0)] * 6
            + [("rate_limited", 429, None), ("ok", None, 1_840.0), ("rate_limited", 429, None)]
            + [("rate_limited", 429, None), ("ok", None, 2_120.0), ("auth", 401, None)],
            every_ms=900,
        )
        error = {"class": "auth", "status": 401, "message": "HTTP 401 invalid_api_key: Incorrect API key"}
        scene.usage(
            "s-tango",
            tokens=(1_310, 240, 0, 0),
            cost=0.0004,
            turns=2,
            error=error,
            held="auth: HTTP 401 invalid_api_key: Incorrect API key provided: sk-pr***",
        )
        scene.inputs("s-tango", 2, oldest_ago_ms=80_000)
        scene.x("UPDATE session_input SET wake_pending = 0 WHERE session_id = 's-tango'")
        scene.usage(
            "s-alpha",
            tokens=(48_210, 9_880, 1_204, 22_400),
            cost=0.0171,
            turns=14,
            error={"class": "rate_limited", "status": 429, "message": "HTTP 429 rate_limit_exceeded"},
        )
        scene.event(
            "session.held",
            EXEC_A,
            ago_ms=95_000,
            session_id="s-tango",
            target="s-tango",
            **{"class": "auth", "status": 401, "resume": "rem resume s-tango"},
        )

    scene.tx(rows)


def tool_calls(scene: Scene) -> None:
    """Agent tool calls: a read that completed, a send waiting for approval, and a send whose
    executor (B) was SIGKILLed mid-call: its outcome is unknown."""

    def rows() -> None:
        scene.tool_call(
            "call_a1",
            "exe_0001",
            "s-alpha",
            "demo.notes_search",
            {"query": "rollback plan"},
            state="completed",
            owner=EXEC_A,
            epoch=3,
            ago_ms=130_000,
            effect="read",
            permission="allow",
            result="2 notes: rollback plan v2, rollback drill",
            starts=1,
        )
        scene.tool_call(
            "call_a2",
            "exe_0001",
            "s-alpha",
            "demo.outbox_send",
            {"to": "oncall@example.com", "subject": "rollback at 14:00"},
            state="awaiting_approval",
            owner=EXEC_A,
            epoch=3,
            ago_ms=95_000,
            step=2,
        )
        scene.tool_call(
            "call_b1",
            "exe_0002",
            "s-bravo",
            "demo.outbox_send",
            {"to": "finance@example.com", "subject": "pay invoice 2291", "amount": 1250},
            state="unknown",
            owner=EXEC_B,
            epoch=1,
            ago_ms=44_000,
            starts=1,
        )

    scene.tx(rows)


def send_in_flight(scene: Scene) -> None:
    """Executor A runs a send for s-charlie (4 s in): what `k` on A, or on the call's row, names."""

    def rows() -> None:
        scene.execution("exe_0003", "s-charlie", EXEC_A, epoch=1, left_ms=24_000, phase="unknown")
        scene.tool_call(
            "call_c1",
            "exe_0003",
            "s-charlie",
            "demo.outbox_send",
            {"to": "bob@example.com", "subject": "weekly report"},
            state="running",
            owner=EXEC_A,
            epoch=1,
            ago_ms=5_000,
            starts=1,
        )

    scene.tx(rows)


def incident(scene: Scene) -> None:
    """Everything at once: the main screenshot."""
    healthy(scene)
    killed_executor(scene)
    receipt_mismatches(scene)
    dream_drift(scene)
    model_trouble(scene)
    tool_calls(scene)


def build(root: Path, *steps: Callable[[Scene], None], now: int = NOW) -> DataDir:
    """A fresh data dir at `root` with the given scenes applied in order."""
    with Scene(root, now) as scene:
        for step in steps:
            step(scene)
        return scene.data
