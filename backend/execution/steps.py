"""A turn's transactions: open a step, record its memory, close it (completed, failed,
interrupted) and end the execution, each on the database thread, each fenced first.

Every transaction here starts with `guard_sync` on the turn's lease, sent
unread on PostgreSQL (`backend.store.fencing`): it renews the lease and moves
the execution's phase, and a lost lease fails the whole transaction before
any of it commits. The executor (`backend.execution.executor`) runs them in
order and streams the agent's reply in between; a step's effects in flight
are what phase `unknown` says.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from backend.core import clock
from backend.execution import model_turns, projection, recovery, sessions, tool_calls
from backend.execution.agent import Agent, StepRequest
from backend.execution.leases import ExecutionPhase, Lease
from backend.models.errors import ModelError, StreamInterrupted
from backend.models.health import CallRecord
from backend.store import handoffs
from backend.store.db import Conn, Row, execute_unread, read_together_sync
from backend.store.events import EventKind, append_event_sync
from backend.store.fencing import end_sync, guard_sync

# the one steer query a closing step makes: does a steer input wait for this turn?
STEER_WAITING_SQL = (
    "SELECT 1 FROM session_input WHERE session_id = ? AND promoted_seq IS NULL AND delivery = 'steer' LIMIT 1"
)


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
    # tool calls: a step inserted calls not yet terminal (`ToolRunner.advance` moves them on);
    # the next step answers the same prompts with their results; steps that asked for tools
    calls_open: bool = False
    tool_round: bool = False
    tool_steps: int = 0
    # the prompts (their ids) the last step answered and the memory it was given: a step that
    # answers the same prompts (a tool round, a re-ask) is given the same memory, not a new recall
    given_memory: tuple[tuple[str, ...], dict[str, Any]] | None = None
    # the execution's open calls as the transaction that inserted them read them (the tool
    # runner's first look, without a transaction of its own); taken once
    open_calls: list[Row] | None = None
    # the turn's tool rounds read so far whose calls are all terminal (they change no more): each
    # step reads only the rounds after them, not every round again (`tool_rounds_sync`)
    settled_rounds: list[dict[str, Any]] = field(default_factory=list)
    # the prompts the last step answered ({"id", "seq", "text"}): a tool round answers them again
    # (only this execution, holding the lease, adds user rows), so it need not look them up
    answered: list[dict[str, Any]] | None = None
    # the replies this execution completed and the inputs they answered (`execution.completed`
    # names them: the API's `turn.completed` event and `GET /v1/inputs/{id}` read them there)
    replies: list[str] = field(default_factory=list)
    replied_inputs: list[str] = field(default_factory=list)


def remember_memory(state: TurnState, prompt_ids: tuple[str, ...], memory: dict[str, Any] | None) -> None:
    """Keep the memory a step answering `prompt_ids` was given, for the next step on the same
    prompts (none kept when recall failed: the next step tries again)."""
    if memory is not None and "error" not in memory:
        state.given_memory = (prompt_ids, memory)


def tool_rounds_sync(conn: Conn, state: TurnState) -> list[dict[str, Any]]:
    """The turn's tool rounds for the next step: the settled ones kept, the rest read now."""
    kept = state.settled_rounds
    fresh = tool_calls.rounds_sync(conn, state.lease.execution_id, kept[-1]["step"] if kept else -1)
    state.settled_rounds = kept + list(itertools.takewhile(tool_calls.settled, fresh))
    return kept + fresh


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


@dataclass(frozen=True)
class EarlyMemory:
    """A step's memory recalled before it opened, for the inputs it expected to promote."""

    input_ids: tuple[str, ...]
    memory: dict[str, Any]


def expected_inputs_sync(conn: Conn, state: TurnState, draining: bool) -> list[Any]:
    """The inputs the next `begin_step_sync` would promote, read ahead (none: a step that
    recovers or re-asks answers more than its inputs, and a draining one promotes none)."""
    if state.recovering or state.reask is not None or draining:
        return []
    return sessions.pending_inputs_sync(conn, state.lease.session_id, turn_start=not state.turn_started)


@dataclass(kw_only=True)
class Opened:
    """What opening a step read and wrote: the prompts it answers and what it superseded."""

    prompts: list[dict[str, Any]]
    promoted: list[dict[str, Any]]
    first_seq: int
    superseded: list[str]
    reused_memory: dict[str, Any] | None
    # recalled before the step opened, for exactly these prompts (`EarlyMemory`)
    memory: dict[str, Any] | None = None


class StepTransactions:
    """The transactions of one executor's turns (its owner id, agent and limits bound)."""

    def __init__(
        self,
        *,
        owner_id: str,
        agent: Agent,
        draining: asyncio.Event,
        history_messages: int,
        reply_max_chars: int,
        reasks: int,
        log: logging.Logger,
        max_steps: int = 25,
    ) -> None:
        self.owner_id = owner_id
        self.agent = agent
        self.draining = draining
        self.history_messages = history_messages
        self.reply_max_chars = reply_max_chars
        self.reasks = reasks
        self.log = log
        self.max_steps = max_steps

    # -- opening a step ------------------------------------------------------------
    def begin_step_sync(
        self, conn: Conn, state: TurnState, now: int, early: EarlyMemory | None = None
    ) -> Step | None:
        """Promote inputs and open the step's assistant row (phase `unknown`), or end the turn.

        `early`: memory recalled for the inputs this step was expected to promote; recorded
        with the row when those are exactly what it promotes (else the executor recalls again).
        """
        lease = state.lease
        number = state.step + 1
        aid = projection.assistant_id(lease.execution_id, number)
        guard_sync(
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
            self.end_sync(conn, state, now)
            return None
        opened = self._promote_sync(conn, state, aid, unanswered, inputs, now)
        ids = tuple(p["id"] for p in opened.prompts)
        if early is not None and early.input_ids == ids:
            opened.memory = early.memory
        elif state.given_memory is not None and state.given_memory[0] == ids:
            opened.memory = state.given_memory[1]
        step = self._open_assistant_sync(conn, state, number, aid, opened, now)
        # only after the transaction body succeeded (a rollback leaves the state as it was)
        state.step, state.turn_started, state.recovering = number, True, False
        state.answered = [{"id": p["id"], "seq": p["seq"], "text": p["text"]} for p in opened.prompts]
        remember_memory(state, ids, opened.memory or opened.reused_memory)
        return step

    def _recovered_prompts_sync(self, conn: Conn, state: TurnState) -> list[dict[str, Any]]:
        """After a takeover or a broken stream: what was promoted but never answered."""
        sid, eid = state.lease.session_id, state.lease.execution_id
        if state.recovering:
            state.turn_started = projection.execution_started_turn_sync(conn, sid, eid)
            recovery.mark_continuing_sync(conn, eid)
            state.reask = model_turns.interrupted_reply_sync(conn, sid)
        elif state.reask is None and not state.tool_round:
            return []
        elif state.reask is None and state.answered is not None:
            state.tool_round = False
            return [dict(prompt) for prompt in state.answered]
        state.tool_round = False
        return projection.unanswered_prompts_sync(conn, sid)

    def _promote_sync(
        self,
        conn: Conn,
        state: TurnState,
        aid: str,
        unanswered: list[dict[str, Any]],
        inputs: list[Any],
        now: int,
    ) -> Opened:
        """Reserve the step's seqs, close stale rows, promote the waiting inputs to user rows."""
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
            projection.queue_context_baseline_sync(
                conn, sid, self.agent.system_prompt(), self.agent.snapshot(), promoted[0]["seq"], now
            )
        return Opened(
            prompts=unanswered + promoted,
            promoted=promoted,
            first_seq=first,
            superseded=superseded,
            reused_memory=reused,
        )

    def _open_assistant_sync(
        self, conn: Conn, state: TurnState, number: int, aid: str, opened: Opened, now: int
    ) -> Step:
        """Insert the step's assistant row (`streaming`) and journal what it promoted."""
        lease, sid, prompts = state.lease, state.lease.session_id, opened.prompts
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
        if opened.reused_memory is not None:
            data["memory"] = {**opened.reused_memory, "reused": True}
        elif opened.memory is not None:
            data["memory"] = opened.memory  # in the row from its first commit: no write of its own
        seq = opened.first_seq + len(opened.promoted)
        sessions.insert_message_sync(conn, aid, sid, "assistant", seq, data, now)
        if opened.promoted or opened.superseded:  # raw turns changed (a streaming row is none yet)
            handoffs.mark_turns_changed_sync(conn, sid, now)
            append_event_sync(
                conn,
                kind=EventKind.INPUT_PROMOTED,
                actor=self.owner_id,
                session_id=sid,
                target=lease.execution_id,
                now=now,
                data={
                    "inputs": [p["id"] for p in opened.promoted],
                    "seqs": [p["seq"] for p in opened.promoted],
                    "step": number,
                    "superseded": opened.superseded,
                },
            )
        return Step(
            number=number,
            assistant_id=aid,
            data=data,
            request=self._request_sync(conn, state, number, data, opened),
        )

    def _request_sync(
        self, conn: Conn, state: TurnState, number: int, data: dict[str, Any], opened: Opened
    ) -> StepRequest:
        """What the agent is asked: the prompts, the reused memory, a re-ask, the history."""
        reused, prompts = opened.reused_memory, opened.prompts
        request = StepRequest(
            session_id=state.lease.session_id,
            prompts=[p["text"] for p in prompts],
            step=number,
            resumed_from=state.lease.execution_id if state.recovering else None,
            memory=list((reused or opened.memory or {}).get("items") or []),
        )
        if state.reask is not None:
            data["reask"] = state.reask.reason
            request.interrupted, request.interrupted_reason = state.reask.partial, state.reask.reason
            state.reask = None
        if state.tool_steps or state.recovering:
            request.tool_rounds = tool_rounds_sync(conn, state)
            state.tool_steps = len(request.tool_rounds)
        if self.history_messages:
            request.history = model_turns.history_sync(
                conn, state.lease.session_id, prompts[0]["seq"], self.history_messages
            )
        return request

    # -- while it streams ----------------------------------------------------------
    def record_memory_sync(self, conn: Conn, state: TurnState, step: Step) -> None:
        """Record the memory the step is given on its assistant row, before the agent sees it."""
        now = clock.now_ms()
        guard_sync(conn, state.lease, now=now, unread=True)
        projection.update_owned_assistant_sync(conn, step.assistant_id, step.data, now, unread=True)

    def flush_sync(self, conn: Conn, state: TurnState, step: Step, text: str) -> None:
        """One coalesced part, fenced (no lease-row write: the renewal keeps the lease)."""
        projection.write_fenced_part_sync(
            conn, state.lease, step.assistant_id, step.written, text, clock.now_ms()
        )

    # -- closing it --------------------------------------------------------------
    def finish_step_sync(
        self,
        conn: Conn,
        state: TurnState,
        step: Step,
        tail: list[str],
        calls: Sequence[CallRecord] = (),
    ) -> bool:
        """Close the step (`safe`, assistant completed, usage counted); end the turn unless a steer waits."""
        lease, now = state.lease, self._close_sync(conn, state, step, tail)
        step.data.update(status="completed", text="".join(step.parts), time_completed=now)
        model_turns.record_reply_sync(
            conn, lease.session_id, step.data, step.request.reply, calls, self.owner_id, now
        )
        if step.truncated:
            model_turns.record_truncation_sync(
                conn, lease, step.assistant_id, step.number, step.data, self.reply_max_chars, now
            )
        self._publish_sync(conn, lease, step, now, parts=len(step.parts))
        note_reply(state, step)
        more = (
            not self.draining.is_set()
            and conn.execute(STEER_WAITING_SQL, (lease.session_id,)).fetchone() is not None
        )
        if not more:
            self.end_sync(conn, state, now)
        return more

    def _close_sync(self, conn: Conn, state: TurnState, step: Step, tail: list[str]) -> int:
        """The start of closing a step, either way: the lease checked (phase `safe`), the tail's parts
        written; returns the closing's time."""
        now = clock.now_ms()
        guard_sync(conn, state.lease, now=now, unread=True, phase=ExecutionPhase.SAFE)
        if tail:
            projection.write_parts_sync(
                conn, step.assistant_id, state.lease.session_id, step.written, ["".join(tail)], now
            )
        return now

    def _publish_sync(self, conn: Conn, lease: Lease, step: Step, now: int, **event: Any) -> None:
        """The end of closing a step, either way: the assistant row written, the turns marked changed
        for the index, the step journaled (`event`: what the step made)."""
        projection.update_owned_assistant_sync(conn, step.assistant_id, step.data, now, unread=True)
        handoffs.mark_turns_changed_sync(conn, lease.session_id, now)
        model_turns.record_repairs_sync(conn, lease, step.number, step.assistant_id, step.request.reply, now)
        append_event_sync(
            conn,
            kind=EventKind.EXECUTION_STEP,
            actor=self.owner_id,
            session_id=lease.session_id,
            target=lease.execution_id,
            now=now,
            data={"step": step.number, "assistant_id": step.assistant_id, **event},
        )

    def finish_tool_step_sync(
        self,
        conn: Conn,
        state: TurnState,
        step: Step,
        tail: list[str],
        planned: Sequence[tool_calls.PlannedCall],
        calls: Sequence[CallRecord] = (),
    ) -> bool:
        """Close a step whose reply asks for tools: its calls are inserted (the arguments durable before
        anything runs) and the row closes as `tool_calls` (it answers nothing: the next step does).

        At `REM_MAX_STEPS` the calls are not made: the step completes with a reply saying so.
        """
        if state.tool_steps + 1 >= self.max_steps:
            return self._stop_at_max_steps_sync(conn, state, step, tail, calls)
        lease, now = state.lease, self._close_sync(conn, state, step, tail)
        ids = tool_calls.insert_sync(conn, lease, step.number, step.assistant_id, planned, now)
        step.data.update(status="tool_calls", text="".join(step.parts), tool_calls=ids, time_completed=now)
        model_turns.record_reply_sync(
            conn, lease.session_id, step.data, step.request.reply, calls, self.owner_id, now
        )
        self._publish_sync(conn, lease, step, now, tool_calls=ids)
        state.open_calls = tool_calls.open_calls_sync(conn, lease.execution_id)
        state.calls_open = state.tool_round = True
        state.tool_steps += 1
        return True

    def _stop_at_max_steps_sync(
        self, conn: Conn, state: TurnState, step: Step, tail: list[str], calls: Sequence[CallRecord]
    ) -> bool:
        note = (
            f"[rem: this turn reached REM_MAX_STEPS ({self.max_steps} model steps) without a final answer; "
            "the tool calls asked for last were not made.]"
        )
        text = "".join(step.parts)
        step.parts.append(("\n\n" if text else "") + note)
        more = self.finish_step_sync(conn, state, step, [*tail, step.parts[-1]], calls)
        append_event_sync(
            conn,
            kind=EventKind.EXECUTION_MAX_STEPS,
            actor=self.owner_id,
            session_id=state.lease.session_id,
            target=state.lease.execution_id,
            now=clock.now_ms(),
            data={"step": step.number, "max_steps": self.max_steps, "assistant_id": step.assistant_id},
        )
        return more

    def fail_step_sync(
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
        guard_sync(conn, lease, now=now, unread=True, phase=ExecutionPhase.SAFE)
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
        note_reply(state, step)
        handoffs.mark_turns_changed_sync(conn, lease.session_id, now)
        model_turns.record_repairs_sync(conn, lease, step.number, step.assistant_id, step.request.reply, now)
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
        self.end_sync(conn, state, now)

    def interrupt_step_sync(
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
            self.fail_step_sync(conn, state, step, error, calls)
            return False
        guard_sync(conn, lease, now=now, unread=True)
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
        model_turns.record_repairs_sync(conn, lease, step.number, step.assistant_id, step.request.reply, now)
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

    def end_sync(self, conn: Conn, state: TurnState, now: int) -> None:
        """The clean end of an execution: delete its row, close its recovery, count the turn."""
        lease = state.lease
        end_sync(conn, lease, unread=True)
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
            data=completion(state, now),
        )
        # counted by the executor once the transaction is in: a fenced write sent unread may
        # still fail it (a lost lease) after this function returned
        state.turn_counted = state.turn_started


def note_reply(state: TurnState, step: Step) -> None:
    """A step closed with a reply (completed or error): the turn's answer so far, and to what."""
    if step.assistant_id not in state.replies:  # a transaction body may run again (a retried commit)
        state.replies.append(step.assistant_id)
    state.replied_inputs.extend(i for i in step.data.get("answers", ()) if i not in state.replied_inputs)


def completion(state: TurnState, now: int) -> dict[str, Any]:
    """The execution.completed event's data; a turn's latency when its inputs were seen admitted."""
    data: dict[str, Any] = {
        "epoch": state.lease.epoch,
        "steps": state.step,
        "recovered": state.recovered,
        "turn": state.turn_started,
        "message_id": state.replies[-1] if state.replies else None,
        "replies": state.replies,
        "inputs": state.replied_inputs,
    }
    if state.turn_started and state.admitted_at is not None:
        data["latency_ms"] = now - state.admitted_at
    return data
