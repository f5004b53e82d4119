"""Who owns which metadata key on a Chroma summary row.

The summary row `summary_<session_id>` is shared: synthesis writes the
document and its base metadata (and a durable receipt of exactly those);
Dream later overlays its lifecycle keys with `update`. Each writer touches
only its own keys, and recovery never deletes the other's (Chroma merges
metadata on upsert and update, so untouched keys survive).
"""

from __future__ import annotations


def summary_row_id(session_id: str) -> str:
    return f"summary_{session_id}"


def session_id_of(summary_id: str) -> str | None:
    return summary_id[len("summary_") :] if summary_id.startswith("summary_") else None


# Written by synthesis and carried in its receipt (validated at issuance).
SYNTHESIS_OWNED_KEYS: tuple[str, ...] = (
    "sessionId",
    "memoryCount",
    "timestamp",
    "title",
    "category",
    "keywords",
    "dreamInputRevision",
    "summarizer",
    # the session's project: recall finds summaries by it (`where={"project": ...}`)
    "project",
)

# Written by Dream after synthesis; never in a receipt, never deleted by recovery.
DREAM_OWNED_KEYS: tuple[str, ...] = (
    "graphDigested",
    "digestState",
    "digestAttempts",
    "deferReason",
    "dreamCompletedRevision",
    "dreamStateRevision",
)
