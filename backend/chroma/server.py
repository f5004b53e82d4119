"""The Chroma server lifecycle: one `chroma run` per data dir, guarded by a file lock.

Chroma is not process-safe as an embedded `PersistentClient`, so rem runs it
as a server and every process talks to it over HTTP. The lock protocol:

* `chroma.lock` is `flock`ed by whoever starts a server, and the lock's open
  file description is inherited by the `chroma run` child, whose parent then
  drops its own copy. So the lock is held exactly while that server lives,
  and the kernel releases it when the server dies, even by SIGKILL.
* `chroma.url` records where the live server listens. A reader trusts it only
  if the lock is held (and the lock names that URL), the socket listening
  there belongs to this user (`trust.check_listener`) *and* it answers
  Chroma's heartbeat, in that order, so a stranger's socket is sent nothing;
  another uid's listener is refused in one line. The same holds for every new
  connection a client opens later (`verify_connection`, called by
  `ChromaStore` before a request goes out on it): after the server dies,
  whatever listens on its port is not it, whoever owns it. A stale file (no lock, no answer)
  means the reader takes the lock and starts a fresh server (on the
  same port when it is free, so clients that cached the URL keep working).
* `--chroma-url` / `REM_CHROMA_URL` bypass all of this for an external server.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from backend.chroma import auth, trust
from backend.core import private, processes
from backend.core.datadir import DataDir
from backend.core.errors import ChromaStartFailed, ChromaUnreachable, ChromaUntrusted, NotChroma, UsageError
from backend.core.settings import settings

log = logging.getLogger("rem.chroma_server")

HEARTBEAT_PATH = "/api/v2/heartbeat"
START_TIMEOUT_S = 60.0


def external_url(explicit: str | None = None) -> str | None:
    """The external Chroma URL from `--chroma-url` or `REM_CHROMA_URL`, if any."""
    url = explicit or settings.chroma_url
    if url is None:
        return None
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UsageError(f"--chroma-url {url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000")
    return url.rstrip("/")


def heartbeat(url: str, timeout: float = 2.0) -> int:
    """Chroma's heartbeat in ns; raises ChromaUnreachable naming what is wrong."""
    try:
        with urllib.request.urlopen(url + HEARTBEAT_PATH, timeout=timeout) as resp:
            body = resp.read(4096)
    except urllib.error.HTTPError as exc:
        raise NotChroma(
            f"{url} answered HTTP {exc.code} to Chroma's heartbeat; it is not a Chroma server "
            "(check --chroma-url)"
        ) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ChromaUnreachable(
            f"Chroma at {url} is unreachable ({reason}); start it with `rem up` or check --chroma-url"
        ) from exc
    return _heartbeat_ns(url, body)


def _heartbeat_ns(url: str, body: bytes) -> int:
    """The nanoseconds in a heartbeat reply; NotChroma when the reply is not Chroma's."""
    try:
        return int(json.loads(body)["nanosecond heartbeat"])
    except (ValueError, KeyError, TypeError) as exc:
        raise NotChroma(
            f"{url} is not a Chroma server (its heartbeat reply is not Chroma's); check --chroma-url"
        ) from exc


def is_alive(url: str, timeout: float = 1.0) -> bool:
    try:
        heartbeat(url, timeout)
    except ChromaUnreachable:
        return False
    return True


def chroma_binary() -> str:
    """The `chroma` executable of the environment rem runs in."""
    sibling = Path(sys.executable).parent / "chroma"
    if sibling.exists():
        return str(sibling)
    found = shutil.which("chroma")
    if found:
        return found
    raise ChromaStartFailed(
        "the `chroma` executable was not found next to Python or on PATH; "
        "reinstall rem (`pip install -e .`) so chromadb is installed"
    )


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ChromaServer:
    """A handle on the Chroma server a process uses (started by it or not)."""

    url: str
    data: DataDir | None = None
    process: subprocess.Popen[bytes] | None = None
    external: bool = False
    started_here: bool = field(default=False)

    @property
    def pid(self) -> int | None:
        if self.process is not None:
            return self.process.pid
        pid = read_lock_info(self.data).get("pid") if self.data else None
        return pid if isinstance(pid, int) else None

    def alive(self) -> bool:
        """Answering; and, for a data dir's server this process did not start, still its server.

        Raises ChromaUntrusted when something else now listens on its port (the
        server died and another process took the port over), before sending it
        anything: the heartbeat comes after the check.
        """
        if self.process is not None:
            return self.process.poll() is None and is_alive(self.url)
        if (
            not self.external
            and self.data is not None
            and not verify_listener(self.data, self.url, absent_ok=True)
        ):
            return False  # nothing listens there: down
        return is_alive(self.url)

    def verify_connection(self, sock: socket.socket) -> None:
        """Refuse a new connection to this server whose other end is not it (see `verify_connection`)."""
        if not self.external and self.data is not None:
            verify_connection(self.data, self.url, sock)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server if this process started it (SIGTERM, then SIGKILL)."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
        log.info("stopped chroma server pid %s at %s", proc.pid, self.url)
        if self.data is not None:
            with contextlib.suppress(FileNotFoundError):
                if self.data.chroma_url_file.read_text().strip() == self.url:
                    self.data.chroma_url_file.unlink()


def read_lock_info(data: DataDir) -> dict[str, object]:
    try:
        info = json.loads(data.chroma_lock.read_text() or "{}")
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def lock_is_held(data: DataDir) -> bool:
    """True while some process holds `chroma.lock` (a server is alive or starting)."""
    try:
        fd = os.open(data.chroma_lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def recorded_url(data: DataDir) -> str | None:
    try:
        return data.chroma_url_file.read_text().strip() or None
    except OSError:
        return None


def lock_names(data: DataDir, url: str) -> bool:
    """Whether the lock is held by the server of `url` (a lock that names no URL names any)."""
    if not lock_is_held(data):
        return False
    recorded = read_lock_info(data).get("url")
    return not isinstance(recorded, str) or recorded == url


def _not_its_server(data: DataDir, url: str) -> ChromaUntrusted:
    held = lock_is_held(data)
    why = (
        f"chroma.lock names {read_lock_info(data).get('url')}"
        if held
        else "chroma.lock is free: the server rem started there is gone"
    )
    return ChromaUntrusted(
        f"the process listening on {url} is not this data dir's Chroma server ({why}); rem sends "
        "it nothing and waits for `rem up` to start one (stop that process if it stays)",
        url=url,
        pids=tuple(trust.listener_pids(urlparse(url).port or 0)),
    )


def verify_listener(data: DataDir, url: str, *, absent_ok: bool = False) -> bool:
    """Refuse `url` unless its listener is this user's and it is the server that holds the data dir's lock.

    `absent_ok`: nothing listening is answered False instead of refused.
    """
    if not trust.check_listener(url, absent_ok=absent_ok):
        return False
    if not lock_names(data, url):
        raise _not_its_server(data, url)
    return True


def verify_connection(data: DataDir, url: str, sock: socket.socket) -> None:
    """Refuse a new connection to the data dir's server at `url` unless the other end is still it."""
    trust.verify_connection(sock, url)
    if not lock_names(data, url):
        raise _not_its_server(data, url)


def listener_refusal(data: DataDir, url: str) -> ChromaUntrusted | None:
    """Why what listens on `url` is not the data dir's server (None: nothing listens, or it is)."""
    try:
        verify_listener(data, url, absent_ok=True)
    except ChromaUntrusted as exc:
        return exc
    return None


@dataclass
class DataDirTrust:
    """`ChromaTrust` of the data dir's own server: its listener, then each connection, checked."""

    data: DataDir
    on_refused: Callable[[ChromaUntrusted], None] | None = None

    def listener(self, url: str) -> None:
        verify_listener(self.data, url)

    def connection(self, url: str, sock: socket.socket) -> None:
        verify_connection(self.data, url, sock)

    def refused(self, exc: ChromaUntrusted) -> None:
        if self.on_refused is not None:
            self.on_refused(exc)


def live_server(data: DataDir) -> ChromaServer | None:
    """The data dir's running server, if the lock is held for `chroma.url`, its listener is ours and it answers.

    A listener of another uid on the recorded port raises ChromaUntrusted:
    rem never talks to it, and never quietly starts another server beside it.
    """
    url = recorded_url(data)
    if url and lock_names(data, url) and trust.check_listener(url, absent_ok=True) and is_alive(url):
        return ChromaServer(url=url, data=data)
    return None


def resolve(
    data: DataDir, explicit_url: str | None = None, *, start: bool = True, die_with_parent: bool = True
) -> ChromaServer:
    """The server to use: external URL, else the live one, else a new one (if `start`)."""
    ext = external_url(explicit_url)
    if ext is not None:
        heartbeat(ext)
        return ChromaServer(url=ext, external=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        server = live_server(data)
        if server is not None:
            return server
        if not start:
            raise ChromaUnreachable(f"Chroma not running for {data.root}; start it with `rem up`")
        started = try_start(data, die_with_parent=die_with_parent)
        if started is not None:
            return started
        # Another process holds the lock: its server is starting (or dying). Wait for it.
        if time.monotonic() > deadline:
            raise _lock_held_without_server(data)
        time.sleep(0.1)


def _lock_held_without_server(data: DataDir) -> ChromaStartFailed:
    return ChromaStartFailed(
        f"{data.chroma_lock} is held but no Chroma answers at {recorded_url(data)}; "
        "stop the process holding it (`fuser` the lock file) and retry"
    )


def try_start(data: DataDir, *, die_with_parent: bool = True) -> ChromaServer | None:
    """Take the lock and start `chroma run`; None when another process holds the lock."""
    data.ensure()
    # private (0600): another user who could open the lock could take it and stand in for the server
    fd = os.open(data.chroma_lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, private.FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        return _spawn_locked(data, fd, die_with_parent)
    finally:
        # The child holds the lock through its inherited copy of the description.
        os.close(fd)


def _preferred_port(data: DataDir) -> int:
    url = recorded_url(data)
    if url:
        port = urlparse(url).port
        if port and port_is_free(port):
            return port
    return free_port()


def _spawn_locked(data: DataDir, lock_fd: int, die_with_parent: bool) -> ChromaServer:
    private.make_private_dir(data.chroma_dir)
    port = _preferred_port(data)
    url = f"http://127.0.0.1:{port}"
    log_path = data.logs / "chroma.log"
    # `chroma` is a Python entry script: PYTHONSAFEPATH is its `-P` (backend.core.processes); it
    # needs none of rem's settings, and gets none of its secrets (REM_DB_URL, REM_MODEL_API_KEY)
    env = processes.foreign_child_env(
        ANONYMIZED_TELEMETRY="False",
        CHROMA_TELEMETRY="False",
        NO_COLOR="1",
        RUST_LOG=settings.chroma_log,
    )
    env.update(auth.server_env())
    config = auth.server_config(data.chroma_dir, port, data.root)
    cmd = [chroma_binary(), "run"] + (
        [str(config)]
        if config is not None
        else ["--path", str(data.chroma_dir), "--host", "127.0.0.1", "--port", str(port)]
    )
    with data.open_log("chroma.log") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            pass_fds=(lock_fd,),
            env=env,
            start_new_session=True,
            cwd=data.root,
            preexec_fn=private.private_child_dying_with_parent if die_with_parent else private.private_child,
        )
    os.ftruncate(lock_fd, 0)
    # the kernel's start time beside the pid, as `up.json` records its children: `rem kill chroma`
    # signals the pid only while it is still this server (`processes.same_process`)
    started = {"started_at": time.time(), "process_started_at": processes.started_at(proc.pid)}
    os.pwrite(lock_fd, json.dumps({"pid": proc.pid, "url": url, **started}).encode(), 0)
    server = ChromaServer(url=url, data=data, process=proc, started_here=True)
    try:
        _wait_ready(server, log_path)
    except BaseException:
        server.stop(timeout=5)
        raise
    warm_collections(url)
    private.write_private_text(data.chroma_url_file, url + "\n")
    log.info("started chroma server pid %s at %s for %s", proc.pid, url, data.chroma_dir)
    return server


def _wait_ready(server: ChromaServer, log_path: Path) -> None:
    assert server.process is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            tail = _tail(log_path)
            raise ChromaStartFailed(
                f"`chroma run` exited with code {server.process.returncode} before answering "
                f"(see {log_path}): {tail}"
            )
        if _answers_as_child(server):
            return
        time.sleep(0.05)
    raise ChromaStartFailed(f"`chroma run` did not answer within {START_TIMEOUT_S:.0f} s (see {log_path})")


def warm_collections(url: str) -> int:
    """Open every collection of a server just started, before anyone else can find it; how many.

    Chroma 1.5.9 keeps a collection's vector index in memory while it runs and writes
    it to the index files under `chroma/` when the collection is first opened after a
    start (whatever the request: a `get` of one id rewrites `length.bin`, and
    `data_level0.bin` when vectors were added since). Opened here, by the process that
    starts the server, those writes happen before `chroma.url` names it, so a read-only
    command (`rem check`, `replay --dry-run`, `rem status`, the read-only console)
    later changes no byte under `chroma/`. A collection Chroma drops from its cache
    and reopens for a reader is rewritten then (the rows read the same before and after).
    """
    # import time: chromadb (about a second), only for the process that starts the server
    import chromadb
    from chromadb.config import Settings

    parsed = urlparse(url)
    client_settings = Settings(anonymized_telemetry=False, **auth.client_settings())
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    try:
        client = chromadb.HttpClient(host=host, port=port, settings=client_settings)
        collections = client.list_collections()
        for collection in collections:
            collection.get(limit=1, include=[])
    except Exception as exc:  # a slower first read is all that is lost: never fail the start for it
        log.warning("could not open the collections of the Chroma server at %s: %s", url, exc)
        return 0
    return len(collections)


def _answers_as_child(server: ChromaServer) -> bool:
    """Whether the server just started listens and answers, asked only once the socket is its own.

    The port was free a moment ago, but anything may have bound it since: while the
    socket on it is not the child's, it is sent nothing (the child fails to bind and
    exits, and `_wait_ready` says so). Where sockets cannot be matched to processes,
    the listener's uid is checked after the heartbeat, as before.
    """
    assert server.process is not None
    owned = trust.held_by(urlparse(server.url).port or 0, server.process.pid)
    if owned is False:
        return False
    if not is_alive(server.url, timeout=0.5):
        return False
    if owned is None:
        trust.check_listener(server.url, source="the server rem just started")
    return True


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])
