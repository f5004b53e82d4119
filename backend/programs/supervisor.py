"""`rem up`: the Chroma server and the daemons of one data dir, kept running.

Each daemon is a `rem daemon --role R` child process. A child that dies (a
crash, or a SIGKILL in a drill) is seen at once (SIGCHLD wakes the
supervisor), recorded dead in `worker` right away (`exited_at`: `rem
status`, the console and a release's confirmation say so within the
second), and restarted with backoff. Unless `reap` is off it is also marked
stopped, which lets its leases be taken over without waiting for them to
expire (fencing keeps that safe); with `reap` off its leases count down to
expiry, or an operator releases them, as a death on another machine would.
The Chroma server is restarted on its old port when it dies.

Idle, the supervisor sleeps: a child's death (SIGCHLD), a commit that
journaled something (the operator journal's head is recorded as it moves;
see `backend.runtime.idle`), a restart or housekeeping falling due, or the
slow fallback poll (`REM_DAEMON_IDLE_POLL_MS`, which also looks at a Chroma
server that is not its child) wake it. Children get SIGTERM when the supervisor dies, so no
process outlives `rem up`. On SIGTERM/Ctrl-C every daemon is drained (it
finishes or hands back its work and releases its leases) before exit.

`up.json` in the data dir lists the live children for drills and the demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from backend.chroma import server as chroma_server
from backend.chroma.server import ChromaServer
from backend.core import faults, private, processes
from backend.core.errors import ChromaUnreachable, Refused, RemError
from backend.core.settings import settings
from backend.programs.load import LoadGenerator
from backend.programs.recorder import HistoryRecorder
from backend.runtime.context import Context
from backend.runtime.idle import IdleWait
from backend.runtime.refusals import RefusalJournal
from backend.store import maintenance, workers
from backend.store.journal_head import HeadRecorder

log = logging.getLogger("rem.supervisor")

DRAIN_TIMEOUT_S = 20.0
# the operator journal's head is recorded at most this often while commits keep coming
JOURNAL_HEAD_GAP_S = 0.2
# a store that cannot be read (a PostgreSQL restart) is looked at again this often
STORE_RETRY_S = 1.0
MAX_RESTART_BACKOFF_S = 5.0
# the share of the synthetic load's inputs that ask for a tool when REM_MCP_CONFIG is set
LOAD_TOOL_RATIO = 0.3


@dataclass
class Child:
    """One daemon process the supervisor keeps alive."""

    role: str
    index: int
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    next_start: float = 0.0
    exits: list[dict[str, Any]] = field(default_factory=list)
    identity: dict[str, Any] = field(default_factory=dict)  # pid and start time of the live process

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None


@dataclass
class UpConfig:
    executors: int = 2
    summarizers: int = 1
    dreams: int = 1
    load: bool = False
    load_sessions: int = 6
    load_rate: float = 1.0
    # record a dead child as stopped at once, so its leases are taken over without
    # waiting for expiry; off, a kill looks as it would on another machine (the
    # lease counts down, or an operator releases it): what the demo shows
    reap: bool = True
    # record the status history the console's timeline reads (history.db)
    history: bool = True
    env: dict[str, str] = field(default_factory=dict)
    # `rem up --serve HOST:PORT`: one API server (`rem serve`) there, kept alive like the daemons
    serve: str | None = None
    allow_remote: bool = False


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exited with code {code}"


class Supervisor:
    """Runs and watches the Chroma server and the daemons of one data dir."""

    def __init__(self, ctx: Context, config: UpConfig | None = None, *, up_lock: int | None = None) -> None:
        self.ctx = ctx
        self.config = config or UpConfig()
        self.children = [
            Child(role, i)
            for role, count in (
                ("executor", self.config.executors),
                ("summarizer", self.config.summarizers),
                ("dream", self.config.dreams),
                ("server", int(self.config.serve is not None)),
            )
            for i in range(1, count + 1)
        ]
        self.chroma: ChromaServer | None = None
        # DATA/up.lock's descriptor, flocked while this `rem up` runs (hold_up_lock; taken in run if None)
        self._up_lock = up_lock
        self._identity = processes.identity(os.getpid())
        self._chroma_identity: dict[str, Any] = {}
        self.stopping = asyncio.Event()
        self.load_stop = asyncio.Event()
        self.child_exited = asyncio.Event()  # SIGCHLD: a child (a daemon, the Chroma server) changed state
        self._host = workers.host_name()
        self._refusals = RefusalJournal("supervisor")
        # the operator journal's head, recorded outside the store as it moves (`rem check` compares)
        self._journal_head = HeadRecorder(ctx.data, ctx.store_name)

    # -- lifecycle -------------------------------------------------------
    async def run(self) -> int:
        """Start everything, keep it alive until asked to stop, then drain it all."""
        faults.validate()  # refuse a typo before any child starts (they would crash-loop on it)
        if self._up_lock is None:
            self._up_lock = hold_up_lock(self.ctx)
        db = await self.ctx.db()
        self._install_signal_handlers()
        self._ensure_chroma()
        for child in self.children:
            self._start(child)
        self._write_manifest()
        load_task = asyncio.create_task(self._run_load()) if self.config.load else None
        recorder_stop = asyncio.Event()
        recorder = asyncio.create_task(self._run_recorder(recorder_stop)) if self.config.history else None
        idle = IdleWait(db, "supervisor", self.ctx.data.root, log, min_gap_s=JOURNAL_HEAD_GAP_S)
        idle.start(self.ctx.db_url, db.server_pids)
        next_housekeeping = time.monotonic() + maintenance.CHECKPOINT_EVERY_S
        try:
            why = "start"
            while not self.stopping.is_set():
                try:
                    await idle.before_pass()
                    await self._monitor(db, journal=why in ("start", "changed", "poll"))
                    if time.monotonic() >= next_housekeeping:
                        next_housekeeping = time.monotonic() + maintenance.CHECKPOINT_EVERY_S
                        await self._housekeeping(db)
                    why = await idle.wait(
                        self.child_exited, self.stopping, within_s=self._next_due_s(next_housekeeping)
                    )
                except RemError as exc:  # a store restarting: the fleet stays up, the supervisor looks again
                    why = await self._store_unreadable(exc)
        finally:
            await idle.close()
            if load_task is not None:
                load_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await load_task
            await self._drain_all()
            if recorder is not None:  # one last snapshot: the drained state
                recorder_stop.set()
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                    await asyncio.wait_for(recorder, 10)
            self._stop_chroma()
            with contextlib.suppress(FileNotFoundError):
                self.manifest_path.unlink()
            os.close(self._up_lock)  # after the manifest is gone: the next `rem up` may start
            self._up_lock = None
        return 0

    async def _store_unreadable(self, exc: RemError) -> str:
        """Wait a moment after the store could not be read (a PostgreSQL restart, a locked state.db),
        restarting any child that exited meanwhile; rem up never stops over it."""
        log.warning("supervisor: cannot read the store: %s; looking again in %.0f s", exc, STORE_RETRY_S)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), STORE_RETRY_S)
        return "poll"

    def request_stop(self) -> None:
        self.stopping.set()

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.request_stop)
        # SIGUSR1 stops only the synthetic load (drills use it to let the system settle)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGUSR1, self.load_stop.set)
        # a child's death wakes the monitor at once, instead of a poll finding it
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGCHLD, self.child_exited.set)

    def _next_due_s(self, next_housekeeping: float) -> float:
        """Seconds until a restart or the housekeeping falls due."""
        now = time.monotonic()
        dues = [next_housekeeping] + [c.next_start for c in self.children if c.proc is None]
        return max(0.0, min(dues) - now)

    # -- Chroma ------------------------------------------------------------
    def _ensure_chroma(self) -> None:
        if self.ctx.chroma_url or settings.chroma_url:
            self.chroma = chroma_server.resolve(self.ctx.data, self.ctx.chroma_url)
            return
        # blocking on purpose, in the main thread: PDEATHSIG binds to the spawning thread
        self.chroma = chroma_server.resolve(self.ctx.data, start=True)
        log.info(
            "chroma at %s (pid %s, started here: %s)",
            self.chroma.url,
            self.chroma.pid,
            self.chroma.started_here,
        )

    def _chroma_dead(self) -> bool:
        server = self.chroma
        if server is None or server.external:
            return False
        if server.process is not None:
            return server.process.poll() is not None
        return not chroma_server.lock_is_held(self.ctx.data)

    async def _journal_port_taken(self, db: Any, old_url: str | None) -> None:
        """The old port held by something else made the restart move: journal what holds it."""
        if old_url is None or (self.chroma is not None and self.chroma.url == old_url):
            return
        refusal = chroma_server.listener_refusal(self.ctx.data, old_url)
        if refusal is not None:
            with contextlib.suppress(RemError):
                await self._refusals.journal(db, [refusal])

    def _stop_chroma(self) -> None:
        if self.chroma is not None and self.chroma.started_here:
            self.chroma.stop()

    # -- children --------------------------------------------------------------
    def _command(self, child: Child) -> list[str]:
        """The child's `rem` arguments (the state store's URL goes in its environment, never here)."""
        args = ["daemon", "--role", child.role, "--data", str(self.ctx.data.root)]
        if child.role == "server":  # `rem serve`: a worker of its own kind, on its fixed address
            assert self.config.serve is not None
            args = ["serve", "--listen", self.config.serve, "--data", str(self.ctx.data.root)]
            args += ["--allow-remote"] if self.config.allow_remote else []
        if self.chroma is not None and self.chroma.external:
            args += ["--chroma-url", self.chroma.url]
        return args

    def _start(self, child: Child) -> None:
        log_file = self.ctx.data.logs / f"{child.name}.log"  # kept under REM_LOG_MAX_BYTES by the child
        env = {
            "REM_CHROMA_AUTOSTART": "0",
            "REM_LOG": "1",
            "REM_LOG_FILE": str(log_file),
            **self.ctx.store_env(),
            **self.config.env,
        }
        command = processes.rem_child(*self._command(child), cwd=self.ctx.data.root, env=env)
        with self.ctx.data.open_log(log_file.name) as out:
            child.proc = command.popen(
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=private.private_child_dying_with_parent,
            )
        child.started_at = time.monotonic()
        child.identity = processes.identity(child.proc.pid)
        log.info("started %s pid %s", child.name, child.proc.pid)

    async def _monitor(self, db: Any, *, journal: bool = True) -> None:
        """Restart what died and record each death; `journal`: record the operator journal's head too."""
        changed = False
        if self._chroma_dead():
            log.warning("chroma server died; restarting it")
            before = self.chroma.url if self.chroma is not None else None
            try:
                self._ensure_chroma()
                changed = True
            except ChromaUnreachable as exc:
                log.error("cannot restart chroma: %s", exc)
            await self._journal_port_taken(db, before)
        if journal:
            with contextlib.suppress(RemError):  # the database is down: recorded on a later tick
                await self._journal_head.record(db)
        if await self._restart_children(db) or changed:
            self._write_manifest()

    async def _restart_children(self, db: Any) -> bool:
        """Record each child that exited, start each one due; whether any changed."""
        changed = False
        now = time.monotonic()
        for child in self.children:
            proc = child.proc
            if proc is not None and proc.poll() is not None:
                await self._record_exit(db, child, proc)
                child.proc = None
                changed = True
            if child.proc is None and now >= child.next_start and not self.stopping.is_set():
                self._start(child)
                child.restarts += 1
                changed = True
        return changed

    async def _run_recorder(self, stop: asyncio.Event) -> None:
        chroma_url = self.chroma.url if self.chroma is not None and self.chroma.external else None
        try:
            await HistoryRecorder(self.ctx.data, chroma_url=chroma_url, db_url=self.ctx.db_url).run(stop)
        except Exception:  # the history is for post-mortems: losing it must not stop rem up
            log.exception("status history recorder stopped")

    async def _housekeeping(self, db: Any) -> None:
        try:
            result = await maintenance.run_once(db)
            log.info("housekeeping: %s", result)
        except RemError as exc:  # a locked or full database: try again next interval
            log.warning("housekeeping skipped: %s", exc)

    async def _record_exit(self, db: Any, child: Child, proc: subprocess.Popen[bytes]) -> None:
        reason = describe_exit(proc.returncode)
        uptime = time.monotonic() - child.started_at
        child.exits.append({"pid": proc.pid, "reason": reason, "at": time.time()})
        # a child that keeps dying right after start backs off instead of spinning
        backoff = 0.0 if uptime > 10 else min(MAX_RESTART_BACKOFF_S, 0.5 * 2 ** min(child.restarts, 4))
        child.next_start = time.monotonic() + backoff
        log.warning("%s pid %s %s; restarting in %.1f s", child.name, proc.pid, reason, backoff)
        # dead in the store at once, reaped or not (`reap` only decides whether its leases wait)
        with contextlib.suppress(Exception):
            await workers.mark_exited(db, proc.pid, self._host, reason, reap=self.config.reap)

    async def _drain_all(self) -> None:
        live = [c for c in self.children if c.pid is not None]
        for child in live:
            with contextlib.suppress(ProcessLookupError):
                assert child.proc is not None
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while any(c.proc is not None and c.proc.poll() is None for c in live):
            if time.monotonic() > deadline:
                for child in live:
                    if child.proc is not None and child.proc.poll() is None:
                        log.warning("%s did not drain in %.0f s; killing it", child.name, DRAIN_TIMEOUT_S)
                        child.proc.kill()
                break
            await asyncio.sleep(0.05)
        for child in live:
            if child.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(5)

    # -- manifest and load -----------------------------------------------------
    @property
    def manifest_path(self) -> Any:
        return self.ctx.data.root / "up.json"

    def manifest(self) -> dict[str, Any]:
        """`up.json`: every process with its pid *and* start time, so nobody signals a reused pid."""
        chroma_pid = self.chroma.pid if self.chroma else None
        if not self._chroma_identity or chroma_pid != self._chroma_identity["pid"]:
            self._chroma_identity = processes.identity(chroma_pid)
        return {
            **self._identity,
            "reap": self.config.reap,
            "chroma": {
                "url": self.chroma.url if self.chroma else None,
                **self._chroma_identity,
                "external": bool(self.chroma and self.chroma.external),
            },
            "children": [_child_manifest(c) for c in self.children],
        }

    def _write_manifest(self) -> None:
        private.write_private_text(self.manifest_path, json.dumps(self.manifest(), indent=2))

    async def _run_load(self) -> None:
        generator = LoadGenerator(
            self.ctx,
            sessions=self.config.load_sessions,
            rate=self.config.load_rate,
            # with agent tools configured, a share of the inputs ask for a note or a send
            tool_ratio=LOAD_TOOL_RATIO if settings.mcp_config is not None else 0.0,
        )
        stop = asyncio.Event()

        async def either() -> None:
            await asyncio.wait(
                [asyncio.create_task(self.stopping.wait()), asyncio.create_task(self.load_stop.wait())],
                return_when=asyncio.FIRST_COMPLETED,
            )
            stop.set()

        watcher = asyncio.create_task(either())
        try:
            await generator.run(stop)
        finally:
            watcher.cancel()
        log.info("load stopped after %d inputs", generator.sent)


def hold_up_lock(ctx: Context) -> int:
    """`DATA/up.lock`, flocked for this `rem up`'s life: a second `rem up` on the data dir is refused
    (it would start a second fleet, write its own `up.json` over the first's, and remove it on exit).
    The kernel drops the lock when the process dies, SIGKILL included."""
    ctx.data.ensure()
    path = ctx.data.root / UP_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, private.FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        live = read_manifest(ctx)
        who = f" (pid {live['pid']})" if live else ""
        raise Refused(
            f"another `rem up`{who} runs on data dir {ctx.data.root}; stop it first (Ctrl-C in its "
            "terminal), or start this one with another --data"
        ) from None
    return fd


UP_LOCK = "up.lock"


def read_manifest(ctx: Context) -> dict[str, Any] | None:
    """The live `rem up` manifest of a data dir: None unless its supervisor is still that very process.

    A stale `up.json` (its `rem up` was SIGKILLed) may name a pid the kernel
    has since given to something else; the recorded start time tells them apart.
    """
    try:
        manifest = json.loads(ctx.data.up_manifest.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    return manifest if processes.same_process(manifest.get("pid"), manifest.get("started_at")) else None


__all__ = ["Supervisor", "UpConfig", "read_manifest", "workers"]


def _child_manifest(child: Child) -> dict[str, Any]:
    """One child's entry in `up.json`."""
    return {
        "name": child.name,
        "role": child.role,
        "pid": child.pid,
        "started_at": child.identity.get("started_at") if child.pid else None,
        "restarts": child.restarts,
    }
