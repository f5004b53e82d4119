"""The built-in model synthesizer: a session summary asked of any OpenAI-compatible chat model.

`REM_SYNTHESIZER=openai` with `REM_MODEL`. The model is asked for one JSON
object (title, category, keywords, summary), with the endpoint's JSON mode
where it has one. A reply that is not that object (prose, a truncated
object, wrong types) raises a `bad_output` `ModelError`: the summarizer
counts the attempt and retries with backoff, parking the job after its
attempts, and nothing is staged, so there is never a half-written receipt.
A reply longer than `REM_SUMMARY_REPLY_MAX_CHARS` is not read at all: the
same `bad_output` failure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from backend.core.settings import settings
from backend.models.client import ChatReply, Message, ModelClient
from backend.models.errors import ModelError, ModelErrorClass
from backend.models.health import CallKind
from backend.summaries.synthesizer import CATEGORIES, Synthesis, Turn

CATEGORY_NAMES = (*CATEGORIES, "question", "general")
SYSTEM_PROMPT = (
    "You summarize a conversation for a long-term memory store. Reply with one JSON object and "
    'nothing else: {"title": "at most 80 characters", "category": one of '
    + ", ".join(f'"{c}"' for c in CATEGORY_NAMES)
    + ', "keywords": ["at most 8 lowercase keywords"], "summary": "at most 5 sentences"}.'
)
# the newest turns are kept when a session is longer than this
MAX_TRANSCRIPT_CHARS = 24_000
FENCED = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def _transcript(turns: Sequence[Turn]) -> str:
    lines: list[str] = []
    size = 0
    for turn in reversed(turns):  # the newest first, until the budget is spent
        words = str(turn.get("text") or "")[-MAX_TRANSCRIPT_CHARS:].split()
        lines.append(f"{turn.get('role', 'user')}: {' '.join(words)}")
        size += len(lines[-1]) + 1
        if size > MAX_TRANSCRIPT_CHARS:
            break
    text = "\n".join(reversed(lines))
    return text if len(text) <= MAX_TRANSCRIPT_CHARS else text[-MAX_TRANSCRIPT_CHARS:]


def _json_object(body: str) -> dict[str, Any]:
    """The JSON object a reply holds (bare, or in one fenced block), or a `bad_output` ModelError."""
    fenced = FENCED.match(body)  # a fenced block is the one lenience: models add them unasked
    try:
        value: Any = json.loads(fenced.group(1) if fenced else body)
    except ValueError:
        raise ModelError(ModelErrorClass.BAD_OUTPUT, f"the summary is not JSON: {body[:120]!r}") from None
    if not isinstance(value, dict):
        raise ModelError(ModelErrorClass.BAD_OUTPUT, f"the summary is JSON but not an object: {body[:120]!r}")
    return value


def parse_synthesis(text: str, turns: int) -> Synthesis:
    """The `Synthesis` in a model's reply, or a `bad_output` ModelError saying what is wrong."""
    value = _json_object(text.strip())
    title, summary, category, keywords = (value.get(k) for k in ("title", "summary", "category", "keywords"))
    if not isinstance(title, str) or not title.strip() or not isinstance(summary, str) or not summary.strip():
        raise ModelError(
            ModelErrorClass.BAD_OUTPUT, "the summary object lacks a non-empty string title and summary"
        )
    if not isinstance(keywords, list) or not all(isinstance(k, str) for k in keywords):
        raise ModelError(
            ModelErrorClass.BAD_OUTPUT, "the summary object's keywords are not a list of strings"
        )
    title = " ".join(title.split())[:80]
    return Synthesis(
        document=f"{title} ({turns} turns)\n{summary.strip()}",
        title=title,
        category=category if category in CATEGORY_NAMES else "general",
        keywords=[k.strip().lower() for k in keywords if k.strip()][:8],
    )


class OpenAISynthesizer:
    """Summaries from the configured chat model, as JSON."""

    def __init__(self, client: ModelClient | None = None) -> None:
        self.client = client or ModelClient(kind=CallKind.SYNTHESIS)
        self.model = self.client.config.require_model("REM_SYNTHESIZER=openai")
        self.name = f"openai:{self.model}"

    def messages(self, turns: Sequence[Turn]) -> list[Message]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": _transcript(turns)},
        ]

    async def synthesize(self, session_id: str, turns: Sequence[Turn]) -> Synthesis:
        reply = ChatReply(model=self.model)
        text = await self.client.complete(
            self.messages(turns),
            reply=reply,
            session_id=session_id,
            extra={"response_format": {"type": "json_object"}},
            max_chars=settings.summary_reply_max_chars,
        )
        return parse_synthesis(text, len(turns))

    async def aclose(self) -> None:
        await self.client.aclose()
