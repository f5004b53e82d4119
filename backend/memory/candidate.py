"""One turn a retriever found, as recall's ranking carries it from the retrievers to the items."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Candidate:
    """One turn found by at least one retriever."""

    row_id: int
    message_id: str
    session_id: str
    speaker: str = ""
    ranks: dict[str, int] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    time: int | None = None  # when the turn was said (ms), where its retriever read it
