"""The Dream input revision: a fence over the raw turns Dream consumes.

`dreamInputRevision = "sha256:" + hex(SHA-256(canonical JSON of the turns))`.
Canonical JSON: keys sorted by code point, no spaces, UTF-8 (not \\u escapes),
explicit nulls. Turns in canonical order: `time_created`, then `id` by code
point. It covers each turn's identity and content, never a count, so equal
input gives an equal revision on any machine and a replaced turn changes it.

Reading is bounded per turn (`REM_TURN_READ_MAX_CHARS`): a message whose
stored JSON is longer than the bound is never loaded whole. The revision
still covers its whole text, hashed in pieces of the bound's size (the
canonical JSON of a string is the concatenation of its pieces' escapes), and
the records handed to Dream and the summarizer carry only its first
`REM_TURN_READ_MAX_CHARS` characters.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiosqlite

from backend.core.settings import settings

# The raw turns: promoted user prompts and completed assistant replies. A row longer
# than :cap characters comes without its data (`raw_revision` reads it in pieces).
RAW_TURN_SQL = """
SELECT id, type, time_created, CASE WHEN length(data) <= :cap THEN data END AS data
FROM session_message
WHERE session_id = :sid AND type IN ('user', 'assistant')
ORDER BY time_created, id
"""
LONG_TURN_SQL = """
SELECT json_extract(data, '$.status') AS status, length(json_extract(data, '$.text')) AS chars
FROM session_message WHERE id = :id
"""
TEXT_PIECE_SQL = (  # the bounds cast: PostgreSQL has no substr(text, bigint, bigint)
    "SELECT substr(json_extract(data, '$.text'), CAST(:start AS integer), CAST(:n AS integer)) "
    "FROM session_message WHERE id = :id"
)


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


@dataclass(frozen=True)
class _LongText:
    """A turn whose text is longer than the read bound: hashed in pieces, kept as its head."""

    message_id: str
    chars: int
    head: str


async def load_raw_turns(conn: aiosqlite.Connection, session_id: str) -> list[dict[str, Any]]:
    """The session's raw turns, canonical records in canonical order (long texts cut to their head)."""
    return (await raw_revision(conn, session_id))[1]


def _short_turn_record(row: Any) -> dict[str, Any] | None:
    """The record of a turn read whole (its text within the cap)."""
    data = json.loads(row["data"])
    # data is json_valid but not necessarily an object; a non-object carries no text
    return turn_record(row["id"], row["type"], row["time_created"], data if isinstance(data, Mapping) else {})


async def raw_revision(conn: aiosqlite.Connection, session_id: str) -> tuple[str, list[dict[str, Any]]]:
    """The current revision of a session's raw turns, with the turns it covers.

    A turn's text beyond `REM_TURN_READ_MAX_CHARS` is hashed in pieces and cut from
    the returned record, so no turn is ever held whole, whatever was stored.
    """
    cap = settings.turn_read_max_chars
    rows = await conn.execute_fetchall(RAW_TURN_SQL, {"sid": session_id, "cap": cap})
    records: list[dict[str, Any]] = []
    long: dict[str, _LongText] = {}
    for row in rows:
        record = (
            await _long_turn_record(conn, row, cap, long) if row["data"] is None else _short_turn_record(row)
        )
        if record is not None:
            records.append(record)
    records = canonical_turns(records)
    if not long:
        return compute_revision(records), records
    return await _pieced_revision(conn, records, long, cap), records


async def _long_turn_record(
    conn: aiosqlite.Connection, row: Any, cap: int, long: dict[str, _LongText]
) -> dict[str, Any] | None:
    """The record of a message too long to read whole: its status, and its text's first `cap` characters."""
    found = list(await conn.execute_fetchall(LONG_TURN_SQL, {"id": row["id"]}))
    status, chars = (found[0]["status"], found[0]["chars"]) if found else (None, None)
    record = turn_record(row["id"], row["type"], row["time_created"], {"status": status})
    if record is None or chars is None:
        return record  # not a raw turn, or no text: the record is whole already
    head = await _text_piece(conn, row["id"], 1, min(int(chars), cap))
    if int(chars) > cap:
        long[row["id"]] = _LongText(row["id"], int(chars), head)
    record["text"] = head
    return record


async def _text_piece(conn: aiosqlite.Connection, message_id: str, start: int, n: int) -> str:
    found = list(await conn.execute_fetchall(TEXT_PIECE_SQL, {"id": message_id, "start": start, "n": n}))
    return str(found[0][0] or "") if found else ""


async def _pieced_revision(
    conn: aiosqlite.Connection, records: list[dict[str, Any]], long: Mapping[str, _LongText], cap: int
) -> str:
    """`compute_revision` of the whole turns, reading each long text in pieces of `cap` characters."""
    digest = hashlib.sha256(b"[")
    for index, record in enumerate(records):
        if index:
            digest.update(b",")
        text = long.get(record["id"])
        if text is None:
            digest.update(canonical_json(record))
            continue
        # {"id":..,"role":..,"text":"<pieces>","time":..}: the keys in canonical_json's sorted order
        before, after = canonical_json({**record, "text": ""}).split(b',"text":"",', 1)
        digest.update(before + b',"text":"')
        for start in range(1, text.chars + 1, cap):
            piece = text.head if start == 1 else await _text_piece(conn, text.message_id, start, cap)
            digest.update(canonical_json(piece)[1:-1])
        digest.update(b'",' + after)
    digest.update(b"]")
    return "sha256:" + digest.hexdigest()
