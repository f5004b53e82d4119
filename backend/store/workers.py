"""The `worker` registry: live daemons, their heartbeats and drain requests."""

from __future__ import annotations

import json
import os
import socket
import uuid
from typing import Any

from backend.core import clock
from backend.core.settings import settings
from backend.store.db import Database, execute
from backend.store.events import EventKind, append_event

# the worker vocabulary lives in backend.store.states (no database code): re-exported here
from backend.store.states import LIVE_STATES as LIVE_STATES
from backend.store.states import LeaseKind as LeaseKind
from backend.store.states import WorkerRole as WorkerRole
from backend.store.states import WorkerState as WorkerState

# a worker whose heartbeat is older than this is presumed dead
WORKER_DEAD_AFTER_MS = 10_000
# a heartbeat is a liveness lease: renewed once a third of it is used, like every lease
HEARTBEAT_INTERVAL_MS = WORKER_DEAD_AFTER_MS // 3


def host_name() -> str:
    """This host's identity in the registry: `REM_HOST`, else the machine's host name.

    A worker's `host` says where its pid means something: only a process on
    the same host can trust a supervisor's "it exited" record enough to take
    its leases over before they expire (`leases.takeover_reason_sync`).
    """
    return settings.host or socket.gethostname()


def new_owner_id(role: WorkerRole) -> str:
    """A unique owner id that names the role, host and pid for operators."""
    return f"{role}-{host_name()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


# what a worker records of its own process in its row's `info`: the kernel's start time of its pid,
# so an operator's kill (`backend.ops.kills`) can tell it from a later process given the same pid,
# as the supervisor does with `up.json`
PROCESS_STARTED_KEY = "process_started_at"
_OWN_START: dict[int, float | None] = {}


def own_process() -> dict[str, Any]:
    """`{PROCESS_STARTED_KEY: ...}` of this process (read once per pid: a forked child reads its own)."""
    pid = os.getpid()
    if pid not in _OWN_START:
        from backend.core import processes  # import time: psutil, only for a worker's registration

        _OWN_START[pid] = processes.started_at(pid)
    return {PROCESS_STARTED_KEY: _OWN_START[pid]}


def heartbeat_alive(heartbeat_at: int | None, now: int) -> bool:
    return heartbeat_at is not None and now - heartbeat_at <= WORKER_DEAD_AFTER_MS


def worker_alive(state: str | None, heartbeat_at: int | None, exited_at: int | None, now: int) -> bool:
    """Alive: running or draining, not seen to exit by its supervisor, and heartbeating.

    A death its supervisor saw counts at once; the heartbeat rule is for what
    no supervisor here sees (a worker on another host, a whole host gone).
    """
    return state in LIVE_STATES and exited_at is None and heartbeat_alive(heartbeat_at, now)


async def register(
    db: Database,
    owner_id: str,
    role: WorkerRole,
    info: dict[str, Any] | None = None,
    *,
    unsafe: dict[str, Any] | None = None,
) -> None:
    """Join the worker registry; a worker running with unsafe test switches says so in the journal."""
    now = clock.now_ms()
    async with db.tx() as conn:
        if unsafe:
            await append_event(
                conn,
                kind=EventKind.UNSAFE_SWITCH,
                actor=owner_id,
                target=owner_id,
                data={"role": role, "pid": os.getpid(), "switches": unsafe},
                now=now,
            )
        await execute(
            conn,
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state, info) "
            "VALUES (?, ?, ?, ?, ?, ?, 'running', ?)",
            (
                owner_id,
                role,
                os.getpid(),
                host_name(),
                now,
                now,
                json.dumps({**(info or {}), **own_process()}),
            ),
        )
        await append_event(
            conn,
            kind=EventKind.WORKER_STARTED,
            actor=owner_id,
            target=owner_id,
            data={"role": role, "pid": os.getpid(), "host": host_name()},
            now=now,
        )


async def beat(db: Database, owner_id: str) -> WorkerState | None:
    """Record a heartbeat; returns the worker's state (`draining` asks it to stop).

    One statement, its own transaction (autocommit): one thread hop and one round trip, where
    BEGIN, the UPDATE and COMMIT took three hops and two round trips on PostgreSQL. SQLite starts a
    write statement's transaction as a writer, so it waits out a busy database as BEGIN IMMEDIATE does.
    """
    rows = await db.fetchall(
        "UPDATE worker SET heartbeat_at = ? WHERE owner_id = ? RETURNING state", (clock.now_ms(), owner_id)
    )
    return WorkerState(rows[0]["state"]) if rows else None


async def record_info(db: Database, owner_id: str, info: dict[str, Any]) -> None:
    """Replace what the worker says about itself (`info`, its process's start time kept), in one
    statement: rare, never per turn."""
    await db.fetchall(
        "UPDATE worker SET info = ? WHERE owner_id = ? RETURNING owner_id",
        (json.dumps({**info, **own_process()}), owner_id),
    )


async def mark_stopped(db: Database, owner_id: str, reason: str) -> None:
    now = clock.now_ms()
    async with db.tx() as conn:
        changed = await execute(
            conn,
            "UPDATE worker SET state = 'stopped', stopped_at = ?, heartbeat_at = ? "
            "WHERE owner_id = ? AND state != 'stopped'",
            (now, now, owner_id),
        )
        if changed:
            await append_event(
                conn,
                kind=EventKind.WORKER_STOPPED,
                actor=owner_id,
                target=owner_id,
                data={"reason": reason},
                now=now,
            )


async def state_of(db: Database, owner_id: str) -> WorkerState | None:
    state = await db.scalar("SELECT state FROM worker WHERE owner_id = ?", (owner_id,))
    return None if state is None else WorkerState(state)


# reaped (`rem up` reaps): stopped too, including a row an operator's kill already recorded dead
# (`backend.ops.kills`: the exit, not the reap, is the kill's to record); the exit alone otherwise
MARK_EXITED_SQL = {
    True: "UPDATE worker SET state = 'stopped', stopped_at = ?, exited_at = COALESCE(exited_at, ?) "
    "WHERE pid = ? AND host = ? AND state != 'stopped' RETURNING owner_id",
    False: "UPDATE worker SET exited_at = ? "
    "WHERE pid = ? AND host = ? AND state != 'stopped' AND exited_at IS NULL RETURNING owner_id",
}


async def mark_exited(db: Database, pid: int, host: str, reason: str, *, reap: bool = True) -> list[str]:
    """Record the worker rows of a process that died (its supervisor saw it exit) as dead, now.

    `reap` also marks them stopped, which lets this host's workers take their
    leases over before expiry; without it (`rem up --no-reap`) the leases count
    down, or an operator releases them, as a death on another host would.
    """
    now = clock.now_ms()
    params = ((now, now) if reap else (now,)) + (pid, host)
    async with db.tx() as conn:
        rows = list(await conn.execute_fetchall(MARK_EXITED_SQL[reap], params))
        for row in rows:
            await append_event(
                conn,
                kind=EventKind.WORKER_STOPPED if reap else EventKind.WORKER_EXITED,
                actor="supervisor",
                target=row["owner_id"],
                data={"reason": reason, "pid": pid, "reaped": reap},
                now=now,
            )
    return [row["owner_id"] for row in rows]


async def leases_held(db: Database, owner_id: str) -> int:
    """How many leases (execution, summary job, Dream) the worker still holds."""
    return int(
        await db.scalar(
            "SELECT (SELECT count(*) FROM session_execution WHERE owner_id = :o) "
            "+ (SELECT count(*) FROM summary_job WHERE owner_id = :o AND status = 'in_progress') "
            "+ (SELECT count(*) FROM dream_state WHERE owner_id = :o AND digest_state = 'in_progress')",
            {"o": owner_id},
        )
    )
