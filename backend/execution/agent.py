"""The agent the executor runs: a pluggable interface and rem's offline default.

An agent turns a step's prompts into a reply streamed as text parts. The
default, `OfflineResponder`, needs no model and no network: it reads the
prompts (sentences, questions, key terms) and writes a reply about them,
deterministically, in several parts with a pause between parts
(`REM_AGENT_DELAY_MS`, default 250 ms between parts, about a second a reply) so a
drill can SIGKILL an executor mid-stream. `REM_AGENT_DELAY_MS=0` is instant
(benchmarks). `REM_AGENT=module:factory` swaps in another agent.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from backend.core.plugins import load_plugin
from backend.core.settings import settings
from backend.models.tool_deltas import ModelToolCall

if TYPE_CHECKING:  # importing the SDK costs seconds: the offline default never does
    from backend.models.client import ChatReply

STOPWORDS = frozenset(
    "a an and are as at be but by can could did do does for from had has have how i if in into is "
    "it its just me my no not of on or our please so than that the their them then there these this "
    "those to up us was we were what when where which who why will with would you your".split()
)


@dataclass
class StepRequest:
    """What one step of a turn asks the agent to answer."""

    session_id: str
    prompts: list[str]
    step: int = 1
    # set when this step re-runs a step an interrupted execution left incomplete
    resumed_from: str | None = None
    # earlier transcript messages ({"role", "text"}), oldest first, for agents that ask
    # for them (an `history_messages` attribute > 0)
    history: list[dict[str, Any]] = field(default_factory=list)
    # items recalled from the project's memory for these prompts (recorded with the step)
    memory: list[dict[str, Any]] = field(default_factory=list)
    # the reply an earlier attempt at this step streamed before it broke (a dropped
    # stream, a killed executor): the agent re-asks with it, marked interrupted
    interrupted: str | None = None
    interrupted_reason: str | None = None
    # set by a model-backed agent: the model, usage, finish reason, attempts of its reply
    reply: ChatReply | None = None
    # the tools offered (Chat Completions function tools, named NAME__TOOL); none: no tools
    tools: list[dict[str, Any]] = field(default_factory=list)
    # this turn's tool exchanges so far (`backend.execution.tool_calls.rounds_sync`): per step,
    # the assistant's text and each call (`model_call_id`, `tool`, `arguments`, `result`, ...)
    tool_rounds: list[dict[str, Any]] = field(default_factory=list)
    # set by the agent: the tool calls its reply asks for (after the text stream ends)
    tool_calls: list[ModelToolCall] = field(default_factory=list)


class Agent(Protocol):
    """The pluggable agent: a name, its system context, and a streamed reply.

    Optional: `history_messages` (int), how many earlier transcript messages
    the executor reads into `StepRequest.history` (0 or absent: none, and no
    query). A model-backed agent sets `request.reply` to report usage, and
    raises `backend.models.errors.ModelError` (or `StreamInterrupted` once
    text has arrived) so the executor can tell the failures apart.
    """

    name: str

    def system_prompt(self) -> str:
        """The baseline context the session's context epoch records."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """What the agent's context is made of (JSON); a change moves the baseline."""
        ...

    def stream(self, request: StepRequest) -> AsyncIterator[str]:
        """Yield the reply in parts; the executor projects each part as it arrives."""
        ...


def agent_delay_ms() -> int:
    """The pause between streamed parts: `REM_AGENT_DELAY_MS` (0 = instant)."""
    return settings.agent_delay_ms


def sentences(text: str) -> list[str]:
    parts = re.split(r"(?<=[.!?])\s+|\n+", text.strip())
    return [p.strip() for p in parts if p.strip()]


def key_terms(text: str, limit: int = 4) -> list[str]:
    """The most frequent non-trivial words, first occurrence breaking ties."""
    words = [w.lower() for w in re.findall(r"[A-Za-z][A-Za-z0-9_'-]+", text)]
    counts = Counter(w for w in words if w not in STOPWORDS and len(w) > 2)
    order = {w: i for i, w in reversed(list(enumerate(words)))}
    return sorted(counts, key=lambda w: (-counts[w], order[w]))[:limit]


def _clip(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


class OfflineResponder:
    """A deterministic offline agent that answers from what the prompt says."""

    name = "offline-responder"
    version = "1"

    def __init__(self, delay_ms: int | None = None) -> None:
        self.delay_ms = agent_delay_ms() if delay_ms is None else delay_ms
        self._snapshot: dict[str, Any] | None = None

    def system_prompt(self) -> str:
        return (
            "You are rem's offline responder: restate what was asked, name its key terms, "
            "and answer plainly. No model, no network."
        )

    def snapshot(self) -> dict[str, Any]:
        if self._snapshot is None:  # constant for an instance; read at every turn start
            self._snapshot = {
                "agent": self.name,
                "version": self.version,
                "system_prompt_sha256": hashlib.sha256(self.system_prompt().encode()).hexdigest(),
            }
        return dict(self._snapshot)

    def compose(self, request: StepRequest) -> list[str]:
        """The reply's parts, derived from the prompts (pure, so tests can predict it)."""
        text = "\n".join(request.prompts)
        said = sentences(text)
        questions = [s for s in said if s.endswith("?")]
        terms = key_terms(text)
        parts = []
        if request.resumed_from:
            parts.append(f"(Resuming after execution {request.resumed_from} was interrupted.) ")
        if len(request.prompts) > 1:
            parts.append(f"Taking your {len(request.prompts)} messages together. ")
        words = len(text.split())
        parts.append(
            f"You wrote {words} word{'s' if words != 1 else ''} in {len(said)} sentence"
            f"{'s' if len(said) != 1 else ''}. "
        )
        if questions:
            parts.append(f'You asked: "{_clip(questions[0])}". ')
        else:
            parts.append(f'You said: "{_clip(said[0] if said else text)}". ')
        parts.append(f"Key terms: {', '.join(terms)}. " if terms else "There are no key terms to pick out. ")
        parts.append(self._focus(text, terms))
        if request.memory:
            parts.append(self._recalled(request.memory))
        parts.append(self._closing(request, questions, terms))
        return parts

    def compose_with_tools(self, request: StepRequest) -> list[str]:
        """`compose`, or with tools offered: a tool call where the prompt asks for one (set on
        `request.tool_calls`), and once its results are in, a reply that reports them."""
        if request.tool_rounds:
            return [self._reported(request.tool_rounds[-1])]
        call = offline_tool_call(request) if request.tools else None
        if call is None:
            return self.compose(request)
        request.tool_calls = [call]
        return [f"Calling {call.name.replace('__', '.', 1)} for you. "]

    @staticmethod
    def _reported(last: dict[str, Any]) -> str:
        lines = []
        for call in last["calls"]:
            outcome = "failed" if call.get("is_error") else "returned"
            lines.append(f'{call["tool"]} {outcome}: "{_clip(str(call.get("result") or ""), 160)}"')
        return "Done. " + "; ".join(lines) + "."

    @staticmethod
    def _recalled(memory: list[dict[str, Any]]) -> str:
        """What the agent was given from memory, so a demo shows memory at work."""
        top = memory[0]
        who = f"{top['speaker']} in " if top.get("speaker") else ""
        more = (
            f" (and {len(memory) - 1} more item{'s' if len(memory) > 2 else ''})" if len(memory) > 1 else ""
        )
        return f'From memory ({who}session {top["session_id"]}): "{_clip(top["text"])}"{more}. '

    @staticmethod
    def _focus(text: str, terms: list[str]) -> str:
        if not terms:
            return "Nothing in it stands out as the subject. "
        mentions = len(re.findall(rf"\b{re.escape(terms[0])}\b", text, flags=re.IGNORECASE))
        times = f", mentioned {mentions} times" if mentions > 1 else ""
        return f"The main subject looks like {terms[0]}{times}. "

    @staticmethod
    def _closing(request: StepRequest, questions: list[str], terms: list[str]) -> str:
        focus = terms[0] if terms else "that"
        if questions:
            return f"Short answer on {focus}: it depends on what you need next; ask for detail on any term."
        return f"Noted on {focus} (step {request.step})."

    async def stream(self, request: StepRequest) -> AsyncIterator[str]:
        parts = self.compose_with_tools(request)
        for index, part in enumerate(parts):
            if index and self.delay_ms:
                await asyncio.sleep(self.delay_ms / 1000)
            yield part


FIND_WORDS = re.compile(r"\b(find|search|look up|recall)\b", re.IGNORECASE)
NOTE_WORDS = re.compile(r"\b(note|notes|remember|jot)\b", re.IGNORECASE)
SEND_WORDS = re.compile(r"\b(send|pay|email|mail|wire)\b", re.IGNORECASE)
RECIPIENT = re.compile(r"\bto\s+([A-Za-z][\w.@-]{0,63})", re.IGNORECASE)


def offline_tool_call(request: StepRequest) -> ModelToolCall | None:
    """The offline agent's one deterministic tool call: a prompt that asks to send or pay calls an
    offered `outbox_send` (an effect, on whichever server offers it), one that asks to find
    something calls `notes_search`, one that asks to note something calls `notes_add`."""
    text = " ".join(request.prompts).strip()
    for words, suffix in (
        (SEND_WORDS, "__outbox_send"),
        (FIND_WORDS, "__notes_search"),
        (NOTE_WORDS, "__notes_add"),
    ):
        name = next((t for t in sorted(_offered(request)) if t.endswith(suffix)), None)
        if name is not None and words.search(text):
            return ModelToolCall(
                index=0, id="call_0", name=name, arguments=json.dumps(_arguments(suffix, text))
            )
    return None


def _offered(request: StepRequest) -> list[str]:
    return [tool["function"]["name"] for tool in request.tools]


def _arguments(suffix: str, text: str) -> dict[str, Any]:
    if suffix == "__outbox_send":
        found = RECIPIENT.search(text)
        return {"to": found.group(1) if found else "someone", "body": _clip(text, 500)}
    if suffix == "__notes_search":
        terms = [t for t in key_terms(text, limit=3) if t not in ("find", "search", "notes", "note")]
        return {"query": terms[0] if terms else ""}
    return {"text": _clip(text, 500)}


def load_agent() -> Agent:
    """The configured agent (`REM_AGENT`: a `rem.agents` name or module:factory)."""
    agent: Agent = load_plugin("rem.agents", settings.agent, "REM_AGENT", Agent)
    return agent
