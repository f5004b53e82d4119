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

Streamed parts are written by `backend.execution.streaming.PartWriter`
(coalesced, fenced inserts; the renewal loop keeps the lease while a stream
runs). A model's usage is written with the step's completion, in the same
transaction. Model failures (`backend.models.errors`): a stream that broke
mid-reply is closed as `interrupted` and the step re-asked with the partial
text (bounded by `REM_MODEL_RETRIES` per turn); any other failure ends the
turn with an error reply, and one that needs an operator (a bad key, an
unknown model) also holds the session until `rem resume`. A reply that reaches
`REM_MODEL_REPLY_MAX_CHARS` stops being read there: the step completes with
the text up to the bound, marked truncated, with an `execution.truncated` event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from backend.core import clock, faults
from backend.core.errors import LeaseLost, RemError
from backend.core.settings import settings
from backend.execution import leases, model_turns, projection, recovery, sessions
from backend.execution.agent import Agent, StepRequest, load_agent
from backend.execution.leases import ExecutionPhase, Lease
from backend.execution.streaming import PartSink, PartWriter, StreamStats
from backend.memory.context import memory_for_step
from backend.models import health
from backend.models.errors import ModelError, StreamInterrupted
from backend.models.health import CallRecord
from backend.runtime.context import Context
from backend.runtime.daemon import Daemon
from backend.store import handoffs
from backend.store.db import Conn, execute_unread, read_together_sync
from backend.store.events import EventKind, append_event_sync
from backend.store.workers import WorkerRole

# The wake scan, served by opencode's wake index
# session_input_wake_pending_promoted_attempts_created_id_idx: least-tried first,
# so a session that keeps failing cannot starve the others.
WAKE_SQL = """
SELECT i.session_id FROM session_input AS i
WHERE i.wake_pending = 1 AND i.promoted_seq IS NULL
  AND NOT EXISTS (SELECT 1 FROM session_execution AS e WHERE e.session_id = i.session_id)
ORDER BY i.wake_attempts, i.time_created, i.id LIMIT :limit
"""


# a session held for an operator (a model error that needs one) is never claimed
BUMP_OLDEST_SQL = f"""
UPDATE session_input SET wake_attempts = wake_attempts + 1
WHERE id = ({sessions.OLDEST_PENDING_SQL})
  AND NOT EXISTS (SELECT 1 FROM session_execution WHERE session_id = :sid)
  AND NOT EXISTS (SELECT 1 FROM session WHERE id = :sid AND held_at IS NOT NULL)
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
    # when the oldest input this execution promoted was admitted (the turn's latency starts there)
    admitted_at: int | None = None
    # set when a step's stream broke mid-reply: the next step re-asks with what arrived
    reask: model_turns.Reask | None = None
    interruptions: int = 0
    # set by the transaction that ended the execution cleanly, if it ended a turn
    turn_counted: bool = False


@dataclass(kw_only=True)
class Step:
    """One step in flight: its assistant row, what it answers, the parts streamed so far."""

    number: int
    assistant_id: str
    data: dict[str, Any]
    request: StepRequest
    # the deltas streamed so far, and how many part rows they were written as
    parts: list[str] = field(default_factory=list)
    written: int = 0
    # characters streamed so far; the reply reached REM_MODEL_REPLY_MAX_CHARS (the rest unread)
    chars: int = 0
    truncated: bool = False


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
        self.stream_stats = StreamStats()
        # how many earlier messages a step reads for the agent (none: no query at all)
        self.history_messages = int(getattr(self.agent, "history_messages", 0) or 0)
        self.reasks = settings.model_retries
        self.reply_max_chars = settings.model_reply_max_chars
        self._sink: PartSink | None = None
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

    def _take_over_sync(self, conn: Conn, execution_id: str) -> recovery.Takeover | None:
        return recovery.take_over_sync(
            conn, execution_id, self.owner_id, now=clock.now_ms(), budget=self.budget, length_ms=self.lease_ms
        )

    async def _claim_waiting(self) -> int:
        if self._capacity() <= 0:
            return 0
        rows = await self.db.fetchall_beside(WAKE_SQL, {"limit": self._capacity() * 4})
        candidates = [sid for sid in dict.fromkeys(r[0] for r in rows) if sid not in self.tasks]
        # claimed together, the claims share group commits (a backlog of 200 sessions starts in
        # a few commits, not 200 round trips); a claim that loses a race just starts nothing
        claims = await asyncio.gather(
            *(self._claim(sid) for sid in candidates[: self._capacity()]), return_exceptions=True
        )
        started = 0
        for session_id, lease in zip(candidates, claims, strict=False):
            if isinstance(lease, Lease):
                self._spawn(session_id, self._run_session(TurnState(lease)))
                started += 1
        for failure in claims:
            if isinstance(failure, BaseException):
                raise failure
        return started

    async def _claim(self, session_id: str) -> Lease | None:
        """Claim the session's lease if it has a waiting input (counting that input's attempt first)."""
        lease = await self.db.write_in_thread(lambda conn: self._claim_sync(conn, session_id, clock.now_ms()))
        if lease is not None:
            self.log.info("claimed session %s as %s (epoch %d)", session_id, lease.execution_id, lease.epoch)
        return lease

    def _claim_sync(self, conn: Conn, session_id: str, now: int) -> Lease | None:
        # the session row first: on PostgreSQL a rival claiming it now is skipped (no attempt
        # counted twice); then the oldest waiting input's attempt is counted before the work;
        # nothing waiting or the session busy: nothing written
        epoch = leases.lock_session_epoch_sync(conn, session_id)
        if epoch is None:
            return None
        # under the lock, BUMP_OLDEST_SQL also sees that no execution holds the session
        if conn.execute(BUMP_OLDEST_SQL, {"sid": session_id}).fetchone() is None:
            return None
        lease = leases.claim_locked_execution_sync(
            conn, session_id, self.owner_id, epoch, now=now, length_ms=self.lease_ms
        )
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
                self.turns_completed += int(state.turn_counted)
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
                await self._give_memory(state, step)
                tail, arrived, broken = await self._stream(state, step)
            except ModelError as exc:  # the model endpoint failed: an error reply, maybe a hold
                await self._write(partial(self._fail_step_sync, state=state, step=step, exc=exc))
                return
            except (RemError, asyncio.CancelledError):
                raise  # a lost lease, the database, an injected fault: not the agent's failure
            except Exception as exc:  # the agent failed: close the step as an error, end the turn
                if self.db.is_engine_error(exc):
                    raise  # a write of rem's own failed, not the agent: recovery retries the turn
                await self._write(partial(self._fail_step_sync, state=state, step=step, exc=exc))
                return
            if broken is not None:
                finish = partial(self._interrupt_step_sync, state=state, step=step, tail=tail, error=broken)
            else:
                faults.point("executor.before_complete")
                finish = partial(self._finish_step_sync, state=state, step=step, tail=tail)
            more = await self._write(finish)
            self.stream_stats.committed(arrived, asyncio.get_running_loop().time())
            if not more:
                return

    async def _write(self, fn: partial[bool] | partial[None]) -> bool:
        """A step-closing transaction, carrying the model request records made so far."""
        calls = health.take()
        try:
            return bool(await self.db.write_in_thread(partial(fn, calls=calls)))
        except BaseException:
            health.give_back(calls)
            raise

    def _begin_step_sync(self, conn: Conn, state: TurnState, now: int) -> Step | None:
        """Promote inputs and open the step's assistant row (phase `unknown`), or end the turn."""
        lease = state.lease
        number = state.step + 1
        aid = projection.assistant_id(lease.execution_id, number)
        leases.guard_sync(
            conn,
            lease,
            now=now,
            unread=True,
            phase=ExecutionPhase.UNKNOWN,
            step=number,
            assistant_message_id=aid,
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

    def _recovered_prompts_sync(self, conn: Conn, state: TurnState) -> list[dict[str, Any]]:
        """After a takeover or a broken stream: what was promoted but never answered."""
        sid, eid = state.lease.session_id, state.lease.execution_id
        if state.recovering:
            state.turn_started = projection.execution_started_turn_sync(conn, sid, eid)
            recovery.mark_continuing_sync(conn, eid)
            state.reask = model_turns.interrupted_reply_sync(conn, sid)
        elif state.reask is None:
            return []
        return projection.unanswered_prompts_sync(conn, sid)

    def _open_step_sync(
        self,
        conn: Conn,
        state: TurnState,
        number: int,
        aid: str,
        unanswered: list[dict[str, Any]],
        inputs: list[Any],
        now: int,
    ) -> Step:
        lease, sid = state.lease, state.lease.session_id
        count = len(inputs) + 1
        reused: dict[str, Any] | None = None
        if state.recovering:
            # a recovered step is given exactly the memory the interrupted one was given (read
            # before this step closes the rows still streaming: only rows closed earlier count)
            first = sessions.reserve_seqs_sync(conn, sid, count, now, messages=count)
            reused = projection.interrupted_step_memory_sync(conn, sid, lease.execution_id)
            superseded = projection.supersede_open_sync(conn, sid, aid, now)
        else:
            # independent statements, sent together: one round trip on PostgreSQL
            first, superseded = read_together_sync(
                conn,
                [
                    sessions.reserve_seqs(sid, count, now, messages=count),
                    projection.supersede_open(sid, aid, now),
                ],
            )
        promoted = sessions.promote_sync(conn, sid, lease.execution_id, inputs, first, now)
        if promoted and state.admitted_at is None:
            state.admitted_at = min(p["admitted_at"] for p in promoted)
        if promoted and not state.turn_started:
            projection.queue_context_epoch_sync(
                conn, sid, self.agent.system_prompt(), self.agent.snapshot(), promoted[0]["seq"], now
            )
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
        if reused is not None:
            data["memory"] = {**reused, "reused": True}
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
            session_id=sid,
            prompts=[p["text"] for p in prompts],
            step=number,
            resumed_from=resumed,
            memory=list(reused.get("items") or []) if reused else [],
        )
        if state.reask is not None:
            data["reask"] = state.reask.reason
            request.interrupted, request.interrupted_reason = state.reask.partial, state.reask.reason
            state.reask = None
        if self.history_messages:
            request.history = model_turns.history_sync(conn, sid, prompts[0]["seq"], self.history_messages)
        return Step(number=number, assistant_id=aid, data=data, request=request)

    async def _give_memory(self, state: TurnState, step: Step) -> None:
        """Recall the step's memory and record it with the step before the agent sees it."""
        if "memory" in step.data:
            return  # reused from the interrupted step
        memory = await memory_for_step(self.ctx, state.lease.session_id, step.request.prompts)
        if memory is None:
            return
        step.data["memory"] = memory
        await self.db.write_in_thread(partial(self._record_memory, state=state, step=step))
        step.request.memory = list(memory["items"])

    def _record_memory(self, conn: Conn, state: TurnState, step: Step) -> None:
        now = clock.now_ms()
        leases.guard_sync(conn, state.lease, now=now, unread=True)
        projection.update_owned_assistant_sync(conn, step.assistant_id, step.data, now, unread=True)

    async def _stream(
        self, state: TurnState, step: Step
    ) -> tuple[list[str], list[float], StreamInterrupted | None]:
        """Project the agent's deltas as they arrive: (deltas not yet written, their arrival, a break)."""
        writer = PartWriter(partial(self._flush_parts, state=state, step=step), stats=self.stream_stats)
        stream = self.agent.stream(step.request)
        broken: StreamInterrupted | None = None
        try:
            async for part in stream:
                if state.lease.lost:
                    raise LeaseLost(f"execution {state.lease.execution_id}: renewal failed")
                if not part:
                    continue  # nothing to make durable (never an empty part row)
                part = self._within_bound(step, part)
                step.parts.append(part)
                writer.add(part)
                if step.truncated:
                    break  # closing the stream (below) stops the agent: the rest is never read
        except StreamInterrupted as exc:
            broken = exc
        except BaseException:
            await writer.abort()
            raise
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        tail, arrived = await writer.close()
        reply = step.request.reply
        step.truncated = step.truncated or (reply is not None and reply.truncated)
        return tail, arrived, broken

    def _within_bound(self, step: Step, part: str) -> str:
        """`part`, cut where the reply reaches REM_MODEL_REPLY_MAX_CHARS (which marks it truncated)."""
        room = self.reply_max_chars - step.chars
        if len(part) >= room:
            part, step.truncated = part[:room], True
        step.chars += len(part)
        return part

    async def _flush_parts(self, parts: list[str], *, state: TurnState, step: Step) -> None:
        if step.written:
            faults.point("executor.mid_stream")
        if self._sink is None:
            self._sink = PartSink(self.db)
        await self._sink.write(state.lease, step.assistant_id, step.written, "".join(parts))
        step.written += 1

    def _flush_sync(self, conn: Conn, state: TurnState, step: Step, text: str) -> None:
        """One coalesced part, fenced (no lease-row write: the renewal loop keeps the lease)."""
        projection.write_fenced_part_sync(
            conn, state.lease, step.assistant_id, step.written, text, clock.now_ms()
        )

    def _finish_step_sync(
        self,
        conn: Conn,
        state: TurnState,
        step: Step,
        tail: list[str],
        calls: Sequence[CallRecord] = (),
    ) -> bool:
        """Close the step (`safe`, assistant completed, usage counted); end the turn unless a steer waits."""
        lease, now = state.lease, clock.now_ms()
        leases.guard_sync(conn, lease, now=now, unread=True, phase=ExecutionPhase.SAFE)
        if tail:
            projection.write_parts_sync(
                conn, step.assistant_id, lease.session_id, step.written, ["".join(tail)], now
            )
        step.data.update(status="completed", text="".join(step.parts), time_completed=now)
        model_turns.record_reply_sync(
            conn, lease.session_id, step.data, step.request.reply, calls, self.owner_id, now
        )
        if step.truncated:
            model_turns.record_truncation_sync(
                conn, lease, step.assistant_id, step.number, step.data, self.reply_max_chars, now
            )
        projection.update_owned_assistant_sync(conn, step.assistant_id, step.data, now, unread=True)
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

    def _fail_step_sync(
        self,
        conn: Conn,
        state: TurnState,
        step: Step,
        exc: Exception,
        calls: Sequence[CallRecord] = (),
    ) -> None:
        """The agent raised: the step is answered with an error and the turn ends cleanly."""
        lease, now = state.lease, clock.now_ms()
        self.log.warning("agent failed in %s step %d: %r", lease.execution_id, step.number, exc)
        leases.guard_sync(conn, lease, now=now, unread=True, phase=ExecutionPhase.SAFE)
        text = "".join(step.parts)
        error: Any = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, ModelError):
            error = exc.as_dict()
            text = text or model_turns.error_reply(exc, lease.session_id)
            model_turns.record_failure_sync(
                conn, lease.session_id, exc, step.request.reply, calls, self.owner_id, now
            )
        step.data.update(status="error", text=text, error=error, time_completed=now)
        projection.update_owned_assistant_sync(conn, step.assistant_id, step.data, now, unread=True)
        handoffs.mark_turns_changed_sync(conn, lease.session_id, now)
        append_event_sync(
            conn,
            kind=EventKind.EXECUTION_FAILED,
            actor=self.owner_id,
            session_id=lease.session_id,
            target=lease.execution_id,
            now=now,
            data={
                "step": step.number,
                "error": error,
                "class": exc.error_class if isinstance(exc, ModelError) else "agent",
            },
        )
        self._end_sync(conn, state, now)

    def _interrupt_step_sync(
        self,
        conn: Conn,
        state: TurnState,
        step: Step,
        tail: list[str],
        error: StreamInterrupted,
        calls: Sequence[CallRecord] = (),
    ) -> bool:
        """A stream broke mid-reply: keep what arrived, close the row as interrupted, re-ask.

        Past `REM_MODEL_RETRIES` interruptions in one turn, the step ends as an error reply.
        """
        lease, now = state.lease, clock.now_ms()
        if state.interruptions >= self.reasks:
            self._fail_step_sync(conn, state, step, error, calls)
            return False
        leases.guard_sync(conn, lease, now=now, unread=True)
        if tail:
            projection.write_parts_sync(
                conn, step.assistant_id, lease.session_id, step.written, ["".join(tail)], now
            )
        step.data.update(
            status="interrupted", text="".join(step.parts), error=error.as_dict(), time_completed=now
        )
        projection.update_owned_assistant_sync(conn, step.assistant_id, step.data, now, unread=True)
        model_turns.record_failure_sync(
            conn, lease.session_id, error, step.request.reply, calls, self.owner_id, now
        )
        append_event_sync(
            conn,
            kind=EventKind.EXECUTION_INTERRUPTED,
            actor=self.owner_id,
            session_id=lease.session_id,
            target=lease.execution_id,
            now=now,
            data={
                "step": step.number,
                "assistant_id": step.assistant_id,
                "chars": len(step.data["text"]),
                **error.as_dict(),
            },
        )
        state.interruptions += 1
        state.reask = model_turns.Reask(step.data["text"], error.error_class)
        return True

    def _end_sync(self, conn: Conn, state: TurnState, now: int) -> None:
        """The clean end of an execution: delete its row, close its recovery, count the turn."""
        lease = state.lease
        leases.end_execution_sync(conn, lease, unread=True)
        if state.recovered:
            recovery.finish_sync(conn, lease.execution_id)
        if state.turn_started:
            execute_unread(
                conn, "UPDATE session SET turn_count = turn_count + 1 WHERE id = ?", (lease.session_id,)
            )
        append_event_sync(
            conn,
            kind=EventKind.EXECUTION_COMPLETED,
            actor=self.owner_id,
            session_id=lease.session_id,
            target=lease.execution_id,
            now=now,
            data=self._completion(state, now),
        )
        # counted by `_run_session` once the transaction is in: a fenced write sent unread may
        # still fail it (a lost lease) after this function returned
        state.turn_counted = state.turn_started

    @staticmethod
    def _completion(state: TurnState, now: int) -> dict[str, Any]:
        """The execution.completed event's data; a turn's latency when its inputs were seen admitted."""
        data: dict[str, Any] = {
            "epoch": state.lease.epoch,
            "steps": state.step,
            "recovered": state.recovered,
            "turn": state.turn_started,
        }
        if state.turn_started and state.admitted_at is not None:
            data["latency_ms"] = now - state.admitted_at
        return data

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
        close = getattr(self.agent, "aclose", None)  # a model agent's connections
        if close is not None:
            await close()

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
