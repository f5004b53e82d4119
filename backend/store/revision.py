"""The Dream input revision: a fence over the raw turns Dream consumes.

`dreamInputRevision = "sha256:" + hex(SHA-256(canonical JSON of the turns))`.
Canonical JSON: keys sorted by code point, no spaces, UTF-8 (not \\u escapes),
explicit nulls. Turns in canonical order: `time_created`, then `id` by code
point. It covers each turn's identity and content, never a count, so equal
input gives an equal revision on any machine and a replaced turn changes it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import aiosqlite

# The raw turns: promoted user prompts and completed assistant replies.
RAW_TURN_SQL = """
SELECT id, type, time_created, data FROM session_message
WHERE session_id = ? AND type IN ('user', 'assistant')
ORDER BY time_created, id
"""


def turn_record(
    message_id: str, message_type: str, time_created: int, data: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The canonical record of one raw turn, or None when it is not a raw turn yet."""
    if message_type == "assistant" and data.get("status") != "completed":
        return None
    if message_type not in ("user", "assistant"):
        return None
    return {
        "id": message_id,
        "role": message_type,
        "text": data.get("text"),
        "time": int(time_created),
    }


def canonical_turns(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records in canonical order (time, then id by code point)."""
    return sorted(records, key=lambda r: (r["time"], r["id"]))


def canonical_json(value: Any) -> bytes:
    """Compact, key-sorted, UTF-8 JSON with explicit nulls."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    # A lone surrogate (json.loads turns "\\ud800" into one) has no UTF-8 form; strict
    # encoding would make the session undigestible forever. surrogatepass keeps it
    # deterministic and leaves every valid string's bytes exactly UTF-8.
    return text.encode("utf-8", "surrogatepass")


def compute_revision(records: Iterable[dict[str, Any]]) -> str:
    """`sha256:<hex>` of the canonical JSON of the turns, in canonical order."""
    return "sha256:" + hashlib.sha256(canonical_json(canonical_turns(records))).hexdigest()


async def load_raw_turns(conn: aiosqlite.Connection, session_id: str) -> list[dict[str, Any]]:
    """The session's raw turns, canonical records in canonical order."""
    rows = await conn.execute_fetchall(RAW_TURN_SQL, (session_id,))
    records = []
    for row in rows:
        data = json.loads(row["data"])
        # data is json_valid but not necessarily an object; a non-object carries no text
        record = turn_record(
            row["id"], row["type"], row["time_created"], data if isinstance(data, Mapping) else {}
        )
        if record is not None:
            records.append(record)
    return canonical_turns(records)


async def raw_revision(conn: aiosqlite.Connection, session_id: str) -> tuple[str, list[dict[str, Any]]]:
    """The current revision of a session's raw turns, with the turns it covers."""
    turns = await load_raw_turns(conn, session_id)
    return compute_revision(turns), turns
