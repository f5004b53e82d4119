"""The executor daemon: claims sessions with waiting inputs, runs their turns, recovers the dead.

One process runs up to `REM_EXECUTOR_CONCURRENCY` sessions at once, each in
its own task holding that session's execution lease. A turn is one
execution: claim (`ready`) -> per step: promote inputs and open the
assistant row (`unknown`), stream parts, close the row (`safe`) -> at the
end, delete the execution row (clean end). `steer` inputs join the running
turn at the next step boundary; a `queue` input starts the next turn. Every
write transaction of a turn starts with `leases.guard_sync`, fenced on
(execution id, owner, epoch). Expired or released executions are taken
over through `backend.execution.recovery`. Draining stops claiming, lets in-flight
turns finish (bounded), and ends their leases cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from backend.core import clock, faults
from backend.core.errors import LeaseLost, RemError
from backend.core.settings import settings
from backend.execution import leases, projection, recovery, sessions
from backend.execution.agent import Agent, StepRequest, load_agent
from backend.execution.leases import ExecutionPhase, Lease
from backend.runtime.context import Context
from backend.runtime.daemon import Daemon
from backend.store import handoffs
from backend.store.events import EventKind, append_event_sync
from backend.store.workers import WorkerRole

# Parts that arrive within this window share one write transaction.
FLUSH_S = 0.05

# The wake scan, served by the seed's index
# session_input_wake_pending_promoted_attempts_created_id_idx: least-tried first,
# so a session that keeps failing cannot starve the others.
WAKE_SQL = """
SELECT i.session_id FROM session_input AS i
WHERE i.wake_pending = 1 AND i.promoted_seq IS NULL
  AND NOT EXISTS (SELECT 1 FROM session_execution AS e WHERE e.session_id = i.session_id)
ORDER BY i.wake_attempts, i.time_created, i.id LIMIT :limit
"""


BUMP_OLDEST_SQL = f"""
UPDATE session_input SET wake_attempts = wake_attempts + 1
WHERE id = ({sessions.OLDEST_PENDING_SQL})
  AND NOT EXISTS (SELECT 1 FROM session_execution WHERE session_id = :sid)
RETURNING id
"""


@dataclass
class TurnState:
    """One execution as its owning task sees it."""

    lease: Lease
    step: int = 0
    turn_started: bool = False
    # set after a takeover: the first step re-derives its state from the transcript
    recovering: bool = False
    recovered: bool = False


@dataclass(kw_only=True)
class Step:
    """One step in flight: its assistant row, what it answers, the parts streamed so far."""

    number: int
    assistant_id: str
    data: dict[str, Any]
    request: StepRequest
    parts: list[str] = field(default_factory=list)
    written: int = 0


class Executor(Daemon):
    role = WorkerRole.EXECUTOR

    def __init__(
        self,
        ctx: Context,
        *,
        once: bool = False,
        owner_id: str | None = None,
        agent: Agent | None = None,
        concurrency: int | None = None,
        lease_ms: int | None = None,
    ) -> None:
        super().__init__(ctx, once=once, owner_id=owner_id)
        self.agent = agent or load_agent()
        self.concurrency = concurrency or settings.executor_concurrency
        self.lease_ms = lease_ms or leases.lease_ms()
        self.drain_ms = settings.executor_drain_ms
        self.budget = recovery.recovery_budget()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.held: dict[str, Lease] = {}
        self.turns_completed = 0
        self._renewer: asyncio.Task[None] | None = None

    def info(self) -> dict[str, Any]:
        return {"agent": self.agent.name, "concurrency": self.concurrency, "lease_ms": self.lease_ms}

    # -- the pass ----------------------------------------------------------
    async def run_pass(self) -> int:
        """Take over expired executions, then claim sessions with waiting inputs."""
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew_loop())
        if self.draining.is_set():
            return 0
        started = await self._take_over_expired() + await self._claim_waiting()
        if self.once:
            await self.wait_idle()
        return started

    async def wait_idle(self) -> None:
        """Wait until every session task of this process has finished."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks.values()), return_exceptions=True)

    def _capacity(self) -> int:
        return self.concurrency - len(self.tasks)

    async def _take_over_expired(self) -> int:
        if self._capacity() <= 0:
            return 0
        limit = self._capacity() * 2
        candidates = await self.db.read_in_thread(
            lambda conn: recovery.recoverable_sync(conn, clock.now_ms(), limit)
        )
        started = 0
        for execution_id, session_id in candidates:
            if session_id in self.tasks or self._capacity() <= 0:
                continue
            taken = await self.db.write_in_thread(partial(self._take_over_sync, execution_id=execution_id))
            if taken is not None:
                state = TurnState(taken.lease, step=taken.step, recovering=True, recovered=True)
                self._spawn(session_id, self._run_session(state))
                started += 1
        return started

    def _take_over_sync(self, conn: sqlite3.Connection, execution_id: str) -> recovery.Takeover | None:
        return recovery.take_over_sync(
            conn, execution_id, self.owner_id, now=clock.now_ms(), budget=self.budget, length_ms=self.lease_ms
        )

    async def _claim_waiting(self) -> int:
        if self._capacity() <= 0:
            return 0
        rows = await self.db.fetchall(WAKE_SQL, {"limit": self._capacity() * 4})
        started = 0
        for session_id in dict.fromkeys(r["session_id"] for r in rows):
            if session_id in self.tasks:
                continue
            if self._capacity() <= 0:
                break
            lease = await self._claim(session_id)
            if lease is not None:
                self._spawn(session_id, self._run_session(TurnState(lease)))
                started += 1
        return started

    async def _claim(self, session_id: str) -> Lease | None:
        """Claim the session's lease if it has a waiting input (counting that input's attempt first)."""
        lease = await self.db.write_in_thread(lambda conn: self._claim_sync(conn, session_id, clock.now_ms()))
        if lease is not None:
            self.log.info("claimed session %s as %s (epoch %d)", session_id, lease.execution_id, lease.epoch)
        return lease

    def _claim_sync(self, conn: sqlite3.Connection, session_id: str, now: int) -> Lease | None:
        # the oldest waiting input's attempt is counted before the work; nothing waiting
        # or the session busy: nothing written
        if conn.execute(BUMP_OLDEST_SQL, {"sid": session_id}).fetchone() is None:
            return None
        lease = leases.claim_execution_sync(conn, session_id, self.owner_id, now=now, length_ms=self.lease_ms)
        if lease is None:
            return None
        append_event_sync(
            conn,
            kind=EventKind.EXECUTION_CLAIMED,
            actor=self.owner_id,
            session_id=session_id,
            target=lease.execution_id,
            data={"epoch": lease.epoch},
            now=now,
        )
        return lease

    def _spawn(self, session_id: str, work: Coroutine[Any, Any, None]) -> None:
        self.tasks[session_id] = asyncio.create_task(work, name=f"session:{session_id}")

    # -- one session's task --------------------------------------------------
    async def _run_session(self, state: TurnState) -> None:
        session_id = state.lease.session_id
        try:
            while True:
                self.held[state.lease.execution_id] = state.lease
                faults.point("executor.after_claim")
                await self._drive(state)
                self.held.pop(state.lease.execution_id, None)
                if self.draining.is_set():
                    return
                lease = await self._claim(session_id)
                if lease is None:
                    return
                state = TurnState(lease)
        except LeaseLost as exc:
            await self._journal_lost(state.lease, str(exc))
        except RemError as exc:
            # the lease stays; it expires and any executor recovers the turn
            self.log.warning("session %s execution %s stopped: %s", session_id, state.lease.execution_id, exc)
        except Exception:
            self.log.exception(
                "session %s execution %s crashed; recovery will retry it",
                session_id,
                state.lease.execution_id,
            )
        finally:
            self.held.pop(state.lease.execution_id, None)
            self.tasks.pop(session_id, None)
            self.wake()

    async def _drive(self, state: TurnState) -> None:
        """Run steps until the turn has nothing left to answer, then end it cleanly."""
        while True:
            step = await self.db.write_in_thread(
                lambda conn: self._begin_step_sync(conn, state, clock.now_ms())
            )
            if step is None:
                return
            faults.point("executor.after_promote")
            try:
                tail = await self._stream(state, step)
            except (RemError, asyncio.CancelledError):
                raise  # a lost lease, the database, an injected fault: not the agent's failure
            except Exception as exc:  # the agent failed: close the step as an error, end the turn
                await self.db.write_in_thread(partial(self._fail_step_sync, state=state, step=step, exc=exc))
                return
            faults.point("executor.before_complete")
            more = await self.db.write_in_thread(
                partial(self._finish_step_sync, state=state, step=step, tail=tail)
            )
            step.written += len(tail)
            if not more:
                return

    def _begin_step_sync(self, conn: sqlite3.Connection, state: TurnState, now: int) -> Step | None:
        """Promote inputs and open the step's assistant row (phase `unknown`), or end the turn."""
        lease = state.lease
        number = state.step + 1
        aid = projection.assistant_id(lease.execution_id, number)
        leases.guard_sync(
            conn, lease, now=now, phase=ExecutionPhase.UNKNOWN, step=number, assistant_message_id=aid
        )
        unanswered = self._recovered_prompts_sync(conn, state)
        inputs = (
            []
            if self.draining.is_set()
            else sessions.pending_inputs_sync(conn, lease.session_id, turn_start=not state.turn_started)
        )
        if not unanswered and not inputs:
            self._end_sync(conn, state, now)
            return None
        step = self._open_step_sync(conn, state, number, aid, unanswered, inputs, now)
        # only after the transaction body succeeded (a rollback leaves the state as it was)
        state.step, state.turn_started, state.recovering = number, True, False
        return step

    def _recovered_prompts_sync(self, conn: sqlite3.Connection, state: TurnState) -> list[dict[str, Any]]:
        """After a takeover: what the interrupted execution promoted but never answered."""
        if not state.recovering:
            return []
        sid, eid = state.lease.session_id, state.lease.execution_id
        state.turn_started = projection.execution_started_turn_sync(conn, sid, eid)
        recovery.mark_continuing_sync(conn, eid)
        return projection.unanswered_prompts_sync(conn, sid)

    def _open_step_sync(
        self,
        conn: sqlite3.Connection,
        state: TurnState,
        number: int,
        aid: str,
        unanswered: list[dict[str, Any]],
        inputs: list[Any],
        now: int,
    ) -> Step:
        lease, sid = state.lease, state.lease.session_id
        first = sessions.reserve_seqs_sync(conn, sid, len(inputs) + 1, now, messages=len(inputs) + 1)
        promoted = sessions.promote_sync(conn, sid, lease.execution_id, inputs, first, now)
        if promoted and not state.turn_started:
            projection.record_context_epoch_sync(
                conn, sid, self.agent.system_prompt(), self.agent.snapshot(), promoted[0]["seq"], now
            )
        superseded = projection.supersede_open_sync(conn, sid, aid, now)
        prompts = unanswered + promoted
        data = {
            "execution_id": lease.execution_id,
            "status": "streaming",
            "text": "",
            "parent_id": prompts[-1]["id"],
            "answers": [p["id"] for p in prompts],
            "step": number,
            "epoch": lease.epoch,
            "agent": self.agent.name,
        }
        sessions.insert_message_sync(conn, aid, sid, "assistant", first + len(promoted), data, now)
        handoffs.mark_turns_changed_sync(conn, sid, now)
        if promoted or superseded:
            append_event_sync(
                conn,
                kind=EventKind.INPUT_PROMOTED,
                actor=self.owner_id,
                session_id=sid,
                target=lease.execution_id,
                now=now,
                data={
                    "inputs": [p["id"] for p in promoted],
                    "seqs": [p["seq"] for p in promoted],
                    "step": number,
                    "superseded": superseded,
                },
            )
        resumed = lease.execution_id if state.recovering else None
        request = StepRequest(
            session_id=sid, prompts=[p["text"] for p in prompts], step=number, resumed_from=resumed
        )
        return Step(number=number, assistant_id=aid, data=data, request=request)

    async def _stream(self, state: TurnState, step: Step) -> list[str]:
        """Project the agent's parts as they arrive; returns the parts not yet written."""
        loop = asyncio.get_running_loop()
        last_flush = loop.time()
        buffer: list[str] = []
        async for part in self.agent.stream(step.request):
            if state.lease.lost:
                raise LeaseLost(f"execution {state.lease.execution_id}: renewal failed")
            step.parts.append(part)
            buffer.append(part)
            if loop.time() - last_flush >= FLUSH_S:
                if step.written:
                    faults.point("executor.mid_stream")
                await self.db.write_in_thread(partial(self._flush_sync, state=state, step=step, parts=buffer))
                step.written += len(buffer)
                buffer, last_flush = [], loop.time()
        return buffer

    def _flush_sync(self, conn: sqlite3.Connection, state: TurnState, step: Step, parts: list[str]) -> None:
        now = clock.now_ms()
        leases.guard_sync(conn, state.lease, now=now)
        projection.write_parts_sync(conn, step.assistant_id, state.lease.session_id, step.written, parts, now)
        projection.update_owned_assistant_sync(
            conn, step.assistant_id, {**step.data, "text": "".join(step.parts)}, now
        )

    def _finish_step_sync(
        self, conn: sqlite3.Connection, state: TurnState, step: Step, tail: list[str]
    ) -> bool:
        """Close the step (`safe`, assistant completed); end the turn unless a steer is waiting."""
        lease, now = state.lease, clock.now_ms()
        leases.guard_sync(conn, lease, now=now, phase=ExecutionPhase.SAFE)
        if tail:
            projection.write_parts_sync(conn, step.assistant_id, lease.session_id, step.written, tail, now)
        step.data.update(status="completed", text="".join(step.parts), time_completed=now)
        projection.update_owned_assistant_sync(conn, step.assistant_id, step.data, now)
        handoffs.mark_turns_changed_sync(conn, lease.session_id, now)
        append_event_sync(
            conn,
            kind=EventKind.EXECUTION_STEP,
            actor=self.owner_id,
            session_id=lease.session_id,
            target=lease.execution_id,
            now=now,
            data={"step": step.number, "assistant_id": step.assistant_id, "parts": len(step.parts)},
        )
        more = (
            not self.draining.is_set()
            and conn.execute(
                "SELECT 1 FROM session_input WHERE session_id = ? AND promoted_seq IS NULL "
                "AND delivery = 'steer' LIMIT 1",
                (lease.session_id,),
            ).fetchone()
            is not None
        )
        if not more:
            self._end_sync(conn, state, now)
        return more

    def _fail_step_sync(self, conn: sqlite3.Connection, state: TurnState, step: Step, exc: Exception) -> None:
        """The agent raised: the step is answered with an error and the turn ends cleanly."""
        lease, now = state.lease, clock.now_ms()
        self.log.warning("agent failed in %s step %d: %r", lease.execution_id, step.number, exc)
        leases.guard_sync(conn, lease, now=now, phase=ExecutionPhase.SAFE)
        step.data.update(
            status="error", text="".join(step.parts), error=f"{type(exc).__name__}: {exc}", time_completed=now
        )
        projection.update_owned_assistant_sync(conn, step.assistant_id, step.data, now)
        handoffs.mark_turns_changed_sync(conn, lease.session_id, now)
        append_event_sync(
            conn,
            kind=EventKind.EXECUTION_FAILED,
            actor=self.owner_id,
            session_id=lease.session_id,
            target=lease.execution_id,
            now=now,
            data={"step": step.number, "error": step.data["error"]},
        )
        self._end_sync(conn, state, now)

    def _end_sync(self, conn: sqlite3.Connection, state: TurnState, now: int) -> None:
        """The clean end of an execution: delete its row, close its recovery, count the turn."""
        lease = state.lease
        leases.end_execution_sync(conn, lease)
        if state.recovered:
            recovery.finish_sync(conn, lease.execution_id)
        if state.turn_started:
            conn.execute("UPDATE session SET turn_count = turn_count + 1 WHERE id = ?", (lease.session_id,))
        append_event_sync(
            conn,
            kind=EventKind.EXECUTION_COMPLETED,
            actor=self.owner_id,
            session_id=lease.session_id,
            target=lease.execution_id,
            now=now,
            data={
                "epoch": lease.epoch,
                "steps": state.step,
                "recovered": state.recovered,
                "turn": state.turn_started,
            },
        )
        self.turns_completed += int(state.turn_started)

    async def _journal_lost(self, lease: Lease, reason: str) -> None:
        """Record the loss; the owner publishes nothing more for this execution."""
        self.log.warning("lost execution %s of session %s: %s", lease.execution_id, lease.session_id, reason)
        with contextlib.suppress(RemError):
            await self.db.write_in_thread(
                lambda conn: append_event_sync(
                    conn,
                    kind=EventKind.EXECUTION_LEASE_LOST,
                    actor=self.owner_id,
                    session_id=lease.session_id,
                    target=lease.execution_id,
                    data={"epoch": lease.epoch, "reason": reason},
                )
            )

    # -- renewal and hand-back ---------------------------------------------
    async def _renew_loop(self) -> None:
        interval = leases.renew_every_ms(self.lease_ms) / 1000
        while True:
            await asyncio.sleep(interval)
            held = list(self.held.values())
            if not held:
                continue
            try:
                for lease in await leases.renew(self.db, held):
                    lease.lost = True
            except RemError as exc:
                self.log.warning("lease renewal failed: %s", exc)

    async def hand_back(self) -> None:
        """Let in-flight turns finish (bounded); hand back any lease still held, then stop renewing."""
        if self.tasks:
            _, pending = await asyncio.wait(list(self.tasks.values()), timeout=self.drain_ms / 1000)
            leftover = list(self.held.values())
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for lease in leftover:
                await self._hand_back_lease(lease)
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None

    async def _hand_back_lease(self, lease: Lease) -> None:
        """A turn that outlived the drain grace: expire its lease now so another executor takes over."""
        try:
            await self.db.write_in_thread(
                lambda conn: leases.hand_back_execution_sync(
                    conn, lease, actor=self.owner_id, now=clock.now_ms()
                )
            )
        except RemError as exc:
            self.log.warning("could not hand back %s: %s", lease.execution_id, exc)
