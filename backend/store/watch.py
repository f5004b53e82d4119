"""Hearing other processes' commits to state.db without polling it: a watch on state.db and its WAL.

Every commit to state.db writes its WAL (and a checkpoint writes state.db), so
a watch on those two files hears every commit of every process, at once. The
console (its refresh) and the daemons (their idle wait) both wait on it, then
gate what they do on `PRAGMA data_version`: a change of the watched files that
was not another connection's commit (a checkpoint, one's own write) costs one
cheap read, nothing more.

On Linux the watch is inotify itself, read on the event loop (`add_reader`):
no thread and no timer, so an idle watcher costs nothing at all, and a write
is heard within the loop's next turn. watchfiles (elsewhere) wakes a thread
every `step` ms to look for changes, which costs an idle process about 0.1 %
of a core at the 50 ms step a prompt wake needs (measured here: ~50 us of CPU
per step); it stays the portable fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import sqlite3
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path

log = logging.getLogger("rem.watch")

WATCHED_FILES = frozenset({"state.db", "state.db-wal"})
# watchfiles' pace where inotify is not there: a change is heard within one to two steps
FALLBACK_STEP_MS = 50

# <sys/inotify.h>
IN_MODIFY = 0x002
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = 0o2000000
WATCH_MASK = IN_MODIFY | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
READ_BYTES = 64 * 1024
# one commit is several writes (WAL frames, the header): heard as one change if they land within this
SETTLE_S = 0.003


class WatchGone(OSError):
    """The watched directory was removed or moved away: the watch hears nothing from now on."""


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    return libc if hasattr(libc, "inotify_init1") else None


class Inotify:
    """One inotify descriptor watching one directory for changes of the named files in it."""

    def __init__(self, root: Path, names: frozenset[str]) -> None:
        libc = _libc()
        if libc is None:
            raise OSError("inotify is not available here")
        self.names = {name.encode() for name in names}
        self.fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        if libc.inotify_add_watch(self.fd, os.fsencode(root), WATCH_MASK) < 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, f"inotify_add_watch {root}: {os.strerror(err)}")

    def read_changed(self) -> bool:
        """Take every queued event; whether one was about a watched file (or may have been)."""
        changed = False
        while True:
            try:
                buffer = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                return changed
            if not buffer:
                return changed
            changed |= self._parse(buffer)

    def _parse(self, buffer: bytes) -> bool:
        changed, offset = False, 0
        while offset + _HEADER.size <= len(buffer):
            _wd, mask, _cookie, length = _HEADER.unpack_from(buffer, offset)
            name = buffer[offset + _HEADER.size : offset + _HEADER.size + length].rstrip(b"\0")
            offset += _HEADER.size + length
            if mask & GONE:
                raise WatchGone("the watched data dir was removed or moved")
            # an overflowed queue lost events: anything may have changed
            changed |= bool(mask & IN_Q_OVERFLOW) or name in self.names
        return changed

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


async def state_db_changes(root: Path) -> AsyncIterator[None]:
    """Yield once the watch is up (anything may have changed before it), then whenever state.db
    or its WAL in `root` changes (a burst of changes: one yield).

    Raises OSError when the watch cannot be set up (no such directory, the
    system's watch limit reached); the caller falls back to polling.
    """
    try:
        watch = Inotify(root, WATCHED_FILES)
    except OSError as exc:
        if _libc() is not None:
            raise  # inotify is there but refused (the watch limit): not a platform to fall back from
        log.debug("no inotify (%s); watching %s with watchfiles", exc, root)
        yield None  # watchfiles' watch is up once its first wait runs: close enough for a start
        async for _ in _watchfiles_changes(root):
            yield None
        return
    yield None
    async for _ in _inotify_changes(watch):
        yield None


async def _inotify_changes(watch: Inotify) -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    try:
        while True:
            loop.add_reader(watch.fd, readable.set)
            await readable.wait()
            readable.clear()
            loop.remove_reader(watch.fd)  # level-triggered: it would fire on every turn until read
            changed = watch.read_changed()
            await asyncio.sleep(SETTLE_S)  # the rest of the commit's writes: one change, not four
            if watch.read_changed() or changed:
                yield None
    finally:
        loop.remove_reader(watch.fd)
        watch.close()


async def _watchfiles_changes(root: Path) -> AsyncIterator[None]:
    from watchfiles import awatch  # import time: only where there is no inotify

    def only_state_db(_change: object, path: str) -> bool:
        return os.path.basename(path) in WATCHED_FILES

    async for _changes in awatch(
        root,
        watch_filter=only_state_db,
        recursive=False,
        debounce=2 * FALLBACK_STEP_MS,
        step=FALLBACK_STEP_MS,
        yield_on_timeout=False,
    ):
        yield None


# `PRAGMA data_version` (it moves when another connection commits) and the journal's newest id that
# is not a streamed part: a part is news to the API's event streams, never work for a daemon (a
# step's end journals `execution.step`), so a commit of parts alone is upkeep. Read backwards from
# the newest row: the parts after the last other row are all it walks.
MARKS_SQL = (
    "SELECT (SELECT data_version FROM pragma_data_version()), "
    "(SELECT id FROM event WHERE kind <> 'message.part' ORDER BY id DESC LIMIT 1)"
)
# a reader waits this long at most for SQLite's WAL index (a checkpoint resetting the WAL)
PROBE_BUSY_MS = 20


class MarksProbe:
    """A read-only connection of its own that reads state.db's two marks on the caller's thread.

    What an idle process looks at on every change its watch hears: one
    statement of a few microseconds, cheaper than a hop to its store's
    worker thread. It never holds a transaction open (each read is one
    autocommit statement) and writes nothing, so it blocks no checkpoint.
    Its `data_version` moves on every other connection's commit, the
    process's own store connection's included.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None

    def read(self) -> tuple[int, int | None]:
        """(data_version, newest journal id); raises sqlite3.Error (busy, gone) for the caller to treat as news."""
        if self._conn is None:
            uri = f"{path_uri(self.path)}?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            self._conn.execute(f"PRAGMA busy_timeout = {PROBE_BUSY_MS}")
        try:
            row = self._conn.execute(MARKS_SQL).fetchone()
        except sqlite3.Error:
            self.close()  # a replaced or vanished file: reopen on the next read
            raise
        return int(row[0]), None if row[1] is None else int(row[1])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def path_uri(path: Path) -> str:
    return Path(path).absolute().as_uri()
