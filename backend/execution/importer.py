"""`rem import`: existing conversations from JSON Lines, streamed, validated, idempotent on ids.

One message per line: `{"project", "session", "id", "role": "user"|"assistant",
"speaker" (optional), "text", "time"}`; `time` is Unix time in ms or an ISO
8601 string, `project` defaults to `default`.

All or nothing per session, in two streaming passes over the file:

1. **validate** every line (JSON, fields, types, valid Unicode, id rules,
   the session's project against the store, an id that already names a
   different message). A bad line is reported with its line number, and
   its whole session is left out. A line longer than
   `REM_IMPORT_LINE_MAX_BYTES` is never held whole: it is refused, and the
   session it names (found by scanning it piece by piece) is left out too.
   Only the byte offset of each good line is kept, so memory grows by a few
   bytes a message, never with their text.
2. **write** the good sessions, each whole in one transaction: several
   small sessions share one, a session of more than `BATCH` messages has
   its own (its lines read back from their offsets a chunk at a time).
   Messages already there (same id, same content) are skipped, so running
   the same import twice changes nothing. Each written session is queued for
   the summarizer (`mark_turns_changed`) in its transaction, so imported
   sessions are summarized, digested and indexed like any other.

A failure (the store, the file) or a stop request (`stop`, which `rem
import` sets on SIGINT) ends the import between two transactions: only
whole sessions are in, and the report says which were written and which
were not; running the same import again finishes it.

Imported messages carry `"imported": true` in their data: they were never
admitted inputs, and `rem check` knows not to look for their inputs.
"""

from __future__ import annotations

import json
import re
import sqlite3
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import IO, Any

from backend.core import clock
from backend.core.errors import BadInput, RemError
from backend.core.settings import Settings, settings
from backend.core.storable import without_nul
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
BATCH = 2000
ERRORS_SHOWN = 50
SESSIONS_SHOWN = 50
SCAN_BYTES = 1 << 16
Progress = Callable[[int, int], None]  # (bytes read, total bytes)
Stop = Callable[[], bool]  # True once the import should stop (between two transactions)
# the session an over-long line names: a top-level key (a quote inside a JSON string is escaped)
SESSION_KEY = re.compile(rb'(?<!\\)"session"\s*:\s*"([A-Za-z0-9][A-Za-z0-9._-]{0,99})"')


class Stopped(Exception):
    """The import was asked to stop (`stop()` became true)."""


class ImportFailed(RemError):
    """A failure that ended an import early; `report` says which sessions were written and which not."""

    def __init__(self, cause: RemError, report: dict[str, Any]) -> None:
        super().__init__(
            f"{cause}; {report['sessions_written']} session(s) were written whole, "
            f"{report['sessions_not_written']} not: run the same import again to finish"
        )
        self.exit_code = cause.exit_code
        self.report = report


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
class Plan:
    """Where a good session's lines are: their byte offsets and line numbers, in file order."""

    offsets: array[int] = field(default_factory=lambda: array("q"))
    lines: array[int] = field(default_factory=lambda: array("q"))


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
    sessions_written: int = 0  # sessions whose transaction committed (whole)
    not_written: list[str] = field(default_factory=list)  # good sessions left unwritten by a stop
    interrupted: bool = False
    failure: RemError | None = None
    writing: bool = False  # pass 2 started (an interruption before it wrote nothing)

    def error(self, line: int, session: str | None, problem: str) -> None:
        self.error_count += 1
        if len(self.errors) < ERRORS_SHOWN:
            self.errors.append({"line": line, "session": session, "error": problem})
        if session is not None:
            self.bad_sessions.setdefault(session, line)

    def as_dict(self, path: Path) -> dict[str, Any]:
        return {
            "file": str(path),
            "ok": self.error_count == 0 and not self.stopped,
            "lines": self.lines,
            "messages_valid": self.messages,
            "written": self.written,
            "already_imported": self.already,
            "sessions": len(self.sessions),
            "sessions_skipped": sorted(self.bad_sessions),
            "errors": self.errors,
            "error_count": self.error_count,
            "sessions_written": self.sessions_written,
            "sessions_not_written": len(self.not_written),
            "not_written": self.not_written[:SESSIONS_SHOWN],
            "interrupted": self.interrupted,
            "stopped_while": None if not self.stopped else "writing" if self.writing else "validating",
            "failure": None if self.failure is None else str(self.failure),
        }

    @property
    def stopped(self) -> bool:
        return self.interrupted or self.failure is not None


def parse_time(value: Any) -> int:
    """Unix time in ms from an integer (ms) or an ISO 8601 string (UTC when no zone is given)."""
    if isinstance(value, bool):
        raise ValueError("time must be Unix time in ms or an ISO 8601 string, not true/false")
    if isinstance(value, int):
        if not 0 <= value < 10**14:
            raise ValueError(f"time {value} is not Unix time in ms")
        return value
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"time {shown(value)} is not ISO 8601 (e.g. 2023-05-08T13:56:00Z)") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return int(parsed.timestamp() * 1000)
    raise ValueError("time must be Unix time in ms (an integer) or an ISO 8601 string")


def shown(value: Any) -> str:
    """A value as an error message quotes it: its repr, at most 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field_id(obj: dict[str, Any], name: str, required: bool = True) -> str | None:
    value = obj.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise ValueError(f"{name} {shown(value)} is not an id ({ID_RULE})")
    return value


def _valid_unicode(name: str, value: str) -> None:
    """Refuse a lone surrogate (a `\\ud800` escape alone): it has no UTF-8 form, so no store can hold it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name} holds a lone surrogate (a \\u{ord(value[exc.start]):04x} escape without its pair) at "
            f"character {exc.start + 1}: only valid Unicode text can be imported"
        ) from None


def parse_line(number: int, raw: bytes) -> Message:
    """One validated message, or ValueError naming what is wrong with the line."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"a line must be a JSON object, not {type(obj).__name__}")
    unknown = set(obj) - {"project", "session", "id", "role", "speaker", "text", "time"}
    if unknown:
        raise ValueError(f"unknown field(s) {shown(sorted(unknown))}")
    session = _field_id(obj, "session")
    project = _field_id(obj, "project", required=False) or DEFAULT_PROJECT
    message_id = _field_id(obj, "id")
    role = obj.get("role")
    if role not in ROLES:
        raise ValueError(f"role {shown(role)} must be user or assistant")
    speaker = obj.get("speaker")
    if speaker is not None and (not isinstance(speaker, str) or not 0 < len(speaker) <= 100):
        raise ValueError("speaker must be a name of 1-100 characters")
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("text must be non-empty text")
    for name, value in (("text", text), ("speaker", speaker)):
        if value is not None:
            _valid_unicode(name, value)
    if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
        raise ValueError(f"text is over {MAX_TEXT_BYTES} bytes")
    assert session is not None and message_id is not None
    # a NUL as U+FFFD, on both stores (`storable.without_nul`): PostgreSQL's jsonb cannot read it
    speaker = without_nul(speaker) if speaker is not None else None
    message = Message(
        number, project, session, message_id, role, speaker, without_nul(text), parse_time(obj.get("time"))
    )
    return message


@dataclass(frozen=True)
class Line:
    """One non-blank line: its number, where it starts, and its bytes (None: over the bound)."""

    number: int
    offset: int
    raw: bytes | None
    session_hint: str | None = None


def read_lines(handle: IO[bytes], total: int, progress: Progress | None, stop: Stop | None) -> Iterator[Line]:
    """Every non-blank line, each read at most `REM_IMPORT_LINE_MAX_BYTES` at a time."""
    limit = settings.import_line_max_bytes
    number, offset = 0, 0
    while True:
        raw = handle.readline(limit + 1)
        if not raw:
            break
        number += 1
        start, offset = offset, offset + len(raw)
        if len(raw) > limit and not raw.endswith(b"\n"):
            hint, skipped = _skip_long_line(handle, raw)
            offset += skipped
            yield Line(number, start, None, hint)
        elif raw.strip():
            yield Line(number, start, raw)
        if number % 5000 == 0:
            if stop is not None and stop():
                raise Stopped
            if progress is not None:
                progress(offset, total)
    if progress is not None:
        progress(total, total)


def _skip_long_line(handle: IO[bytes], head: bytes) -> tuple[str | None, int]:
    """Read past the rest of an over-long line, a piece at a time: (the session it names, bytes skipped)."""
    found = SESSION_KEY.search(head)
    window, skipped = head[-512:], 0
    while True:
        piece = handle.readline(SCAN_BYTES)
        skipped += len(piece)
        if found is None:
            found = SESSION_KEY.search(window + piece)
            window = (window + piece)[-512:]
        if not piece or piece.endswith(b"\n"):
            return (found.group(1).decode() if found else None), skipped


def _same_message(row: sqlite3.Row, msg: Message) -> bool:
    data = json.loads(row["data"])
    return bool(
        row["session_id"] == msg.session
        and row["type"] == msg.role
        and data.get("text") == msg.text
        and data.get("speaker") == msg.speaker
    )


def _session_hint(raw: bytes) -> str | None:
    """The session a bad line names, if it names one at all (so its session can be left out)."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    session = obj.get("session") if isinstance(obj, dict) else None
    return session if isinstance(session, str) else None


def validate_file(
    conn: Conn, path: Path, report: Report, progress: Progress | None, stop: Stop | None = None
) -> dict[str, Plan]:
    """Pass 1: every line, against the file's rules and the store (read only); the good sessions' plans."""
    plans: dict[str, Plan] = {}
    projects: dict[str, str] = {}
    seen_ids: set[str] = set()
    with path.open("rb") as handle:
        for line in read_lines(handle, path.stat().st_size, progress, stop):
            report.lines += 1
            msg = _validated(conn, line, report, projects, seen_ids)
            if msg is not None:
                plan = plans.setdefault(msg.session, Plan())
                plan.offsets.append(line.offset)
                plan.lines.append(line.number)
    return {session: plan for session, plan in plans.items() if session not in report.bad_sessions}


def _validated(
    conn: Conn, line: Line, report: Report, projects: dict[str, str], seen_ids: set[str]
) -> Message | None:
    if line.raw is None:
        limit = settings.import_line_max_bytes
        report.error(
            line.number,
            line.session_hint,
            f"the line is over {limit} bytes ({Settings.import_line_max_bytes.env}); it was not read",
        )
        return None
    try:
        msg = parse_line(line.number, line.raw)
    except ValueError as exc:
        report.error(line.number, _session_hint(line.raw), str(exc))
        return None
    if msg.id in seen_ids:
        report.error(line.number, msg.session, f"id {msg.id!r} appears twice in the file")
        return None
    seen_ids.add(msg.id)
    known = projects.get(msg.session)
    if known is None:
        row = conn.execute("SELECT project FROM session WHERE id = ?", (msg.session,)).fetchone()
        known = projects[msg.session] = row[0] if row else msg.project
    if known != msg.project:
        report.error(
            line.number, msg.session, f"session {msg.session!r} is in project {known!r}, not {msg.project!r}"
        )
        return None
    row = conn.execute(
        "SELECT session_id, type, data FROM session_message WHERE id = ?", (msg.id,)
    ).fetchone()
    if row is not None and not _same_message(row, msg):
        report.error(line.number, msg.session, f"id {msg.id!r} already names a different message")
        return None
    report.messages += 1
    report.sessions.add(msg.session)
    return msg


@dataclass
class Written:
    """What one committed transaction wrote (added to the report only once it committed)."""

    sessions: int = 0
    written: int = 0
    already: int = 0


def _read_back(handle: IO[bytes], offset: int, number: int) -> Message:
    """A line validated in pass 1, read again by its offset (a changed file stops the import)."""
    handle.seek(offset)
    raw = handle.readline(settings.import_line_max_bytes + 1)
    try:
        return parse_line(number, raw)
    except ValueError as exc:
        raise BadInput(f"line {number} changed while it was imported ({exc}); run the import again") from None


def write_session_sync(
    conn: Conn, handle: IO[bytes], session: str, plan: Plan, now: int, out: Written
) -> None:
    """One whole session, in the caller's transaction, a chunk of `BATCH` lines at a time."""
    created = False
    before = out.written
    for start in range(0, len(plan.offsets), BATCH):
        chunk = [
            _read_back(handle, offset, number)
            for offset, number in zip(
                plan.offsets[start : start + BATCH], plan.lines[start : start + BATCH], strict=True
            )
        ]
        ids = [m.id for m in chunk]
        marks = ",".join("?" * len(ids))
        present = {r[0] for r in conn.execute(f"SELECT id FROM session_message WHERE id IN ({marks})", ids)}
        fresh = [m for m in chunk if m.id not in present]
        out.already += len(chunk) - len(fresh)
        if not fresh:
            continue
        if not created:
            ensure_session_sync(conn, session, now, fresh[0].project)
            created = True
        first = reserve_seqs_sync(conn, session, len(fresh), now, messages=len(fresh))
        for offset, msg in enumerate(fresh):
            insert_message_sync(conn, msg.id, session, msg.role, first + offset, _data(msg), msg.time)
        out.written += len(fresh)
    if out.written > before:
        mark_turns_changed_sync(conn, session, now)
    out.sessions += 1


def _data(msg: Message) -> dict[str, Any]:
    data: dict[str, Any] = {"text": msg.text, "imported": True}
    if msg.speaker is not None:
        data["speaker"] = msg.speaker
    if msg.role == "assistant":
        data["status"] = "completed"
    return data


def transaction_groups(plans: dict[str, Plan]) -> Iterator[list[str]]:
    """Sessions in file order, grouped so one transaction holds about `BATCH` messages, whole sessions only."""
    group: list[str] = []
    size = 0
    for session, plan in plans.items():
        if group and size + len(plan.offsets) > BATCH:
            yield group
            group, size = [], 0
        group.append(session)
        size += len(plan.offsets)
    if group:
        yield group


async def import_file(
    db: Database,
    path: Path,
    *,
    actor: str = "import",
    progress: Progress | None = None,
    stop: Stop | None = None,
) -> dict[str, Any]:
    """Import a JSON Lines file (both passes); the report names every bad line (up to 50) and session.

    When `stop()` ends it early the report says so (`interrupted`) and which sessions
    were written and which were not; a failure raises `ImportFailed` carrying that report.
    """
    if not path.is_file():
        raise BadInput(f"{path} is not a file: pass a JSON Lines file to import")
    report = Report()

    def validate(conn: Conn) -> dict[str, Plan]:
        conn.execute("BEGIN")
        try:
            return validate_file(conn, path, report, progress, stop)
        finally:
            conn.execute("ROLLBACK")

    try:
        plans = await db.run_in_thread(validate)
    except Stopped:
        report.interrupted = True
        report.not_written = sorted(report.sessions - set(report.bad_sessions))
        return report.as_dict(path)
    report.writing = True
    await _write_all(db, path, plans, report, stop)
    await _journal(db, path, report, actor)
    if report.failure is not None:
        raise ImportFailed(report.failure, report.as_dict(path))
    return report.as_dict(path)


async def _write_all(
    db: Database, path: Path, plans: dict[str, Plan], report: Report, stop: Stop | None
) -> None:
    """Pass 2: each group of whole sessions in one transaction, until done, a failure or a stop."""
    groups = list(transaction_groups(plans))
    with path.open("rb") as handle:
        for index, group in enumerate(groups):
            if stop is not None and stop():
                report.interrupted = True
            else:
                try:
                    done = await db.write_in_thread(
                        partial(_write_group_sync, handle=handle, group=group, plans=plans)
                    )
                except (RemError, OSError) as exc:
                    report.failure = (
                        exc if isinstance(exc, RemError) else BadInput(f"cannot read {path}: {exc}")
                    )
                else:
                    report.sessions_written += done.sessions
                    report.written += done.written
                    report.already += done.already
                    continue
            report.not_written = [s for g in groups[index:] for s in g]
            return


def _write_group_sync(conn: Conn, handle: IO[bytes], group: list[str], plans: dict[str, Plan]) -> Written:
    out = Written()
    now = clock.now_ms()
    for session in group:
        write_session_sync(conn, handle, session, plans[session], now, out)
    return out


async def _journal(db: Database, path: Path, report: Report, actor: str) -> None:
    """The `memory.imported` event: what this import wrote, and whether it stopped early."""

    def write(conn: Conn) -> None:
        append_event_sync(
            conn,
            kind=EventKind.MEMORY_IMPORTED,
            actor=actor,
            target=str(path),
            data={
                "written": report.written,
                "already": report.already,
                "sessions": len(report.sessions),
                "sessions_written": report.sessions_written,
                "sessions_not_written": len(report.not_written),
                "errors": report.error_count,
                "interrupted": report.interrupted,
                "failure": None if report.failure is None else str(report.failure),
            },
        )

    try:
        await db.write_in_thread(write)
    except RemError:
        if report.failure is None:
            raise
