"""The test suite's PgBouncer: Debian's `pgbouncer` binary (1.18) in transaction mode, in front of a test
PostgreSQL server, on a unix socket of its own.

Started like the test servers (`backend.programs.postgres_server`): a direct child that dies with
the process that started it, and, as root, inside a user namespace (PgBouncer refuses to run as
root). Its pool is small on purpose (`POOL_SIZE` server connections per database and user), so
rem's connections share server sessions between transactions, as on a managed pooler: a statement
prepared or a setting made in one transaction is not there in the next. It passes no startup
options through (no `ignore_startup_parameters`): a client that sends `-c ...` is refused.

`.ci/run` installs the package; without the binary the tests skip locally and fail in CI.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

from backend.programs import postgres_server
from backend.programs.postgres_server import LocalPostgres

BINARY = "/usr/sbin/pgbouncer"
PORT = 6432  # with a unix socket only, the port just names the socket file
POOL_SIZE = 3


@dataclass
class Bouncer:
    """A running PgBouncer: `url(dbname)` reaches `dbname` on the server behind it."""

    root: Path
    process: subprocess.Popen[bytes]

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@/{dbname}?host={quote(str(self.root), safe='/')}&port={PORT}"

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # immediate shutdown
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def binary() -> str:
    """The pgbouncer binary; skips locally (fails in CI) without it."""
    found = BINARY if os.path.exists(BINARY) else shutil.which("pgbouncer")
    if found is None:
        if os.environ.get("CI"):
            raise RuntimeError("no pgbouncer binary: apt-get install pgbouncer (.ci/run does)")
        pytest.skip("no pgbouncer binary: apt-get install pgbouncer")
    return found


def start(server: LocalPostgres, *, pool_size: int = POOL_SIZE, max_clients: int = 500) -> Bouncer:
    """PgBouncer in transaction mode in front of `server`, ready to take connections."""
    command = binary()
    root = Path(tempfile.mkdtemp(prefix="rem-pgb-"))
    root.chmod(0o777)  # the bouncer runs as another uid (namespace or nobody)
    (root / "users.txt").write_text('"postgres" ""\n')
    (root / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={server.sockdir} port={postgres_server.PG_PORT}

[pgbouncer]
listen_addr =
listen_port = {PORT}
unix_socket_dir = {root}
auth_type = trust
auth_file = {root}/users.txt
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = {max_clients}
logfile = {root}/pgbouncer.log
pidfile = {root}/pgbouncer.pid
admin_users = postgres
"""
    )
    for path in root.iterdir():
        path.chmod(0o666)
    method = postgres_server._method()
    process = subprocess.Popen(
        postgres_server._as_non_root([command, str(root / "pgbouncer.ini")], method),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=postgres_server._die_with_parent,
    )
    bouncer = Bouncer(root, process)
    deadline = time.monotonic() + 30
    while not (root / f".s.PGSQL.{PORT}").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            error = process.stderr.read().decode(errors="replace") if process.stderr else ""
            bouncer.stop()
            raise RuntimeError(f"pgbouncer did not start: {error or bouncer.log()}")
        time.sleep(0.02)
    return bouncer
