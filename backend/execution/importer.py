"""`rem import`: existing conversations from JSON Lines, streamed, validated, idempotent on ids.

One message per line: `{"project", "session", "id", "role": "user"|"assistant",
"speaker" (optional), "text", "time"}`; `time` is ms since the epoch or an ISO
8601 string, `project` defaults to `default`.

Two streaming passes over the file, so memory stays bounded by the number
of sessions, not messages:

1. **validate** every line (JSON, fields, types, id rules, the session's
   project against state.db, an id that already names a different
   message). A bad line is reported with its line number, and its whole
   session is left out: nothing of a session with a bad line is imported.
2. **write** the good sessions' messages in batches, one `BEGIN IMMEDIATE`
   transaction each, a session's lines in one transaction unless it alone
   outgrows a batch. Messages already there (same id, same content) are
   skipped, so running the same import twice changes nothing, and a crash
   mid-import is finished by running it again. Each written session is
   queued for the summarizer (`mark_turns_changed`) in the same
   transaction, so imported sessions are summarized, digested and indexed
   like any other.

Imported messages carry `"imported": true` in their data: they were never
admitted inputs, and `rem check` knows not to look for their inputs.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from backend.core import clock
from backend.core.errors import BadInput
from backend.execution.sessions import (
    DEFAULT_PROJECT,
    ID_PATTERN,
    ID_RULE,
    MAX_TEXT_BYTES,
    ensure_session_sync,
    insert_message_sync,
    reserve_seqs_sync,
)
from backend.store.db import Conn, Database
from backend.store.events import EventKind, append_event_sync
from backend.store.handoffs import mark_turns_changed_sync

ROLES = ("user", "assistant")
MAX_LINE_BYTES = 1024 * 1024
BATCH = 2000
ERRORS_SHOWN = 50
Progress = Callable[[int, int], None]  # (bytes read, total bytes)


@dataclass
class Message:
    line: int
    project: str
    session: str
    id: str
    role: str
    speaker: str | None
    text: str
    time: int


@dataclass
class Report:
    lines: int = 0
    messages: int = 0
    written: int = 0
    already: int = 0
    sessions: set[str] = field(default_factory=set)
    bad_sessions: dict[str, int] = field(default_factory=dict)  # session -> first bad line
    errors: list[dict[str, Any]] = field(default_factory=list)
    error_count: int = 0

    def error(self, line: int, session: str | None, problem: str) -> None:
        self.error_count += 1
        if len(self.errors) < ERRORS_SHOWN:
            self.errors.append({"line": line, "session": session, "error": problem})
        if session is not None:
            self.bad_sessions.setdefault(session, line)

    def as_dict(self, path: Path) -> dict[str, Any]:
        return {
            "file": str(path),
            "ok": self.error_count == 0,
            "lines": self.lines,
            "messages_valid": self.messages,
            "written": self.written,
            "already_imported": self.already,
            "sessions": len(self.sessions),
            "sessions_skipped": sorted(self.bad_sessions),
            "errors": self.errors,
            "error_count": self.error_count,
        }


def parse_time(value: Any) -> int:
    """ms since the epoch from an integer (ms) or an ISO 8601 string (UTC when no zone is given)."""
    if isinstance(value, bool):
        raise ValueError("time must be ms since the epoch or an ISO 8601 string, not true/false")
    if isinstance(value, int):
        if not 0 <= value < 10**14:
            raise ValueError(f"time {value} is not ms since the epoch")
        return value
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"time {value!r} is not ISO 8601 (e.g. 2023-05-08T13:56:00Z)") from None
        if parsed.tzinfo is None:
            from datetime import UTC

            parsed = parsed.replace(tzinfo=UTC)
        return int(parsed.timestamp() * 1000)
    raise ValueError("time must be ms since the epoch (an integer) or an ISO 8601 string")


def _field_id(obj: dict[str, Any], name: str, required: bool = True) -> str | None:
    value = obj.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise ValueError(f"{name} {value!r} is not an id ({ID_RULE})")
    return value


def parse_line(number: int, raw: bytes) -> Message:
    """One validated message, or ValueError naming what is wrong with the line."""
    if len(raw) > MAX_LINE_BYTES:
        raise ValueError(f"the line is {len(raw)} bytes, over {MAX_LINE_BYTES}")
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"a line must be a JSON object, not {type(obj).__name__}")
    unknown = set(obj) - {"project", "session", "id", "role", "speaker", "text", "time"}
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}")
    session = _field_id(obj, "session")
    project = _field_id(obj, "project", required=False) or DEFAULT_PROJECT
    message_id = _field_id(obj, "id")
    role = obj.get("role")
    if role not in ROLES:
        raise ValueError(f"role {role!r} must be user or assistant")
    speaker = obj.get("speaker")
    if speaker is not None and (not isinstance(speaker, str) or not 0 < len(speaker) <= 100):
        raise ValueError("speaker must be a name of 1-100 characters")
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("text must be non-empty text")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise ValueError(f"text is over {MAX_TEXT_BYTES} bytes")
    assert session is not None and message_id is not None
    return Message(number, project, session, message_id, role, speaker, text, parse_time(obj.get("time")))


def read_lines(path: Path, progress: Progress | None) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each non-blank line, reporting bytes read."""
    total = path.stat().st_size
    done = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            done += len(raw)
            if progress is not None and number % 5000 == 0:
                progress(done, total)
            if raw.strip():
                yield number, raw
    if progress is not None:
        progress(total, total)


def _same_message(row: sqlite3.Row, msg: Message) -> bool:
    data = json.loads(row["data"])
    return bool(
        row["session_id"] == msg.session
        and row["type"] == msg.role
        and data.get("text") == msg.text
        and data.get("speaker") == msg.speaker
    )


def validate_file(conn: Conn, path: Path, report: Report, progress: Progress | None) -> None:
    """Pass 1: every line, against the file's rules and state.db (read only)."""
    projects: dict[str, str] = {}
    seen_ids: set[str] = set()
    for number, raw in read_lines(path, progress):
        report.lines += 1
        session = _session_hint(raw)
        try:
            msg = parse_line(number, raw)
        except ValueError as exc:
            report.error(number, session, str(exc))
            continue
        if msg.id in seen_ids:
            report.error(number, msg.session, f"id {msg.id!r} appears twice in the file")
            continue
        seen_ids.add(msg.id)
        known = projects.get(msg.session)
        if known is None:
            row = conn.execute("SELECT project FROM session WHERE id = ?", (msg.session,)).fetchone()
            known = projects[msg.session] = row[0] if row else msg.project
        if known != msg.project:
            report.error(
                number, msg.session, f"session {msg.session!r} is in project {known!r}, not {msg.project!r}"
            )
            continue
        row = conn.execute(
            "SELECT session_id, type, data FROM session_message WHERE id = ?", (msg.id,)
        ).fetchone()
        if row is not None and not _same_message(row, msg):
            report.error(number, msg.session, f"id {msg.id!r} already names a different message")
            continue
        report.messages += 1
        report.sessions.add(msg.session)


def _session_hint(raw: bytes) -> str | None:
    """The session a bad line names, if it names one at all (so its session can be left out)."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    session = obj.get("session") if isinstance(obj, dict) else None
    return session if isinstance(session, str) else None


def write_batch(conn: Conn, batch: list[Message], report: Report, now: int) -> None:
    """Pass 2, one transaction: the batch's new messages, each session queued for the summarizer."""
    by_session: dict[str, list[Message]] = {}
    for msg in batch:
        by_session.setdefault(msg.session, []).append(msg)
    for session, messages in by_session.items():
        ids = [m.id for m in messages]
        marks = ",".join("?" * len(ids))
        present = {r[0] for r in conn.execute(f"SELECT id FROM session_message WHERE id IN ({marks})", ids)}
        fresh = [m for m in messages if m.id not in present]
        report.already += len(messages) - len(fresh)
        if not fresh:
            continue
        ensure_session_sync(conn, session, now, messages[0].project)
        first = reserve_seqs_sync(conn, session, len(fresh), now, messages=len(fresh))
        for offset, msg in enumerate(fresh):
            data: dict[str, Any] = {"text": msg.text, "imported": True}
            if msg.speaker is not None:
                data["speaker"] = msg.speaker
            if msg.role == "assistant":
                data["status"] = "completed"
            insert_message_sync(conn, msg.id, session, msg.role, first + offset, data, msg.time)
        mark_turns_changed_sync(conn, session, now)
        report.written += len(fresh)


async def import_file(
    db: Database, path: Path, *, actor: str = "import", progress: Progress | None = None
) -> dict[str, Any]:
    """Import a JSON Lines file (both passes); the report names every bad line (up to 50) and session."""
    if not path.is_file():
        raise BadInput(f"{path} is not a file: pass a JSON Lines file to import")
    report = Report()

    def validate(conn: Conn) -> None:
        conn.execute("BEGIN")
        try:
            validate_file(conn, path, report, progress)
        finally:
            conn.execute("ROLLBACK")

    await db.run_in_thread(validate)
    batch: list[Message] = []
    for number, raw in read_lines(path, None):
        msg = _good(number, raw, report)
        if msg is None:
            continue
        # a session's lines stay in one transaction unless the session alone outgrows a batch
        if len(batch) >= BATCH and batch[-1].session != msg.session:
            await _flush(db, batch, report)
            batch = []
        batch.append(msg)
        if len(batch) >= 4 * BATCH:
            await _flush(db, batch, report)
            batch = []
    await _flush(db, batch, report, final=True, path=path, actor=actor)
    return report.as_dict(path)


def _good(number: int, raw: bytes, report: Report) -> Message | None:
    try:
        msg = parse_line(number, raw)
    except ValueError:
        return None
    return None if msg.session in report.bad_sessions else msg


async def _flush(
    db: Database,
    batch: list[Message],
    report: Report,
    *,
    final: bool = False,
    path: Path | None = None,
    actor: str = "import",
) -> None:
    if not batch and not final:
        return
    now = clock.now_ms()

    def write(conn: Conn) -> None:
        write_batch(conn, batch, report, now)
        if final:
            append_event_sync(
                conn,
                kind=EventKind.MEMORY_IMPORTED,
                actor=actor,
                target=str(path),
                now=now,
                data={
                    "written": report.written,
                    "already": report.already,
                    "sessions": len(report.sessions),
                    "errors": report.error_count,
                },
            )

    await db.write_in_thread(write)
