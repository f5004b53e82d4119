"""Running a turn's tool calls: the executor's side of `backend.execution.tool_calls`.

One `ToolRunner` per executor process holds the process's one
`ToolRegistry` (loaded on first use; its servers start when first listed or
called, restart with backoff, log their stderr; a server that is down makes
only its own tools unavailable; their health is recorded in the executor's
worker row when it changes, `backend.execution.tool_health`). Without
`REM_MCP_CONFIG` and with no `rem.tools` entry point installed it loads
nothing (not even the MCP SDK): the agent is offered no tools and behaves
exactly as before.

Before each model step of a turn, `advance` moves the turn's calls on:
after a takeover it first settles the dead owner's `running` calls
(`settle_takeover_sync`); then it runs every `pending` call (up to
`REM_TOOL_CONCURRENCY` at once): `running` committed, the request, the
outcome committed (fault points `tools.after_start`, `tools.after_result`,
`tools.after_finish` sit between them); and when only calls that wait for a
person are left, it parks the turn (`backend.execution.parking`).

How a run ends: a result (a tool's own error result included) -> `completed`;
`ToolUnavailable` / `ToolNotFound` (never sent) -> `error`, safe for any class;
`ToolTimeout` / `ToolConnectionLost` (sent, outcome unknown) -> `unknown` for an
effect (the turn parks, the session is held), and for a read or idempotent
tool an `error` result telling the model the outcome is unknown (no automatic
re-run: the model may ask again, with a new key, or an operator may).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from functools import partial
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from backend.core import clock, faults
from backend.core.settings import settings
from backend.core.storable import unstorable_at
from backend.execution import parking, tool_calls
from backend.execution.steps import TurnState
from backend.execution.tool_calls import Outcome, PlannedCall
from backend.execution.tool_health import ToolHealthRecorder
from backend.models.tool_deltas import ModelToolCall
from backend.store.db import Conn, Database, Row
from backend.store.fencing import guard_sync
from backend.store.states import ToolCallState
from backend.tools.errors import ToolError

if TYPE_CHECKING:  # the MCP SDK loads only when tools are configured
    from backend.tools.registry import ToolRegistry

OK = ToolCallState


class ToolRunner:
    """The executor's tools: the registry, what is offered, and each call's run."""

    def __init__(
        self,
        db: Callable[[], Database],
        owner_id: str,
        log: logging.Logger,
        info: Callable[[], dict[str, Any]] = dict,
        registered: Callable[[], bool] = lambda: True,
    ) -> None:
        self._db = db  # the executor's store, opened when it runs
        self.owner_id = owner_id
        self.log = log
        # the sources' health in the worker row (`info`: the rest of what the row says), once
        # the row is there (`registered`: tools listed before the executor runs record later)
        self.health = ToolHealthRecorder(db, owner_id, info, log, registered)
        self.enabled = settings.mcp_config is not None or bool(entry_points(group="rem.tools"))
        self.concurrency = settings.tool_concurrency
        self._registry: ToolRegistry | None = None
        self._loading: asyncio.Lock | None = None

    async def registry(self) -> ToolRegistry:
        """The process's one registry (loaded once; it starts nothing by itself)."""
        if self._registry is None:
            self._loading = self._loading or asyncio.Lock()
            async with self._loading:
                if self._registry is None:
                    from backend.tools.registry import ToolRegistry  # import time: the MCP SDK

                    self._registry = await ToolRegistry.load()
        return self._registry

    async def offered(self) -> list[dict[str, Any]]:
        """The tools a step offers the model (NAME__TOOL function tools); none without tools."""
        if not self.enabled:
            return []
        registry = await self.registry()
        specs = await registry.catalogue()
        await self.health.record(registry)
        return [spec.openai_tool() for spec in specs if spec.available]

    async def record_health(self) -> None:
        """Record the sources' health if it changed (a server may die between turns); none loaded: nothing."""
        if self._registry is not None:
            await self.health.record(self._registry)

    async def aclose(self) -> None:
        if self._registry is not None:
            await self._registry.aclose()

    # -- a step's calls, as its closing transaction inserts them ------------------------
    async def plan(self, calls: list[ModelToolCall]) -> list[PlannedCall]:
        """Each call the model asked for, classified before anything runs (see `_plan_one`)."""
        return [await self._plan_one(position, call) for position, call in enumerate(calls)]

    async def _plan_one(self, idx: int, call: ModelToolCall) -> PlannedCall:
        from backend.tools.errors import ToolError  # import time: only when a model called a tool

        name = call.name.replace("__", ".", 1) if "__" in call.name else call.name
        planned = PlannedCall(
            idx=idx,
            model_call_id=call.id,
            tool=name[:200],
            arguments="{}",
            effect="effect",
            effect_source="unknown",
            permission="deny",
            state=OK.ERROR,
        )
        arguments, problem = parse_arguments(call)
        if problem is not None:
            planned.result = f"rem did not run {name[:200]!r}: {problem}"
            return planned
        planned.arguments = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
        if not self.enabled:
            planned.result = f"rem did not run {name[:200]!r}: no tools are configured"
            return planned
        try:
            spec = await (await self.registry()).spec(call.name)
        except ToolError as exc:
            planned.result = f"rem did not run {name[:200]!r}: {exc}"
            return planned
        planned.tool, planned.effect, planned.effect_source = spec.name, spec.effect, spec.effect_source
        planned.permission, planned.timeout_ms = spec.permission, spec.timeout_ms
        planned.state = {"allow": OK.PENDING, "ask": OK.AWAITING_APPROVAL}.get(spec.permission, OK.DENIED)
        if planned.state == OK.DENIED:
            planned.result = f"{spec.name} is denied by rem's configuration (permission deny); it was not run"
        return planned

    # -- moving a turn's calls on --------------------------------------------------------
    async def advance(self, state: TurnState) -> bool:
        """Run the turn's pending calls; park it if only calls waiting for a person are left.

        True when the turn parked (it leaves this executor). Nothing to do (no
        tools used, no takeover): no query at all.
        """
        if not (state.calls_open or state.recovering):
            return False
        settle = state.recovering
        while True:
            rows, state.open_calls = state.open_calls, None
            if rows is None or settle:
                rows = await self._db().write_in_thread(partial(self._open_sync, state=state, settle=settle))
            settle = False
            pending = [row for row in rows if row["state"] == OK.PENDING]
            if pending:
                ended = await self._run_all(state, pending)
                if ended == len(rows):  # every open call ran to its end: none left to look for
                    state.calls_open = False
                    return False
                continue
            if any(row["state"] in (OK.AWAITING_APPROVAL, OK.UNKNOWN) for row in rows):
                if await self._db().write_in_thread(partial(self._park_sync, state=state)):
                    return True
                continue  # a decision landed meanwhile: look again
            state.calls_open = False
            return False

    def _open_sync(self, conn: Conn, state: TurnState, settle: bool) -> list[Row]:
        now = clock.now_ms()
        guard_sync(conn, state.lease, now=now, unread=True)
        if settle:
            moved = tool_calls.settle_takeover_sync(conn, state.lease, now)
            if moved["rerun"] or moved["unknown"]:
                self.log.info("took over calls of %s: %s", state.lease.execution_id, moved)
        return tool_calls.open_calls_sync(conn, state.lease.execution_id)

    def _park_sync(self, conn: Conn, state: TurnState) -> bool:
        now = clock.now_ms()
        guard_sync(conn, state.lease, now=now, unread=True)
        reason = parking.park_sync(conn, state.lease, now=now)
        if reason is not None:
            self.log.info("parked %s (%s)", state.lease.execution_id, reason)
        return reason is not None

    async def _run_all(self, state: TurnState, rows: list[Row]) -> int:
        """Run the pending calls `rows`; how many of them ended (completed or failed)."""
        slots = asyncio.Semaphore(self.concurrency)
        results = await asyncio.gather(
            *(self._run_one(state, row, slots) for row in rows), return_exceptions=True
        )
        for failure in results:
            if isinstance(failure, BaseException):
                raise failure
        return sum(1 for ended in results if ended is True)

    async def _run_one(self, state: TurnState, row: Row, slots: asyncio.Semaphore) -> bool:
        """Start, call and finish one call; whether it ended (not moved meanwhile, outcome known)."""
        async with slots:
            started = await self._db().write_in_thread(partial(self._start_sync, state=state, cid=row["id"]))
            if not started:
                return False  # moved meanwhile (another run of the loop started it)
            faults.point("tools.after_start")
            outcome = await self._call(started[0])
            faults.point("tools.after_result")
            await self._db().write_in_thread(
                partial(self._finish_sync, state=state, cid=row["id"], outcome=outcome)
            )
            faults.point("tools.after_finish")
            return outcome.state in (OK.COMPLETED, OK.ERROR)

    def _start_sync(self, conn: Conn, state: TurnState, cid: str) -> list[Row]:
        now = clock.now_ms()
        guard_sync(conn, state.lease, now=now, unread=True)
        return tool_calls.start_sync(conn, state.lease, [cid], now)

    def _finish_sync(self, conn: Conn, state: TurnState, cid: str, outcome: Outcome) -> None:
        now = clock.now_ms()
        guard_sync(conn, state.lease, now=now, unread=True)
        tool_calls.finish_sync(conn, state.lease, cid, outcome, now)

    async def _call(self, row: Row) -> Outcome:
        """One request to the tool, and what its ending means for the row."""
        registry = await self.registry()
        try:
            result = await registry.call(
                row["tool"], json.loads(row["arguments"]), idempotency_key=row["idempotency_key"]
            )
        except ToolError as exc:
            outcome = failed_outcome(row, exc)
        else:
            outcome = Outcome(
                state=OK.COMPLETED,
                result=result.text,
                is_error=result.is_error,
                size_bytes=result.size_bytes,
                truncated=result.truncated,
            )
        await self.health.record(registry)  # its server went down, or came up: unchanged, nothing written
        return outcome


def failed_outcome(row: Row, exc: Exception) -> Outcome:
    """A request that raised: never sent (an error), or sent with its outcome unknown."""
    if not getattr(exc, "outcome_unknown", False):
        return Outcome(
            state=OK.ERROR, result=f"{row['tool']} was not run: {exc}", is_error=True, reason=str(exc)
        )
    if row["effect"] == "effect":
        return Outcome(state=OK.UNKNOWN, result=None, is_error=False, reason=str(exc)[:1000])
    return Outcome(
        state=OK.ERROR,
        result=f"{row['tool']}'s outcome is unknown ({exc}); it may or may not have run",
        is_error=True,
        reason=str(exc)[:1000],
    )


def parse_arguments(call: ModelToolCall) -> tuple[dict[str, Any], str | None]:
    """The call's arguments as a JSON object, or why not (a bound it broke, bad JSON, not an object)."""
    if call.refused is not None:
        return {}, call.refused
    try:
        value = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as exc:
        return {}, f"its arguments are not valid JSON ({exc.msg} at character {exc.pos})"
    if not isinstance(value, dict):
        return {}, f"its arguments must be a JSON object, not {type(value).__name__}"
    where = unstorable_at(value, whole="a key")
    if where is not None:  # a \u0000 or unpaired \ud800 escape: no store (nor tool server) takes it
        return {}, (
            f"its arguments hold a NUL character or a lone surrogate (a \\ud800-\\udfff escape without "
            f"its pair) in {where}, which no store can hold; it was not run"
        )
    return value, None
