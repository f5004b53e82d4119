"""Sessions and their inputs: admission (`rem send`), the per-session sequence, promotion.

Admission is idempotent on the input id and draws `admitted_seq` from
`session.last_seq` in the same transaction; promotion (done by the executor
under its lease) draws `promoted_seq` from the same sequence, sets it exactly
once, and writes the `user` message with the input's id and that seq. Bad
input raises `BadInput` before anything is written.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Collection
from typing import Any, BinaryIO

from backend.core import clock
from backend.core.errors import BadInput, DatabaseRefused, InputConflict, OutOfReach, SessionNotFound
from backend.core.storable import without_nul
from backend.store.db import (
    Conn,
    Database,
    Reader,
    Row,
    execute_unread,
    fenced_write,
    read_together_sync,
)
from backend.store.events import EventKind, append_event_sync
from backend.store.states import Delivery as Delivery  # re-exported: where callers find it

DELIVERIES = frozenset(Delivery)
# 256 KiB of UTF-8: a prompt is a message, not a document upload.
MAX_TEXT_BYTES = 256 * 1024
# Ids (session ids and input ids): 1-100 chars of letters, digits, `.`, `_`, `-`,
# starting with a letter or digit. Ids rem derives itself contain `:`, so a
# caller's id can never collide with one (e.g. `recovery:<execution_id>`).
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
ID_RULE = "1-100 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"


def new_input_id() -> str:
    """A fresh, time-ordered input id (it becomes the user message id)."""
    return f"in_{clock.now_ms():013x}{uuid.uuid4().hex[:12]}"


def validate_id(kind: str, value: str, flag: str) -> str:
    """Return `value` if it is a well-formed id, else raise BadInput naming the fix."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        shown = value if len(str(value)) <= 40 else str(value)[:37] + "..."
        raise BadInput(f"malformed {kind} {shown!r}: use {ID_RULE} ({flag})")
    return value


DEFAULT_PROJECT = "default"


def validate_input(
    session_id: str, text: str, delivery: str, input_id: str | None, project: str | None = None
) -> None:
    """Refuse bad admission input with one line that names the fix; writes nothing."""
    validate_id("session id", session_id, "SESSION")
    if project is not None:
        validate_id("project", project, "--project")
    if input_id is not None:
        validate_id("input id", input_id, "--id")
    if delivery not in DELIVERIES:
        raise BadInput(f"unknown delivery {delivery!r}: use --delivery queue or --delivery steer")
    if not isinstance(text, str) or not text.strip():
        raise BadInput("the input text is empty: pass the prompt as TEXT")
    size = _utf8_size(text)
    if size > MAX_TEXT_BYTES:
        raise BadInput(
            f"the input text is {size} bytes, over the {MAX_TEXT_BYTES} byte (256 KiB) limit: "
            "send a shorter prompt or split it into several inputs"
        )


def _utf8_size(text: str) -> int:
    """The text's size in UTF-8; refuses text that is not valid Unicode (e.g. bytes from a shell)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        # Python hands undecodable argv bytes over as lone surrogates U+DC80..U+DCFF
        code = ord(text[exc.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"lone surrogate U+{code:04X}"
        raise BadInput(
            f"the input text is not valid UTF-8 ({what} at character {exc.start}): "
            "send UTF-8 text (e.g. convert it with `iconv -t UTF-8`)"
        ) from None


def read_bounded(stream: BinaryIO, source: str = "stdin") -> bytes:
    """At most MAX_TEXT_BYTES from `stream`; refuses more without reading the rest (`rem send -`).

    Reading everything first and measuring afterwards let 64 MiB on stdin grow
    the process to 172 MB before the limit was even checked.
    """
    raw = stream.read(MAX_TEXT_BYTES + 1)
    if len(raw) > MAX_TEXT_BYTES:
        raise BadInput(
            f"the text on {source} is over the {MAX_TEXT_BYTES} byte (256 KiB) limit: "
            "send a shorter prompt or split it into several inputs"
        )
    return bytes(raw)


def decode_text(raw: bytes, source: str = "stdin") -> str:
    """Strict UTF-8 text from raw bytes (`rem send -`), or BadInput naming the bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(
            f"the text on {source} is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start}): send UTF-8 text (e.g. convert it with `iconv -t UTF-8`)"
        ) from None


# PostgreSQL's unique_violation: two admissions of one new id raced (READ COMMITTED: neither saw the other)
UNIQUE_VIOLATION = "23505"


async def admit(
    db: Database,
    session_id: str,
    text: str,
    *,
    delivery: str = Delivery.QUEUE,
    input_id: str | None = None,
    now: int | None = None,
    actor: str = "send",
    project: str | None = None,
    projects: Collection[str] | None = None,
    caller: Callable[[Conn], tuple[str, Collection[str] | None]] | None = None,
    validated: bool = False,
) -> dict[str, Any]:
    """Admit one input (idempotent on its id), creating the session (in `project`) on first use.

    `projects` keeps a caller to those projects (an API token): a session of another one is
    not found, and an input id it holds is refused without naming where. `caller`, when given,
    decides `actor` and `projects` inside the admission's transaction (an API token checked there).
    A NUL in the text is kept as U+FFFD, on both stores (`storable.without_nul`). `validated`: the
    caller ran `validate_input` on these very values (the API's hot path), so it is not run again.
    """
    if not validated:
        validate_input(session_id, text, delivery, input_id, project)  # the text as sent: size, Unicode
    text = without_nul(text)
    input_id = input_id or new_input_id()
    now = clock.now_ms() if now is None else now

    def admit_once(conn: Conn) -> dict[str, Any]:
        who, reach = (actor, projects) if caller is None else caller(conn)
        return admit_sync(conn, session_id, text, delivery, input_id, now, who, project, reach)

    try:
        return await db.write_in_thread(admit_once, key=session_id)
    except DatabaseRefused as exc:
        if exc.sqlstate != UNIQUE_VIOLATION:
            raise
    # on PostgreSQL a concurrent admission of the same new id committed first: this transaction
    # rolled back whole, and now reads that admission (answered as a duplicate, or refused)
    return await db.write_in_thread(admit_once, key=session_id)


def admit_sync(
    conn: Conn,
    session_id: str,
    text: str,
    delivery: str,
    input_id: str,
    now: int,
    actor: str = "send",
    project: str | None = None,
    projects: Collection[str] | None = None,
) -> dict[str, Any]:
    """The admission transaction body (validated input, on the connection's thread)."""
    if projects is not None:
        project = _project_in_reach_sync(conn, session_id, project, projects)
    existing = conn.execute(
        "SELECT i.session_id, i.prompt, i.delivery, i.admitted_seq, i.promoted_seq, s.project "
        "FROM session_input AS i JOIN session AS s ON s.id = i.session_id WHERE i.id = ?",
        (input_id,),
    ).fetchone()
    if existing is not None:
        hidden = projects is not None and existing["project"] not in projects
        return _readmitted(existing, session_id, input_id, text, delivery, hidden=hidden)
    if conn.execute("SELECT 1 FROM session_message WHERE id = ?", (input_id,)).fetchone():
        # the input id becomes a session_message id at promotion; it must be free
        raise InputConflict(f"input id {input_id!r} already names a message: use a new --id")
    created = ensure_session_sync(conn, session_id, now, project)
    seq = reserve_seqs_sync(conn, session_id, 1, now, inputs=1)
    # a held session (a model error an operator must fix) admits its inputs asleep: they
    # wait, visible, and wake when the operator resumes it
    conn.execute(
        "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, "
        "wake_pending, wake_attempts, time_created) "
        "VALUES (?, ?, ?, ?, ?, (SELECT CASE WHEN held_at IS NULL THEN 1 ELSE 0 END FROM session WHERE id = ?), 0, ?)",
        (input_id, session_id, dumps({"text": text}), delivery, seq, session_id, now),
    )
    append_event_sync(
        conn,
        kind=EventKind.INPUT_ADMITTED,
        actor=actor,
        session_id=session_id,
        target=input_id,
        now=now,
        data={"delivery": delivery, "admitted_seq": seq, "bytes": len(text.encode("utf-8", "surrogatepass"))},
    )
    return {
        "session_id": session_id,
        "input_id": input_id,
        "delivery": delivery,
        "admitted_seq": seq,
        "promoted_seq": None,
        "duplicate": False,
        "session_created": created,
    }


def _project_in_reach_sync(
    conn: Conn, session_id: str, project: str | None, projects: Collection[str]
) -> str | None:
    """The project to admit into for a caller kept to `projects`: a session of another one is not
    found; a new session goes to the project named (one of them) or to the only one there is."""
    row = conn.execute("SELECT project FROM session WHERE id = ?", (session_id,)).fetchone()
    if row is not None:
        if row[0] not in projects:
            raise SessionNotFound(f"no session {session_id!r}")
        return project  # ensure_session_sync refuses a named project that is not the session's
    if project is None:
        if len(projects) != 1:
            raise BadInput(
                f"session {session_id!r} is new: name its project (one of {', '.join(sorted(projects))})"
            )
        return next(iter(projects))
    if project not in projects:
        raise OutOfReach(f"project {project!r} is not one this caller may use; name one it reaches")
    return project


def _readmitted(
    row: Row, session_id: str, input_id: str, text: str, delivery: str, *, hidden: bool = False
) -> dict[str, Any]:
    """The answer to a re-admission: the original admission, or a refusal if it differs
    (`hidden`: the first is in a session the caller may not see, which the refusal does not name)."""
    same = (
        row["session_id"] == session_id
        and row["delivery"] == delivery
        and json.loads(row["prompt"]).get("text") == text
    )
    if hidden or not same:
        where = "another input" if hidden else f"an input of session {row['session_id']!r}"
        raise InputConflict(
            f"input id {input_id!r} is already taken by {where} with different text, delivery or "
            "session: resend the same input, or use a new id (--id)"
        )
    return {
        "session_id": session_id,
        "input_id": input_id,
        "delivery": delivery,
        "admitted_seq": row["admitted_seq"],
        "promoted_seq": row["promoted_seq"],
        "duplicate": True,
        "session_created": False,
    }


# one encoder for every call: `json.dumps` with non-default options builds a new
# JSONEncoder each time, which costs more than encoding a message row
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(data: Any) -> str:
    """Compact JSON for the data columns (UTF-8 kept as is)."""
    return _ENCODER.encode(data)


def ensure_session_sync(conn: Conn, session_id: str, now: int, project: str | None = None) -> bool:
    """Create the session row (in `project`, default `default`) if missing; True when it was created.

    A session's project is fixed when it is created: naming another one for
    an existing session is refused (recall is scoped by project, so moving a
    session would silently move its memory).
    """
    created = (
        conn.execute(
            "INSERT INTO session (id, project, time_created, time_updated) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (id) DO NOTHING",
            (session_id, project or DEFAULT_PROJECT, now, now),
        ).rowcount
        > 0
    )
    if not created and project is not None:
        row = conn.execute("SELECT project FROM session WHERE id = ?", (session_id,)).fetchone()
        if row is not None and row[0] != project:
            raise BadInput(
                f"session {session_id!r} belongs to project {row[0]!r}, not {project!r}: "
                f"send without --project, or use another session"
            )
    return created


def reserve_seqs_sync(
    conn: Conn, session_id: str, count: int, now: int, *, inputs: int = 0, messages: int = 0
) -> int:
    """Take `count` numbers from the session sequence; returns the first of them."""
    first: int = read_together_sync(
        conn, [reserve_seqs(session_id, count, now, inputs=inputs, messages=messages)]
    )[0]
    return first


def reserve_seqs(session_id: str, count: int, now: int, *, inputs: int = 0, messages: int = 0) -> Reader[int]:
    """`reserve_seqs_sync` as a `Reader`, to be sent with other statements (`read_together_sync`)."""
    (rows,) = yield [
        (
            "UPDATE session SET last_seq = last_seq + :n, input_count = input_count + :i, "
            "message_count = message_count + :m, time_updated = :now WHERE id = :sid RETURNING last_seq",
            {"n": count, "i": inputs, "m": messages, "now": now, "sid": session_id},
        )
    ]
    if not rows:
        raise BadInput(f"no session {session_id!r}")
    return int(rows[0]["last_seq"]) - count + 1


PENDING_COLUMNS = "id, prompt, delivery, admitted_seq, time_created"


# Served in order by session_input_session_promoted_delivery_admitted_idx
# (no sort, however many inputs wait): the pending steers.
PENDING_STEERS_SQL = f"""
SELECT {PENDING_COLUMNS} FROM session_input
WHERE session_id = ? AND promoted_seq IS NULL AND delivery = 'steer' ORDER BY admitted_seq
"""
# The oldest pending input of either delivery, from the same index (two seeks).
OLDEST_PENDING_SQL = """
SELECT id FROM (
    SELECT * FROM (SELECT id, admitted_seq FROM session_input WHERE session_id = :sid
                   AND promoted_seq IS NULL AND delivery = 'queue' ORDER BY admitted_seq LIMIT 1)
    UNION ALL
    SELECT * FROM (SELECT id, admitted_seq FROM session_input WHERE session_id = :sid
                   AND promoted_seq IS NULL AND delivery = 'steer' ORDER BY admitted_seq LIMIT 1))
ORDER BY admitted_seq LIMIT 1
"""


# At a turn start, both at once (one round trip on PostgreSQL): the oldest queued input
# first (`queued` = 1), then the steers in order; each part served by the same index.
PENDING_AT_TURN_START_SQL = f"""
SELECT * FROM (SELECT {PENDING_COLUMNS}, 1 AS queued FROM session_input
               WHERE session_id = :sid AND promoted_seq IS NULL AND delivery = 'queue'
               ORDER BY admitted_seq LIMIT 1) AS oldest_queued
UNION ALL
SELECT * FROM (SELECT {PENDING_COLUMNS}, 0 AS queued FROM session_input
               WHERE session_id = :sid AND promoted_seq IS NULL AND delivery = 'steer'
               ORDER BY admitted_seq) AS steers
"""


def pending_inputs_sync(conn: Conn, session_id: str, *, turn_start: bool) -> list[Row]:
    """The inputs to promote now: every pending steer, plus the oldest pending input at a turn start."""
    if not turn_start:
        return list(conn.execute(PENDING_STEERS_SQL, (session_id,)).fetchall())
    found = conn.execute(PENDING_AT_TURN_START_SQL, {"sid": session_id}).fetchall()
    oldest = [row for row in found if row["queued"]]
    rows = sorted((row for row in found if not row["queued"]), key=lambda row: row["admitted_seq"])
    # a queue input starts the turn only when no steer waits from before it
    if oldest and (not rows or oldest[0]["admitted_seq"] < rows[0]["admitted_seq"]):
        rows = [oldest[0], *rows]
    return rows


def promote_sync(
    conn: Conn,
    session_id: str,
    execution_id: str,
    inputs: list[Row],
    first_seq: int,
    now: int,
) -> list[dict[str, Any]]:
    """Turn admitted inputs into `user` messages at the given seqs (exactly once each)."""
    promoted = []
    for offset, row in enumerate(inputs):
        seq = first_seq + offset
        # unreachable under the lease; refused rather than promoted twice (unread on
        # PostgreSQL: the refusal fails the transaction where it is sent)
        fenced_write(
            conn,
            "UPDATE session_input SET promoted_seq = ?, wake_pending = 0 WHERE id = ? AND promoted_seq IS NULL",
            (seq, row["id"]),
            f"input {row['id']} was promoted concurrently: another execution holds session {session_id}",
            unread=True,
        )
        text = json.loads(row["prompt"]).get("text", "")
        data = {
            "text": text,
            "delivery": row["delivery"],
            "input_id": row["id"],
            "admitted_seq": row["admitted_seq"],
            "execution_id": execution_id,
        }
        insert_message_sync(conn, row["id"], session_id, "user", seq, data, now)
        promoted.append(
            {
                "id": row["id"],
                "seq": seq,
                "text": text,
                "delivery": row["delivery"],
                "admitted_at": row["time_created"],
            }
        )
    return promoted


def insert_message_sync(
    conn: Conn,
    message_id: str,
    session_id: str,
    kind: str,
    seq: int,
    data: dict[str, Any],
    now: int,
) -> None:
    """Insert one transcript row (seq must come from `reserve_seqs_sync`).

    Unread (PostgreSQL: sent with the transaction's next statement); an error
    (a duplicate id or seq) fails the transaction where it is sent.
    """
    execute_unread(
        conn,
        "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (message_id, session_id, kind, seq, now, now, dumps(data)),
    )


def sleep_inputs_sync(conn: Conn, session_id: str) -> int:
    """A held session's waiting inputs sleep (no wake is due) until the hold is lifted; how many."""
    return int(
        conn.execute(
            "UPDATE session_input SET wake_pending = 0 WHERE session_id = ? AND promoted_seq IS NULL",
            (session_id,),
        ).rowcount
    )
