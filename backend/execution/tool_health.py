"""The executor's tool-source health in its worker row, so `rem status` in any process sees it.

Each source's health lives in the executor's memory (`backend.tools.health`:
each executor starts its own servers). What an operator needs of it (up or
down, the one-line error, since when) is recorded in the executor's worker
row, as `worker.info`'s `tool_servers` list, and only when it changes: the
registry's `health_changes` counter is compared first (one int, at each
step, each call and each heartbeat), and the records built from `health()`
are written only when they differ from the last ones written. A source that
is starting, not used yet or closed keeps its last record (none yet: it is
not listed). `since` is when the source last went up or down, not when its
error text last changed. The status snapshot lists the records of live
executors (`backend.ops.tool_status`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from backend.core.errors import RemError
from backend.store import workers
from backend.store.db import Database

if TYPE_CHECKING:  # the MCP SDK loads only when tools are configured
    from backend.tools.health import ServerHealth
    from backend.tools.registry import ToolRegistry

INFO_KEY = "tool_servers"


class ServerRecord(TypedDict):
    """One tool source as its executor last recorded it."""

    server: str
    up: bool
    error: str | None  # why it is down, in one line (None: up)
    since: int  # when it last went up or down (Unix time in ms)


def server_record(health: ServerHealth) -> ServerRecord | None:
    """What is recorded of a source's health (None: starting, not used yet, or closed)."""
    if health["state"] not in ("up", "down"):
        return None
    up = health["state"] == "up"
    error = None if up else health["last_error"] or "down"
    return {"server": health["server"], "up": up, "error": error, "since": health["since"]}


def merged(recorded: Mapping[str, ServerRecord], health: list[ServerHealth]) -> dict[str, ServerRecord]:
    """The records to keep: each source's new one, its `since` kept while it stays up (or down)."""
    out: dict[str, ServerRecord] = {}
    for source in health:
        name = source["server"]
        record, before = server_record(source), recorded.get(name)
        if record is None:
            if before is not None:
                out[name] = before
            continue
        if before is not None and before["up"] == record["up"]:
            record["since"] = before["since"]
        out[name] = record
    return out


class ToolHealthRecorder:
    """Writes the registry's health to this executor's worker row when it changed."""

    def __init__(
        self,
        db: Callable[[], Database],
        owner_id: str,
        info: Callable[[], dict[str, Any]],
        log: logging.Logger,
        registered: Callable[[], bool] = lambda: True,
    ) -> None:
        self._db = db
        self._registered = registered  # whether the worker row is there to write to
        self.owner_id = owner_id
        self._info = info  # the rest of the row's info (what the worker registered with)
        self.log = log
        self.recorded: dict[str, ServerRecord] = {}
        self._seen: int | None = None
        self._lock = asyncio.Lock()

    async def record(self, registry: ToolRegistry) -> None:
        """Record the sources' health if it changed since the last write (nothing written otherwise)."""
        if registry.health_changes == self._seen or not self._registered():
            return  # unchanged; or no worker row yet (its first heartbeat records it)
        async with self._lock:  # one writer at a time: the last write holds the newest health
            seen = registry.health_changes
            if seen == self._seen:
                return
            records = merged(self.recorded, registry.health())
            if records != self.recorded:
                info = {**self._info(), INFO_KEY: list(records.values())}
                try:
                    await workers.record_info(self._db(), self.owner_id, info)
                except RemError as exc:  # tried again at the next check (the heartbeat's at the latest)
                    self.log.warning("%s could not record its tool servers' health: %s", self.owner_id, exc)
                    return
                self.recorded = records
            self._seen = seen
