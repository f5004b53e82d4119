"""The shared daemon loop: register, heartbeat, run passes, drain, stop.

A role subclasses `Daemon` and implements `run_pass` (one bounded unit of
work; returns how many items it handled) and, if it holds leases, keeps
them in `self.leases` (renewed by the daemon's upkeep) and implements
`hand_back` (release them so another worker can take over at once). SIGTERM
and SIGINT drain gracefully, exactly like `rem drain`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

from backend.core import clock, faults
from backend.core.errors import (
    ChromaUnreachable,
    ChromaUntrusted,
    DatabaseFull,
    DatabaseIOError,
    DatabaseLocked,
    DatabaseUnreachable,
    RemError,
)
from backend.core.settings import unsafe_switches
from backend.models import health
from backend.runtime.context import Context
from backend.runtime.idle import IdleWait
from backend.runtime.refusals import RefusalJournal
from backend.store import model_calls, workers
from backend.store.db import Database
from backend.store.lease_keeper import LeaseKeeper
from backend.store.workers import WorkerRole, WorkerState

MAX_BACKOFF_S = 5.0
# the upkeep loop's shortest sleep, and its wait after a failed heartbeat or renewal
UPKEEP_MIN_S = 0.05
UPKEEP_RETRY_S = 1.0
T = TypeVar("T")
# a dependency that is down for now: the pass is retried with backoff, nothing is lost
# (a corrupt database is not in here: it needs an operator, so the daemon stops with one line).
# A PostgreSQL store that went away (restart, failover) is one of them: the store reconnects
# before the next transaction, so the daemon waits it out instead of exiting for its supervisor
# to restart. At start too: a server that does not answer yet is waited for, with a line in the
# log at each attempt; a URL the server refuses (unknown database or role, bad password) fails
# at once, in one line.
TRANSIENT_ERRORS = (ChromaUnreachable, DatabaseLocked, DatabaseFull, DatabaseIOError, DatabaseUnreachable)


class Daemon:
    role: ClassVar[WorkerRole]
    # whether an idle wait listens to the store's commits (a role with no passes has nothing to wake)
    watches_store: ClassVar[bool] = True

    def __init__(self, ctx: Context, *, once: bool = False, owner_id: str | None = None) -> None:
        faults.validate()  # a typo in REM_FAULTS fails here, in one line, not inside a task
        self.ctx = ctx
        self.once = once
        self.owner_id = owner_id or workers.new_owner_id(self.role)
        self.log = logging.getLogger(f"rem.{self.role}")
        self.draining = asyncio.Event()
        self.db: Database
        self.registered = False  # in the worker registry (its row written): set by `run`
        self._heartbeat_task: asyncio.Task[None] | None = None
        # the leases this process holds: the upkeep loop renews them (`backend.store.fencing`)
        self.leases = LeaseKeeper()
        self._calls_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._model_failed = asyncio.Event()
        # what ends an idle wait: another process's commit, work falling due, the slow poll
        self.idle: IdleWait | None = None
        # a refused Chroma listener stops every write to Chroma (nothing is sent to it); this says so
        self._refusals = RefusalJournal(self.owner_id)

    # -- hooks for roles -------------------------------------------------
    async def run_pass(self) -> int:
        """Do one bounded unit of work; return the number of items handled."""
        raise NotImplementedError

    async def hand_back(self) -> None:
        """Release any lease still held (draining or shutting down)."""

    async def on_heartbeat(self) -> None:
        """Called every heartbeat; renews the held leases that are due (as the upkeep does between beats)."""
        await self.renew_leases()

    def info(self) -> dict[str, Any]:
        return {}

    # -- the loop ----------------------------------------------------------
    async def run(self) -> int:
        """Run until drained (or one pass with `once`); returns an exit code."""
        self.db = await self._open_store()
        await self._register()
        self.registered = True
        self.log.info("%s %s started", self.role, self.owner_id)
        self._install_signal_handlers()
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop())
        self._calls_task = asyncio.create_task(self._model_failures_loop())
        self.idle = IdleWait(self.db, self.role, self.ctx.data.root, self.log)
        if not self.once and self.watches_store:
            self.idle.start(self.ctx.db_url, self.db.server_pids)
        reason = "once" if self.once else "drained"
        try:
            await self._loop()
        except asyncio.CancelledError:
            reason = "cancelled"
            raise
        finally:
            await self._shutdown(reason)
        return 0

    async def _open_store(self) -> Database:
        """The state store; one that cannot be reached yet (a server restarting) is waited out."""
        return await self._until_done("open the store", self.ctx.db, (DatabaseUnreachable,))

    async def _register(self) -> None:
        """Join the worker registry, waiting out a locked or full database like any pass would."""
        unsafe = unsafe_switches()
        if unsafe:
            self.log.warning("%s runs with unsafe test switches %s", self.owner_id, unsafe)
        await self._until_done(
            "register",
            lambda: workers.register(self.db, self.owner_id, self.role, self.info(), unsafe=unsafe),
            TRANSIENT_ERRORS,
        )

    async def _until_done(
        self, what: str, attempt: Callable[[], Awaitable[T]], transient: tuple[type[Exception], ...]
    ) -> T:
        """`attempt()`, again with backoff after each transient error (`--once`: the error)."""
        backoff = 0.1
        while True:
            try:
                return await attempt()
            except transient as exc:
                if self.once:
                    raise
                self.log.warning(
                    "%s cannot %s yet: %s; retrying in %.1f s", self.owner_id, what, exc, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _loop(self) -> None:
        assert self.idle is not None
        backoff = 0.1
        while not self.draining.is_set():
            try:
                await self.idle.before_pass()  # a commit from here on wakes the idle wait after this pass
                handled = await self.run_pass()
                backoff = 0.1
                if self.once:
                    if handled == 0:
                        return
                    continue
                if handled == 0 and await self.idle.wait(self._wake, self.draining) == "changed":
                    await self._heard_drain()
            except TRANSIENT_ERRORS as exc:
                self.log.warning("%s: %s; retrying in %.1f s", self.owner_id, exc, backoff)
                if isinstance(exc, ChromaUntrusted):
                    self.ctx.note_refusal(exc)  # journaled once per listener, however many paths met it
                    await self.journal_refusals()
                if self.once:
                    raise
                await self._sleep_or_drain(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _heard_drain(self) -> None:
        """Another process committed: if it was a drain request for this worker, start draining now
        (not at the next heartbeat)."""
        if await workers.state_of(self.db, self.owner_id) == WorkerState.DRAINING:
            self._start_draining()

    def _start_draining(self) -> None:
        if not self.draining.is_set():
            self.log.info("%s asked to drain", self.owner_id)
            self.draining.set()

    @staticmethod
    async def _first_of(*events: asyncio.Event, timeout: float) -> None:
        waits = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _sleep_or_drain(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.draining.wait(), seconds)

    async def journal_refusals(self) -> None:
        """Journal the Chroma listeners this process refused since the last call (see `refusals`)."""
        taken = self.ctx.refusals[:]
        del self.ctx.refusals[: len(taken)]
        if not taken:
            return
        try:
            await self._refusals.journal(self.db, taken)
        except RemError as exc:  # the database is down too: the log line above says it all
            self.log.warning("%s could not journal a refused Chroma listener: %s", self.owner_id, exc)

    def wake(self) -> None:
        self._wake.set()

    async def _heartbeat_loop(self) -> None:
        """The daemon's upkeep: renew each held lease once a third of it is used, and beat
        (`worker.heartbeat_at`, the drain request) once a third of the liveness window is.

        Asleep in between: a daemon that holds nothing wakes once per beat, never
        on a short poll; taking a lease (`self.leases.hold`) wakes it to plan its renewal.
        """
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + workers.HEARTBEAT_INTERVAL_MS / 1000
        while True:
            await self._upkeep_wait(next_beat - loop.time())
            try:
                await self.renew_leases()
                if loop.time() >= next_beat:
                    next_beat = loop.time() + workers.HEARTBEAT_INTERVAL_MS / 1000
                    await self._beat()
            except RemError as exc:
                self.log.warning("%s heartbeat failed: %s", self.owner_id, exc)
                await asyncio.sleep(UPKEEP_RETRY_S)

    async def _upkeep_wait(self, until_beat_s: float) -> None:
        """Sleep until the next beat or the next lease renewal due, whichever is first."""
        wait = until_beat_s
        renewal = self.leases.next_renewal_at()
        if renewal is not None:
            wait = min(wait, (renewal - clock.now_ms()) / 1000)
        self.leases.changed.clear()
        await self._first_of(self.leases.changed, timeout=max(wait, UPKEEP_MIN_S))

    async def _beat(self) -> None:
        if await workers.beat(self.db, self.owner_id) == WorkerState.DRAINING:
            self._start_draining()
        await self.on_heartbeat()
        await self.journal_refusals()
        # model requests no step transaction carried (synthesis, embeddings, retries)
        await model_calls.flush(self.db, self.owner_id)

    async def renew_leases(self) -> None:
        """Renew the held leases that are a third used (one transaction); a lost one is marked `lost`."""
        for lease in await self.leases.renew_due(self.db):
            self.log.warning(
                "%s lost its %s lease %s (epoch %d): renewal found it gone",
                self.owner_id,
                lease.kind,
                lease.key,
                lease.epoch,
            )

    async def _model_failures_loop(self) -> None:
        """Write failed model requests as soon as they happen (the rest go with the heartbeat)."""
        loop = asyncio.get_running_loop()

        def notify() -> None:
            loop.call_soon_threadsafe(self._model_failed.set)

        health.on_failure.append(notify)
        try:
            while True:
                await self._model_failed.wait()
                self._model_failed.clear()
                try:
                    await model_calls.flush(self.db, self.owner_id)
                except RemError as exc:
                    self.log.warning("%s could not record model failures yet: %s", self.owner_id, exc)
        finally:
            health.on_failure.remove(notify)

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.request_stop)

    def request_stop(self) -> None:
        self.log.info("%s stopping (signal)", self.owner_id)
        self.draining.set()

    async def _shutdown(self, reason: str) -> None:
        for task in (self._heartbeat_task, self._calls_task):
            if task is None:
                continue
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.idle is not None:
            await self.idle.close()
            self.log.info("%s idle waits ended by: %s", self.owner_id, self.idle.stats)
        try:
            await self.hand_back()
            with contextlib.suppress(RemError):
                await model_calls.flush(self.db, self.owner_id)
        finally:
            await workers.mark_stopped(self.db, self.owner_id, reason)
            self.log.info("%s %s stopped (%s)", self.role, self.owner_id, reason)
