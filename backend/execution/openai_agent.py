"""The built-in model agent: any OpenAI-compatible Chat Completions endpoint, streamed.

`REM_AGENT=openai` with `REM_MODEL` (and `REM_MODEL_BASE_URL` for anything
but OpenAI itself: vLLM, llama.cpp's server, Ollama, LiteLLM's proxy). Each
step sends the system prompt, the session's recent transcript
(`REM_MODEL_HISTORY` messages of completed turns), what the project's memory recalled for these prompts
(as a second system message, each item with its session and speaker, so
the model can say where it learned something), the prompts to answer,
and, when an earlier attempt at the step broke mid-reply (a dropped stream,
a killed executor), that partial reply followed by a note that it was
interrupted and never delivered, so the model answers again in full rather
than continuing a fragment nobody saw. Requests go through
`backend.models.client` (retries, the concurrency cap, usage, health).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

from backend.core.settings import settings
from backend.execution.agent import StepRequest
from backend.models.client import ChatReply, Message, ModelClient
from backend.models.health import CallKind

SYSTEM_PROMPT = (
    "You are the assistant of a long-running agent session. Answer the user's latest messages "
    "directly and completely, using the earlier conversation as context."
)
MEMORY_HEADER = (
    "Recalled from this project's long-term memory (earlier sessions; may be relevant or not, "
    "best match first):"
)
INTERRUPTED_NOTE = (
    "[rem: your reply above was cut off ({reason}) and never reached me. "
    "Answer my previous message again, in full.]"
)


class OpenAIAgent:
    """Streams each step's reply from the configured chat model.

    Its instructions are `system_prompt()`: a subclass that returns its own is the way to give
    the model other instructions (`REM_AGENT=module:factory`; docs/your-agent.md).
    """

    def __init__(self, client: ModelClient | None = None) -> None:
        self.client = client or ModelClient(kind=CallKind.CHAT)
        self.model = self.client.config.require_model("REM_AGENT=openai")
        self.name = f"openai:{self.model}"
        self.history_messages = settings.model_history
        self._snapshot = {
            "agent": "openai",
            "model": self.model,
            "endpoint": self.client.config.endpoint,
            # the prompt a subclass gives is part of the context: a change moves the baseline
            "system_prompt_sha256": hashlib.sha256(self.system_prompt().encode()).hexdigest(),
        }

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def snapshot(self) -> dict[str, Any]:
        return dict(self._snapshot)

    def messages(self, request: StepRequest) -> list[Message]:
        """The conversation one step sends: system, history, prompts, and an interrupted reply."""
        out: list[Message] = [{"role": "system", "content": self.system_prompt()}]
        if request.memory:
            out.append({"role": "system", "content": memory_message(request.memory)})
        out += [{"role": m["role"], "content": str(m["text"])} for m in request.history if m.get("text")]
        out += [{"role": "user", "content": prompt} for prompt in request.prompts]
        for round_ in request.tool_rounds:
            out += tool_messages(round_)
        if request.interrupted:
            reason = (request.interrupted_reason or "interrupted").replace("_", " ")
            out.append({"role": "assistant", "content": request.interrupted})
            out.append({"role": "user", "content": INTERRUPTED_NOTE.format(reason=reason)})
        return out

    async def aclose(self) -> None:
        """Close the endpoint connections (the executor calls it when it stops)."""
        await self.client.aclose()

    async def stream(self, request: StepRequest) -> AsyncIterator[str]:
        reply = ChatReply(model=self.model)
        request.reply = reply
        async for text in self.client.stream_chat(
            self.messages(request), reply=reply, session_id=request.session_id, tools=request.tools or None
        ):
            yield text
        request.tool_calls = reply.tool_calls.result()


def tool_messages(round_: dict[str, Any]) -> list[Message]:
    """One step's tool exchange as the model sent and is answered: its assistant message with the
    calls, then one `tool` message per call with the result it is shown."""
    calls = round_["calls"]
    assistant: Message = {
        "role": "assistant",
        "content": round_.get("text") or None,
        "tool_calls": [
            {
                "id": c["model_call_id"],
                "type": "function",
                "function": {"name": function_name(c["tool"]), "arguments": c["model_arguments"]},
            }
            for c in calls
        ],
    }
    return [assistant] + [
        {"role": "tool", "tool_call_id": c["model_call_id"], "content": c["for_model"]} for c in calls
    ]


def function_name(tool: str) -> str:
    """`NAME.TOOL` as the model spells it (`NAME__TOOL`); a name that was never a tool, as it was."""
    server, dot, name = tool.partition(".")
    return f"{server}__{name}" if dot else tool


def memory_message(memory: list[dict[str, Any]]) -> str:
    """The recalled items as one system message: one line each, with where it came from."""
    lines = [MEMORY_HEADER]
    for item in memory:
        who = f"{item['speaker']}, " if item.get("speaker") else ""
        lines.append(f"- [{item.get('kind', 'memory')}, {who}session {item['session_id']}] {item['text']}")
    return "\n".join(lines)
