"""Refused Chroma listeners, journaled: one `chroma.untrusted` row per listener, not one per retry.

A process that talks to the data dir's Chroma server checks every connection
(`backend.chroma.server.DataDirTrust`); what it refuses lands in its
context's `refusals`. Daemons and `rem up` journal them here, with the
target `chroma` (so the snapshot finds the newest through the target index),
once per URL and listener, and again every `REPEAT_MS` while it stays.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from backend.core import clock
from backend.core.errors import ChromaUntrusted
from backend.core.private import user_name
from backend.store.db import Database
from backend.store.events import EventKind, append_event

log = logging.getLogger("rem.refusals")

TARGET = "chroma"
REPEAT_MS = 300_000
# the newest journal row about Chroma's listener (event_target_idx: a seek)
LATEST_SQL = (
    "SELECT id, time, kind, actor, data FROM event "
    "WHERE target = 'chroma' AND session_id IS NULL ORDER BY id DESC LIMIT 1"
)


def refusal_data(exc: ChromaUntrusted) -> dict[str, Any]:
    """What a `chroma.untrusted` row records: where, who listens there, and the one-line reason."""
    return {
        "url": exc.url,
        "uids": list(exc.uids),
        "users": [user_name(uid) for uid in exc.uids],
        "pids": list(exc.pids),
        "error": str(exc),
    }


class RefusalJournal:
    """Journals a process's refusals, each listener once per `REPEAT_MS`."""

    def __init__(self, actor: str) -> None:
        self.actor = actor
        self._journaled: dict[tuple[str | None, tuple[int, ...]], int] = {}

    def due(self, refusals: list[ChromaUntrusted]) -> list[ChromaUntrusted]:
        """The refusals not journaled within `REPEAT_MS` (one per listener), marked as journaled."""
        now, found = clock.now_ms(), {}
        for exc in refusals:
            key = (exc.url, tuple(exc.uids))
            last = self._journaled.get(key)
            if last is None or now - last >= REPEAT_MS:
                found[key] = exc
        for key in found:
            self._journaled[key] = now
        return list(found.values())

    async def journal(self, db: Database, refusals: list[ChromaUntrusted]) -> int:
        """Journal (and log) the refusals that are due; how many rows were written."""
        due = self.due(refusals)
        for exc in due:
            log.error("%s refused the Chroma listener at %s: %s", self.actor, exc.url, exc)
            async with db.tx() as conn:
                await append_event(
                    conn,
                    kind=EventKind.CHROMA_UNTRUSTED,
                    actor=self.actor,
                    target=TARGET,
                    data=refusal_data(exc),
                )
        return len(due)


def describe(refused: Mapping[str, Any]) -> str:
    """One line for the operator: who listens where, that rem sent it nothing, and what to do."""
    users = refused.get("users") or []
    uids = refused.get("uids") or []
    who = (
        ", ".join(f"{u} (uid {i})" for u, i in zip(users, uids, strict=False)) or "a process not rem's server"
    )
    pids = refused.get("pids") or []
    shown = f", pid {', '.join(map(str, pids))}" if pids else ""
    return (
        f"Chroma listener refused: {who}{shown} listens on {refused.get('url')}, where rem's Chroma "
        "server was; rem sent it nothing and writes to Chroma only through its own server: stop that process"
    )
