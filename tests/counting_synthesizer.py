"""A synthesizer that records every model call, for proving recovery never calls the model.

Selected in a real daemon with `REM_SYNTHESIZER=tests.counting_synthesizer:factory`;
each call appends the session id to `REM_SYNTH_COUNT_FILE` (fsynced) before it
returns, so a SIGKILL right after the call still leaves the call counted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from backend.summaries.synthesizer import ExtractiveSynthesizer, Synthesis, Turn


class CountingSynthesizer(ExtractiveSynthesizer):
    name = "rem-extractive-v1+counting"

    def __init__(self, calls: list[str] | None = None) -> None:
        super().__init__()
        self.calls = calls if calls is not None else []

    async def synthesize(self, session_id: str, turns: Sequence[Turn]) -> Synthesis:
        self.calls.append(session_id)
        path = os.environ.get("REM_SYNTH_COUNT_FILE")
        if path:
            with open(path, "a", encoding="utf-8") as out:
                out.write(session_id + "\n")
                out.flush()
                os.fsync(out.fileno())
        return await super().synthesize(session_id, turns)


def factory() -> CountingSynthesizer:
    return CountingSynthesizer()


def calls_in(path: str) -> dict[str, int]:
    """How often each session was synthesized, from a count file."""
    counts: dict[str, int] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as src:
            for line in src.read().split():
                counts[line] = counts.get(line, 0) + 1
    return counts
