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


# The keys synthesis owns, declared once: key -> required in every receipt. A receipt
# carries each required key, may carry the optional ones, and attests the absence of
# every owned key it does not carry (a row that has it is a mismatch, and replay
# removes it). Issuance, decoding, verification and replay all read this table.
SYNTHESIS_KEYS: dict[str, bool] = {
    "sessionId": True,
    "memoryCount": True,
    "timestamp": True,
    "title": True,
    "category": True,
    # Chroma refuses an empty list, so a summary without keywords leaves the key out
    "keywords": False,
    "dreamInputRevision": True,
    "summarizer": True,
    # the session's project: recall finds summaries by it (`where={"project": ...}`)
    "project": True,
}
SYNTHESIS_OWNED_KEYS: tuple[str, ...] = tuple(SYNTHESIS_KEYS)
SYNTHESIS_REQUIRED_KEYS: tuple[str, ...] = tuple(key for key, required in SYNTHESIS_KEYS.items() if required)

# Written by Dream after synthesis; never in a receipt, never deleted by recovery.
DREAM_OWNED_KEYS: tuple[str, ...] = (
    "graphDigested",
    "digestState",
    "digestAttempts",
    "deferReason",
    "dreamCompletedRevision",
    "dreamStateRevision",
)
