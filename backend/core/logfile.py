"""A daemon's log file kept under a size: its newest lines in FILE, the ones before them in FILE.1.

`rem up` starts each daemon with its stdout and stderr appended to
`DATA/logs/NAME.log` (one `O_APPEND` descriptor the supervisor opened) and
`REM_LOG_FILE` naming that file. A daemon logs to stderr; when REM_LOG_FILE
names the very file its stderr appends to, rem's handler (`stderr_handler`)
looks at the file's size every `CHECK_BYTES` it writes, and once it is over
`REM_LOG_MAX_BYTES` copies it to FILE.1 (replacing the one before) and
truncates it in place. Truncating, not renaming: the descriptor stays the
file's, and `O_APPEND` writes go on at the new end (logrotate's
`copytruncate`); a rename would leave the daemon writing to FILE.1 for good.
It happens under the handler's lock, so no line this process logs is lost;
bytes written around it by anything else sharing the descriptor may be. A
daemon's logs then take at most twice the bound, whatever a tool server or
a bug makes it log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import TextIO

from backend.core.private import FILE_MODE

CHECK_BYTES = 64 * 1024


class CappedStderrHandler(logging.StreamHandler[TextIO]):
    """Logs to stderr, which appends to `path`; keeps `path` under `max_bytes` (the rest in `path`.1)."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        super().__init__(sys.stderr)
        self.path = path
        self.max_bytes = max_bytes
        self.unchecked = 0
        self.rotations = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
            self.stream.write(line)
            self.flush()
            self.unchecked += len(line)
            if self.unchecked >= CHECK_BYTES:
                self.unchecked = 0
                self._rotate_if_over()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def _rotate_if_over(self) -> None:
        fd = self.stream.fileno()
        if os.fstat(fd).st_size <= self.max_bytes or not same_file(fd, self.path):
            return
        with contextlib.suppress(OSError):  # no room for the copy: the bound matters more than the old lines
            _copy_private(self.path, self.path.with_name(self.path.name + ".1"))
        os.ftruncate(fd, 0)
        self.rotations += 1


def same_file(fd: int, path: Path) -> bool:
    """`fd` is open on `path` itself (not a file since moved, nor one a symlink there points to)."""
    try:
        there = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    here = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _copy_private(source: Path, target: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        target.unlink()  # a link planted there is removed, never followed
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with (
        open(os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as src,
        open(os.open(target, flags, FILE_MODE), "wb") as dst,
    ):
        shutil.copyfileobj(src, dst, 1024 * 1024)


def stderr_handler(log_file: Path | None, max_bytes: int) -> logging.Handler:
    """The handler for this process's log: capped when `log_file` is the file stderr appends to."""
    try:
        capped = log_file is not None and same_file(sys.stderr.fileno(), log_file)
    except (AttributeError, OSError, ValueError):  # stderr is no file descriptor (a test's capture)
        capped = False
    if capped and log_file is not None:
        return CappedStderrHandler(log_file, max_bytes)
    return logging.StreamHandler(sys.stderr)
