"""The executor daemon: claims sessions with waiting inputs, runs their turns, recovers the dead.

One process runs up to `REM_EXECUTOR_CONCURRENCY` sessions at once, each in
its own task holding that session's execution lease. A turn is one
execution: claim (`ready`) -> per step: promote inputs and open the
assistant row (`unknown`), stream parts, close the row (`safe`) -> at the
end, delete the execution row (clean end). `steer` inputs join the running
turn at the next step boundary; a `queue` input starts the next turn. Every
write transaction of a turn (`backend.execution.steps`) starts with
`guard_sync`, fenced on (execution id, owner, epoch) (`backend.store.fencing`).
Expired or released executions are taken over through
`backend.execution.recovery`. The leases held are in `self.leases`, renewed by
the daemon's upkeep a third into each. Draining stops claiming, lets in-flight
turns finish (bounded), and ends their leases cleanly.

Streamed parts are written by `backend.execution.streaming.PartWriter`
(coalesced, fenced inserts; the upkeep's renewal keeps the lease while a
stream runs). A model's usage is written with the step's completion, in the same
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
import json
from collections.abc import Coroutine
from functools import partial
from typing import Any

from backend.core import clock, faults
from backend.core.errors import LeaseLost, RemError
from backend.core.settings import settings
from backend.execution import leases, recovery, sessions
from backend.execution.agent import Agent, load_agent
from backend.execution.leases import Lease
from backend.execution.steps import (
    EarlyMemory,
    Step,
    StepTransactions,
    TurnState,
    expected_inputs_sync,
    remember_memory,
)
from backend.execution.streaming import PartSink, PartWriter, StreamStats
from backend.execution.tool_runner import ToolRunner
from backend.memory.context import (
    chroma_running,
    lexical_memory_sync,
    memory_for_step,
    scope_row_sync,
    step_query,
    unavailable,
)
from backend.models import health
from backend.models.errors import ModelError, StreamInterrupted
from backend.runtime.context import Context
from backend.runtime.daemon import Daemon
from backend.store import fencing
from backend.store.db import Conn, Row
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
        self.turns_completed = 0
        self.stream_stats = StreamStats()
        self.reply_max_chars = settings.model_reply_max_chars
        self.steps = StepTransactions(
            owner_id=self.owner_id,
            agent=self.agent,
            draining=self.draining,
            # how many earlier messages a step reads for the agent (none: no query at all)
            history_messages=int(getattr(self.agent, "history_messages", 0) or 0),
            reply_max_chars=self.reply_max_chars,
            reasks=settings.model_retries,
            log=self.log,
            max_steps=settings.max_steps,
            claim_next=self._claim_sync,
        )
        self.tools = ToolRunner(lambda: self.db, self.owner_id, self.log, self.info, lambda: self.registered)
        self._sink: PartSink | None = None

    def info(self) -> dict[str, Any]:
        return {"agent": self.agent.name, "concurrency": self.concurrency, "lease_ms": self.lease_ms}

    async def on_heartbeat(self) -> None:
        await super().on_heartbeat()
        await self.tools.record_health()  # a server that died between turns (unchanged: nothing written)

    # -- the pass ----------------------------------------------------------
    async def run_pass(self) -> int:
        """Take over expired executions, then claim sessions with waiting inputs."""
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
            taken = await self.db.write_in_thread(
                partial(self._take_over_sync, execution_id=execution_id), key=session_id
            )
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
        lease = await self.db.write_in_thread(
            lambda conn: self._claim_sync(conn, session_id, clock.now_ms()), key=session_id
        )
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
                self.leases.hold(state.lease)
                faults.point("executor.after_claim")
                await self._drive(state)
                self.turns_completed += int(state.turn_counted)
                self.leases.drop(state.lease)
                lease = state.next_lease  # claimed by the transaction that ended the turn
                if lease is not None:
                    self.log.info(
                        "claimed session %s as %s (epoch %d)", session_id, lease.execution_id, lease.epoch
                    )
                elif self.draining.is_set():
                    return
                else:
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
            self.leases.drop(state.lease)
            self.tasks.pop(session_id, None)
            self.wake()

    async def _drive(self, state: TurnState) -> None:
        """Run steps until the turn has nothing left to answer, then end it cleanly."""
        while True:
            if await self.tools.advance(state):
                return  # parked: it waits for a person (backend.execution.parking)
            early = await self._recall_ahead(state)

            def begin(conn: Conn, early: EarlyMemory | None = early) -> Step | None:
                return self.steps.begin_step_sync(conn, state, clock.now_ms(), early)

            step = await self.db.write_in_thread(begin, key=state.lease.session_id)
            if step is None:
                return
            faults.point("executor.after_promote")
            try:
                step.request.tools = await self.tools.offered()
                await self._give_memory(state, step)
                tail, arrived, broken = await self._stream(state, step)
            except ModelError as exc:  # the model endpoint failed: an error reply, maybe a hold
                await self._write(partial(self.steps.fail_step_sync, state=state, step=step, exc=exc))
                return
            except (RemError, asyncio.CancelledError):
                raise  # a lost lease, the database, an injected fault: not the agent's failure
            except Exception as exc:  # the agent failed: close the step as an error, end the turn
                if self.db.is_engine_error(exc):
                    raise  # a write of rem's own failed, not the agent: recovery retries the turn
                await self._write(partial(self.steps.fail_step_sync, state=state, step=step, exc=exc))
                return
            if broken is not None:
                finish = partial(
                    self.steps.interrupt_step_sync, state=state, step=step, tail=tail, error=broken
                )
            elif step.request.tool_calls and not step.truncated:
                planned = await self.tools.plan(step.request.tool_calls)
                finish = partial(
                    self.steps.finish_tool_step_sync, state=state, step=step, tail=tail, planned=planned
                )
            else:
                faults.point("executor.before_complete")
                finish = partial(self.steps.finish_step_sync, state=state, step=step, tail=tail)
            more = await self._write(finish)
            if state.calls_open:
                faults.point("tools.after_insert")
            self.stream_stats.committed(arrived, asyncio.get_running_loop().time())
            if not more:
                return

    async def _write(self, fn: partial[bool] | partial[None]) -> bool:
        """A step-closing transaction, carrying the model request records made so far."""
        calls = health.take()
        try:
            key = fn.keywords["state"].lease.session_id
            return bool(await self.db.write_in_thread(partial(fn, calls=calls), key=key))
        except BaseException:
            health.give_back(calls)
            raise

    async def _recall_ahead(self, state: TurnState) -> EarlyMemory | None:
        """The next step's memory, recalled for the inputs it is expected to promote, so the
        transaction that opens the step records it too (one write transaction fewer a step).
        With no Chroma to ask, the inputs, the scope and the memory are one read. A tool round
        answers the prompts the step before answered, with their memory: nothing to read ahead
        (a steer that arrived meanwhile is recalled for once the step has promoted it)."""
        if state.tool_round and state.given_memory is not None:
            return None
        here = not chroma_running(self.ctx)
        rows, scope, memory = await self.db.read_beside(
            partial(_expected_sync, state=state, draining=self.draining.is_set(), memory_here=here)
        )
        if not rows:
            return None
        if isinstance(memory, BaseException):
            memory = unavailable(state.lease.session_id, self.db.translate(memory))
        elif not here:
            memory = await memory_for_step(self.ctx, state.lease.session_id, _prompts(rows), scope)
        return None if memory is None else EarlyMemory(tuple(row["id"] for row in rows), memory)

    async def _give_memory(self, state: TurnState, step: Step) -> None:
        """Recall the step's memory and record it with the step before the agent sees it."""
        if "memory" in step.data:
            return  # reused from the interrupted step, or recalled ahead and recorded with it
        memory = await memory_for_step(self.ctx, state.lease.session_id, step.request.prompts)
        if memory is None:
            return
        step.data["memory"] = memory
        await self.db.write_in_thread(
            partial(self.steps.record_memory_sync, state=state, step=step), key=state.lease.session_id
        )
        step.request.memory = list(memory["items"])
        remember_memory(state, tuple(step.data["answers"]), memory)

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
                ),
                key=lease.session_id,
            )

    async def hand_back(self) -> None:
        """Let in-flight turns finish (bounded); hand back any lease still held."""
        if self.tasks:
            _, pending = await asyncio.wait(list(self.tasks.values()), timeout=self.drain_ms / 1000)
            leftover = self.leases.held()
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for lease in leftover:
                await self._hand_back_lease(lease)
        close = getattr(self.agent, "aclose", None)  # a model agent's connections
        if close is not None:
            await close()
        await self.tools.aclose()  # the tool servers this process started

    async def _hand_back_lease(self, lease: fencing.Lease) -> None:
        """A turn that outlived the drain grace: expire its lease now so another executor takes over."""
        try:
            await self.db.write_in_thread(
                lambda conn: leases.hand_back_execution_sync(
                    conn, lease, actor=self.owner_id, now=clock.now_ms()
                ),
                key=lease.session_id,
            )
        except RemError as exc:
            self.log.warning("could not hand back %s: %s", lease.key, exc)


def _prompts(rows: list[Any]) -> list[str]:
    return [str(json.loads(row["prompt"]).get("text", "")) for row in rows]


def _expected_sync(
    conn: Conn, state: TurnState, draining: bool, memory_here: bool
) -> tuple[list[Any], tuple[Row | None], dict[str, Any] | BaseException | None]:
    """The next step's expected inputs and, if any, its memory's scope row, and (`memory_here`:
    no Chroma to ask) its memory or the error recalling it met: one thread hop."""
    rows = expected_inputs_sync(conn, state, draining)
    scope = (scope_row_sync(conn, state.lease.session_id) if rows else None,)
    query = step_query(_prompts(rows)) if rows and memory_here else None
    if query is None:
        return rows, scope, None
    try:
        return rows, scope, lexical_memory_sync(conn, state.lease.session_id, query, scope[0])
    except Exception as exc:  # memory is a help: the inputs read stands (`unavailable` names it)
        return rows, scope, exc
