"""The `worker` registry: live daemons, their heartbeats and drain requests."""

from __future__ import annotations

import json
import os
import socket
import uuid
from typing import Any

from backend import clock
from backend.db import Database, execute
from backend.events import EventKind, append_event

HEARTBEAT_INTERVAL_MS = 2_000
# a worker whose heartbeat is older than this is presumed dead
WORKER_DEAD_AFTER_MS = 10_000
ROLES = ("executor", "summarizer", "dream")


def new_owner_id(role: str) -> str:
    """A unique owner id that names the role, host and pid for operators."""
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def heartbeat_alive(heartbeat_at: int | None, now: int) -> bool:
    return heartbeat_at is not None and now - heartbeat_at <= WORKER_DEAD_AFTER_MS


async def register(db: Database, owner_id: str, role: str, info: dict[str, Any] | None = None) -> None:
    now = clock.now_ms()
    async with db.tx() as conn:
        await execute(
            conn,
            "INSERT INTO worker (owner_id, role, pid, host, started_at, heartbeat_at, state, info) "
            "VALUES (?, ?, ?, ?, ?, ?, 'running', ?)",
            (owner_id, role, os.getpid(), socket.gethostname(), now, now, json.dumps(info or {})),
        )
        await append_event(conn, kind=EventKind.WORKER_STARTED, actor=owner_id, target=owner_id,
                           data={"role": role, "pid": os.getpid()}, now=now)


async def beat(db: Database, owner_id: str) -> str | None:
    """Record a heartbeat; returns the worker's state (`draining` asks it to stop)."""
    now = clock.now_ms()
    async with db.tx() as conn:
        rows = await conn.execute_fetchall(
            "UPDATE worker SET heartbeat_at = ? WHERE owner_id = ? RETURNING state", (now, owner_id)
        )
    rows = list(rows)
    return rows[0][0] if rows else None


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
            await append_event(conn, kind=EventKind.WORKER_STOPPED, actor=owner_id, target=owner_id,
                               data={"reason": reason}, now=now)


async def state_of(db: Database, owner_id: str) -> str | None:
    return await db.scalar("SELECT state FROM worker WHERE owner_id = ?", (owner_id,))
