"""A small system of real `rem daemon` processes on one data dir, for the reliability suite.

The store is the test's: state.db in the data dir, or the PostgreSQL database
of `ctx.db_url` (every daemon and `rem check` then gets `--db URL`).

Leases are short (`LEASE_MS`) and the agent quick, so a crash is taken over
in about a second and a whole scenario settles in a few. Settling is decided
by `ops.check` (no violation, nothing in flight), the final verdict by the
real `rem check --settled --json`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend import ops
from backend.execution import sessions
from backend.runtime.context import Context
from backend.store.postgres import PgConnection
from tests.helpers import await_until, rem_env, run_rem, spawn_rem

LEASE_MS = 1500
AGENT_DELAY_MS = 60
ROLES = ("executor", "summarizer", "dream")

# a few sessions with queued turns and a steer, enough for every role to have work
WORK = [
    ("s1", "Why did the Invoice Service fail after the Stripe webhooks change?", "queue"),
    ("s1", "Actually, keep it short.", "steer"),
    ("s1", "Summarise what Maria said about the nightly ledger export.", "queue"),
    ("s2", "What should Ken check first if the synonym dictionary is late?", "queue"),
]


async def await_settled(
    ctx: Context,
    timeout: float,
    *,
    interval: float = 0.5,
    tail: Callable[[], str] = lambda: "",
    what: str = "the system",
) -> dict[str, Any]:
    """Poll `ops.check` in process (cheap) until it finds no violation and nothing in flight; its
    last report. On the deadline: an AssertionError with that report and `tail()` (the logs)."""
    last: dict[str, Any] = {}

    async def quiet() -> bool:
        last.clear()
        last.update(await ops.check(ctx))
        return bool(last["ok"] and last["counts"]["unsettled"] == 0)

    try:
        await await_until(quiet, timeout=timeout, interval=interval, message=f"{what} to settle")
    except AssertionError:
        raise AssertionError(
            f"not settled after {timeout} s: {json.dumps(last, indent=1)[:4000]}\n" + tail()
        ) from None
    return last


@dataclass
class Rig:
    """Daemons of one data dir, started and stopped by a test."""

    ctx: Context
    chroma_url: str | None
    logs: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.ctx.data.root

    @property
    def db_url(self) -> str | None:
        return self.ctx.db_url

    def env(self, **extra: str) -> dict[str, str]:
        settings = {
            "REM_EXECUTION_LEASE_MS": str(LEASE_MS),
            "REM_SUMMARY_LEASE_MS": str(LEASE_MS),
            "REM_DREAM_LEASE_MS": str(LEASE_MS),
            "REM_AGENT_DELAY_MS": str(AGENT_DELAY_MS),
            "REM_DREAM_CHUNK_ROWS": "10",
            "REM_CHROMA_AUTOSTART": "0",
            "REM_LOG": "1",
            "REM_CHROMA_COLLECTION": self.ctx.collection,
        }
        env = rem_env(**{**settings, **self.extra_env, **extra})
        env.pop("REM_DB_URL", None)  # the store is named by `--db` alone (see `command`)
        return env

    def args(self) -> list[str]:
        url = ["--chroma-url", self.chroma_url] if self.chroma_url else []
        return ["--data", str(self.root), *url]

    def command(self, name: str, *args: str) -> list[str]:
        """`rem [--db URL] NAME ARGS... --data DIR [--chroma-url URL]` (`--db` is a global option)."""
        db = ["--db", self.db_url] if self.db_url else []
        return [*db, name, *args, *self.args()]

    def spawn(self, role: str, name: str | None = None, **env: str) -> subprocess.Popen[bytes]:
        """Start `rem daemon --role ROLE` (its output goes to logs/NAME.log)."""
        log = self.logs / f"{name or role}-{len(self.procs)}.log"
        proc = spawn_rem(*self.command("daemon", "--role", role), env=self.env(**env), log=log)
        self.procs.append((role, proc, log))
        return proc

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        path = next(log for _, p, log in self.procs if p is proc)
        return path.read_text(errors="replace")

    async def wait_exit(self, proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
        try:
            return await asyncio.to_thread(proc.wait, timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"pid {proc.pid} still running after {timeout} s:\n{self.log_of(proc)}"
            ) from None

    def alive(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        return [(role, p) for role, p, _ in self.procs if p.poll() is None]

    async def admit(self, work: list[tuple[str, str, str]] = WORK) -> None:
        db = await self.ctx.db()
        for sid, text, delivery in work:
            await sessions.admit(db, sid, text, delivery=delivery)

    async def settle(self, timeout: float = 60) -> dict[str, Any]:
        """Wait until `ops.check` finds no violation and nothing in flight."""
        report: dict[str, Any] = await await_settled(self.ctx, timeout, interval=0.25, tail=self.tail_logs)
        return report

    async def stop(self) -> None:
        """SIGTERM every live daemon; each must drain and exit 0."""
        live = self.alive()
        for _, proc in live:
            proc.send_signal(signal.SIGTERM)
        for role, proc in live:
            code = await self.wait_exit(proc, 30)
            assert code == 0, f"{role} pid {proc.pid} exited {code}:\n{self.log_of(proc)[-3000:]}"

    def kill_all(self) -> None:
        for _, proc in self.alive():
            proc.kill()
            proc.wait(10)

    def tail_logs(self, chars: int = 1500) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}"
            for _, _, log in self.procs
            if log.exists()
        )

    def check_cli(self, expect_rc: int = 0, *extra: str) -> dict[str, Any]:
        """The real `rem check --settled --json` against this data dir."""
        proc = run_rem(*self.command("check", "--settled", "--json", *extra), env=self.env())
        assert "Traceback" not in proc.stderr, proc.stderr
        report = json.loads(proc.stdout)
        assert proc.returncode == expect_rc, json.dumps(report["violations"], indent=1)[:4000]
        return report

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Rows of `sql` read from the store the daemons write (a connection of its own)."""
        if self.db_url:
            pg = PgConnection(self.db_url)
            try:
                return pg.execute(sql, params).fetchall()
            finally:
                pg.close()
        with contextlib.closing(sqlite3.connect(self.root / "state.db", timeout=10)) as conn:
            return conn.execute(sql, params).fetchall()

    def events(self, kind: str) -> list[dict[str, Any]]:
        rows = self.query(
            "SELECT id, actor, session_id, target, data FROM event WHERE kind = ? ORDER BY id", (kind,)
        )
        return [
            {"id": i, "actor": a, "session_id": s, "target": t, "data": json.loads(d or "{}")}
            for i, a, s, t, d in rows
        ]
