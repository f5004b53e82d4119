"""The `event` journal: append-only, written in the same transaction as the change it records.

The console tails it; runbooks query it. `append_event` must be called with a
connection that is inside the write transaction of the change it describes.

Operator events (`OPERATOR_KINDS`) are the audit journal, and hold:

* who acted: `actor` is the claimed operator (`REM_OPERATOR`, validated:
  printable, at most 64 characters; else the OS user), and next to it
  `os_uid` / `os_user`, the effective uid and its name from the password
  database, which a process cannot claim;
* they are hash-chained: `chain` = SHA-256 of the previous operator event's
  `chain` (kept in `chain_prev`) and this row's own content, so `rem check`
  finds an edited, removed, inserted or reordered operator event and names
  the first broken link (`verify_operator_chain_sync`). With
  `REM_JOURNAL_KEY_FILE` the link is an HMAC-SHA256 under that key instead
  (`hmac-sha256:` + hex): whoever can write the store but not read the key
  (a PostgreSQL login, not this host's files) cannot re-chain it; once one
  link is keyed, an unkeyed link after it is a break;
* a plain chain can be re-made whole by whoever writes the store, and its
  newest rows removed: `rem up` records the chain's head and length outside
  the store (`backend.store.journal_head`), and `rem check` finds the journal
  shorter than, or different up to, what was recorded;
* they are never pruned and a trigger refuses their deletion.

Every append of an operator kind goes through `append_event_sync`, whichever
function was called, so no caller can write an unchained one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pwd
from enum import StrEnum
from pathlib import Path
from typing import Any

import aiosqlite

from backend.core import clock, private
from backend.core.errors import UsageError
from backend.core.settings import settings
from backend.store.db import Conn, engine_of, execute_unread, in_thread


class EventKind(StrEnum):
    SCHEMA_MIGRATED = "schema.migrated"
    INPUT_ADMITTED = "input.admitted"
    INPUT_PROMOTED = "input.promoted"
    EXECUTION_CLAIMED = "execution.claimed"
    EXECUTION_STEP = "execution.step"
    EXECUTION_COMPLETED = "execution.completed"
    EXECUTION_LEASE_LOST = "execution.lease_lost"
    EXECUTION_TAKEN_OVER = "execution.taken_over"
    EXECUTION_HANDED_BACK = "execution.handed_back"
    EXECUTION_FAILED = "execution.failed"
    EXECUTION_INTERRUPTED = "execution.interrupted"
    EXECUTION_TRUNCATED = "execution.truncated"
    # a model reply held characters no store can hold (NUL, lone surrogates): stored as U+FFFD
    MODEL_OUTPUT_REPAIRED = "model.output_repaired"
    RECOVERY_PARKED = "recovery.parked"
    MODEL_ERROR = "model.error"
    SESSION_HELD = "session.held"
    SUMMARY_CLAIMED = "summary.claimed"
    SUMMARY_STAGED = "summary.staged"
    SUMMARY_COMPLETED = "summary.completed"
    SUMMARY_FAILED = "summary.failed"
    SUMMARY_RELEASED = "summary.released"
    RECEIPT_REPLAYED = "receipt.replayed"
    RECEIPT_QUARANTINED = "receipt.quarantined"
    RECEIPT_VERIFIED = "receipt.verified"
    DREAM_COMPLETED = "dream.completed"
    DREAM_STALE = "dream.stale"
    DREAM_DEFERRED = "dream.deferred"
    DREAM_UNDIGESTIBLE = "dream.undigestible"
    DREAM_TAKEN_OVER = "dream.taken_over"
    DREAM_OVERLAY_MISSING = "dream.overlay_missing"
    DREAM_LEGACY_IMPORTED = "dream.legacy_imported"
    DREAM_LEGACY_SUPERSEDED = "dream.legacy_superseded"
    WORKER_STARTED = "worker.started"
    WORKER_DRAINING = "worker.draining"
    WORKER_STOPPED = "worker.stopped"
    # its supervisor saw the process die and `--no-reap` left it unreaped (its leases count down)
    WORKER_EXITED = "worker.exited"
    RECEIPT_REPLAYING = "receipt.replaying"
    OPERATOR_REPLAY = "operator.replay"
    OPERATOR_REPLAY_INTENT = "operator.replay_intent"
    OPERATOR_DRAIN = "operator.drain"
    OPERATOR_RELEASE = "operator.release"
    OPERATOR_REFUSED = "operator.refused"
    MEMORY_REINDEXED = "memory.reindexed"
    MEMORY_IMPORTED = "memory.imported"
    OPERATOR_RESUME = "operator.resume"
    # the operator's decisions on agent tool calls (backend.ops.tool_decisions)
    OPERATOR_APPROVE = "operator.approve"
    OPERATOR_DENY = "operator.deny"
    OPERATOR_RESOLVE = "operator.resolve"
    # a turn that can only wait for a person left its executor (backend.execution.parking)
    EXECUTION_PARKED = "execution.parked"
    # agent tool calls: an effect whose outcome nobody knows; a turn that reached REM_MAX_STEPS
    TOOL_OUTCOME_UNKNOWN = "tool.outcome_unknown"
    EXECUTION_MAX_STEPS = "execution.max_steps"
    UNSAFE_SWITCH = "unsafe.switch"
    # something not the data dir's Chroma server listens where it was: refused, sent nothing
    CHROMA_UNTRUSTED = "chroma.untrusted"
    # turn vectors state.db marks as written that Chroma lacks (or holds changed): written again
    MEMORY_VECTORS_REPAIRED = "memory.vectors_repaired"
    # the API's event streams (schema v13): a streamed part and each tool-call state are journaled
    # by triggers in the transaction that writes them; a held session's hold lifted
    MESSAGE_PART = "message.part"
    TOOL_CALL_STATE = "tool_call.state"
    SESSION_RESUMED = "session.resumed"
    # an operator's SIGKILL of a worker (`rem kill`), the API's bearer tokens (`rem token`)
    OPERATOR_KILL = "operator.kill"
    OPERATOR_TOKEN_CREATE = "operator.token_create"
    OPERATOR_TOKEN_REVOKE = "operator.token_revoke"


# the audit journal: chained, kept forever (the partial index and the trigger of schema v4 list them)
OPERATOR_KINDS: tuple[str, ...] = (
    EventKind.OPERATOR_REPLAY,
    EventKind.OPERATOR_REPLAY_INTENT,
    EventKind.OPERATOR_DRAIN,
    EventKind.OPERATOR_RELEASE,
    EventKind.OPERATOR_RESUME,
    EventKind.OPERATOR_REFUSED,
    EventKind.OPERATOR_APPROVE,
    EventKind.OPERATOR_DENY,
    EventKind.OPERATOR_RESOLVE,
    EventKind.OPERATOR_KILL,
    EventKind.OPERATOR_TOKEN_CREATE,
    EventKind.OPERATOR_TOKEN_REVOKE,
)
OPERATOR_KINDS_SQL = ", ".join(f"'{kind}'" for kind in OPERATOR_KINDS)


def os_identity() -> tuple[int, str]:
    """This process's effective uid and its user name from the password database."""
    uid = os.geteuid()
    try:
        return uid, pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid, f"uid:{uid}"


def operator_name() -> str:
    """The operator named in the audit journal: `REM_OPERATOR` (validated), else the OS user."""
    return settings.operator or os_identity()[1]


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, default=str)  # reused: see sessions.dumps
# RETURNING, not lastrowid: PostgreSQL has no lastrowid
OPERATOR_EVENT_SQL = (
    "INSERT INTO event (time, kind, actor, session_id, target, data, os_uid, os_user, chain_prev, chain) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id"
)
# the turn path's journal rows: nobody reads their id (`append_event_sync`)
UNREAD_EVENT_SQL = "INSERT INTO event (time, kind, actor, session_id, target, data) VALUES (?, ?, ?, ?, ?, ?)"
EVENT_SQL = UNREAD_EVENT_SQL + " RETURNING id"
# PostgreSQL: operator events append one at a time (the chain needs one global order; SQLite's
# single writer gives it for free), under this transaction-scoped advisory lock
CHAIN_LOCK = 0x72656D5F63686E  # "rem_chn"
LAST_CHAIN_SQL = f"SELECT chain FROM event WHERE kind IN ({OPERATOR_KINDS_SQL}) ORDER BY id DESC LIMIT 1"


def _event_row(
    kind: EventKind | str,
    actor: str,
    session_id: str | None,
    target: str | None,
    data: dict[str, Any] | None,
    now: int | None,
) -> tuple[Any, ...]:
    return (
        clock.now_ms() if now is None else now,
        str(kind),
        actor,
        session_id,
        target,
        _ENCODER.encode(data or {}),
    )


KEYED_PREFIX = "hmac-sha256:"
JOURNAL_KEY_MIN = 16


def _read_key_file(path: Path) -> tuple[os.stat_result, bytes]:
    """The key file's status and its key (surrounding white space stripped), or a UsageError."""
    try:
        return path.stat(), path.read_bytes().strip()
    except OSError as exc:
        raise UsageError(
            f"REM_JOURNAL_KEY_FILE={path} cannot be read ({exc.strerror}); fix it or unset it"
        ) from None


def journal_key() -> bytes | None:
    """The operator journal's chain key from `REM_JOURNAL_KEY_FILE` (None: unset, plain SHA-256).

    The file must be this user's and private (mode 600), like the Chroma token file.
    """
    path = settings.journal_key_file
    if path is None:
        return None
    st, key = _read_key_file(path)
    if not private.private_to_owner(st):
        raise UsageError(
            f"REM_JOURNAL_KEY_FILE={path} must be yours and private (mode 600); `chmod 600 {path}`"
        )
    if len(key) < JOURNAL_KEY_MIN:
        raise UsageError(
            f"REM_JOURNAL_KEY_FILE={path} holds {len(key)} bytes; a journal key needs at least "
            f"{JOURNAL_KEY_MIN} (e.g. `head -c 32 /dev/urandom | base64 > {path}`)"
        )
    return key


def chain_link(previous: str | None, row: tuple[Any, ...], key: bytes | None = None) -> str:
    """The link of an operator event: SHA-256 (hex) of the previous link and this event's content,
    or, with a journal key, `hmac-sha256:` + its HMAC under that key.

    `row` is (time, kind, actor, session_id, target, data, os_uid, os_user)
    as stored: `data` is the exact JSON text, so the hash covers the bytes.
    """
    content = json.dumps([previous, *row], separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if key is not None:
        return KEYED_PREFIX + hmac.new(key, content, hashlib.sha256).hexdigest()
    return hashlib.sha256(content).hexdigest()


def _append_operator_event(conn: Conn, row: tuple[Any, ...]) -> int:
    """Insert an operator event chained to the last one (inside the caller's write transaction)."""
    if engine_of(conn) == "postgresql":
        conn.execute("SELECT pg_advisory_xact_lock(?)", (CHAIN_LOCK,))
    previous = conn.execute(LAST_CHAIN_SQL).fetchone()
    prev = previous[0] if previous is not None else None
    uid, user = os_identity()
    full = (*row, uid, user)
    link = chain_link(prev, full, journal_key())
    return _id(conn.execute(OPERATOR_EVENT_SQL, (*full, prev, link)).fetchone())


def _id(row: Any) -> int:
    return int(row[0]) if row is not None else 0


async def append_event(
    conn: aiosqlite.Connection,
    *,
    kind: EventKind | str,
    actor: str,
    session_id: str | None = None,
    target: str | None = None,
    data: dict[str, Any] | None = None,
    now: int | None = None,
) -> int:
    """Append one journal row inside the caller's transaction; returns its id."""
    row = _event_row(kind, actor, session_id, target, data, now)
    if str(kind) in OPERATOR_KINDS:  # read the previous link and insert in one hop
        return int(await in_thread(conn, _append_operator_event, row))
    cursor = await conn.execute(EVENT_SQL, row)
    try:
        return _id(await cursor.fetchone())
    finally:
        await cursor.close()


def append_event_sync(
    conn: Conn,
    *,
    kind: EventKind | str,
    actor: str,
    session_id: str | None = None,
    target: str | None = None,
    data: dict[str, Any] | None = None,
    now: int | None = None,
) -> None:
    """`append_event` for code already running on the connection's thread (`Database.write_in_thread`).

    Returns nothing: on PostgreSQL the row goes with the transaction's next
    statement (`execute_unread`), so the turn path's journal rows cost no
    round trip of their own.
    """
    row = _event_row(kind, actor, session_id, target, data, now)
    if str(kind) in OPERATOR_KINDS:
        _append_operator_event(conn, row)
        return
    execute_unread(conn, UNREAD_EVENT_SQL, row)  # nobody reads the id: no round trip of its own


CHAIN_SQL = f"""
SELECT id, time, kind, actor, session_id, target, data, os_uid, os_user, chain_prev, chain
FROM event INDEXED BY event_operator_idx WHERE kind IN ({OPERATOR_KINDS_SQL}) ORDER BY id"""


def verify_operator_chain_sync(conn: Conn, key: bytes | None = None, at: int | None = None) -> dict[str, Any]:
    """Walk the operator events in order; the first broken link, if any, and what was checked.

    Rows written before the chain existed (schema < 3, `chain` NULL) are
    counted as `unchained` while no chained row came before them; after the
    first chained row, a row without a link is itself a break. Keyed links
    are verified with `key`; a plain link after a keyed one is a break.
    `count` and `head` are the chained rows and the last link; `link_at`
    the link of chained row number `at` (1-based), for a recorded head.
    """
    checked = unchained = count = 0
    previous: str | None = None
    link_at: str | None = None
    chained = keyed = False
    for record in conn.execute(CHAIN_SQL):
        event_id, content, prev, link = record[0], tuple(record[1:9]), record[9], record[10]
        checked += 1
        if link is None:
            if chained:
                return _broken(
                    event_id, content, checked, unchained, "carries no chain link (written outside rem)"
                )
            unchained += 1
            continue
        if prev != previous:
            why = "does not follow the operator event before it (one was removed, inserted or reordered)"
            return _broken(event_id, content, checked, unchained, why)
        problem = _link_problem(prev, content, link, key, keyed)
        if problem is not None:
            return _broken(event_id, content, checked, unchained, problem)
        keyed = keyed or link.startswith(KEYED_PREFIX)
        count += 1
        link_at = link if count == at else link_at
        previous, chained = link, True
    return {
        "ok": True,
        "checked": checked,
        "unchained": unchained,
        "broken": None,
        "count": count,
        "head": previous,
        "link_at": link_at,
    }


def _link_problem(
    prev: str | None, content: tuple[Any, ...], link: str, key: bytes | None, keyed: bool
) -> str | None:
    """Why `link` is not this row's link (None: it is)."""
    if not link.startswith(KEYED_PREFIX):
        if keyed:
            return "is not keyed though an operator event before it is (re-chained without the journal key)"
        return None if chain_link(prev, content) == link else "does not match its own hash (it was edited)"
    if key is None:
        return "is keyed, and this rem has no journal key to verify it (set REM_JOURNAL_KEY_FILE to its writers' key)"
    if not hmac.compare_digest(chain_link(prev, content, key), link):
        return "does not match its own keyed hash (it was edited, or keyed with another key)"
    return None


def _broken(
    event_id: int, content: tuple[Any, ...], checked: int, unchained: int, why: str
) -> dict[str, Any]:
    broken = {"event_id": event_id, "time": content[0], "kind": content[1], "actor": content[2], "why": why}
    return {"ok": False, "checked": checked, "unchained": unchained, "broken": broken}


# A session's rows come by session (every row of an execution, a summary job or a
# Dream pass carries its session); by target only the rows without one (worker
# lifecycle, drains): the partial event_target_idx holds just those.
HISTORY_SQL = """
SELECT * FROM (SELECT id, time, kind, actor, session_id, target, data FROM event
               WHERE target = :target AND session_id IS NULL ORDER BY id DESC LIMIT :limit)
UNION
SELECT * FROM (SELECT id, time, kind, actor, session_id, target, data FROM event
               WHERE session_id = :session_id ORDER BY id DESC LIMIT :limit)
ORDER BY id DESC LIMIT :limit
"""


def decode_event(row: Any) -> dict[str, Any]:
    """One `event` row as a dict with its `data` JSON decoded (undecodable data kept raw)."""
    event = dict(row)
    try:
        event["data"] = json.loads(event.get("data") or "{}")
    except ValueError:
        event["data"] = {"raw": event.get("data")}
    return event


async def history(
    db: Any, *, session_id: str | None = None, target: str | None = None, limit: int = 200
) -> list[dict[str, Any]]:
    """Journal rows about one session and/or one session-less target, newest first (two indexed lookups).

    A target that belongs to a session (an execution, a summary id) is found
    through its session: pass both.
    """
    if session_id is None and target is None:
        return []
    rows = await db.fetchall(HISTORY_SQL, {"target": target, "session_id": session_id, "limit": limit})
    return [decode_event(r) for r in rows]
