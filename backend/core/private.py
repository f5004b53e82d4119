"""Private by default: a data dir only its owner can read or change (ssh's StrictModes, for rem).

state.db holds every session's text, so everything rem creates is private:
directories 0700, files 0600, and every rem process runs under umask 077
(children too, through `child_preexec`). Files rem creates name their mode
explicitly as well, so a library caller with a loose umask gets the same.

A data dir rem is asked to open must be its own: one owned by another user,
or writable by group or others, is refused with one line naming the fix
(another user could otherwise plant files rem trusts). Opening a data dir it
owns for writing tightens what an older rem left world-readable.

Files rem writes into the data dir are opened without following symlinks
(`O_NOFOLLOW`), so a planted link cannot redirect a log; an export is created
exclusively and never overwrites anything.

A file that says what rem runs (the tool config, and the programs, folders and
scripts it names) is held to the same rule (`exposed`): refused when another
user owns it or a folder on its path, or group or others can write one of them.
Root's files pass (a system config), and so does a sticky world-writable
folder such as /tmp (others may add files there, not replace yours).

Every rem process makes itself non-dumpable (`make_undumpable`): another
process of the same user (a tool server rem started) cannot read its
environment or memory through /proc, nor ptrace it. Its children are
dumpable again once they exec.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import pwd
import shlex
import signal
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from backend.core.errors import BadInput, DataDirError

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600
# group or other may write: a data dir like that is not private, whatever its owner
LOOSE_WRITE = stat.S_IWGRP | stat.S_IWOTH

# what rem keeps at the top of a data dir (the rest of a data dir is left alone)
TOP_FILES = (
    "state.db",
    "state.db-wal",
    "state.db-shm",
    "chroma.url",
    "chroma.lock",
    "chroma.yaml",
    "up.json",
    "journal.head",
)
TREES = ("logs", "chroma")


def apply_private_umask() -> int:
    """umask 077 for this process (and what it starts); returns the previous umask."""
    return os.umask(PRIVATE_UMASK)


def user_name(uid: int) -> str:
    """The OS user name of `uid` (from the password database), or `uid:N` when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid:{uid}"


def _not_yours(path: Path, st: os.stat_result, what: str) -> DataDirError:
    me = os.geteuid()
    return DataDirError(
        f"{what} {path} is owned by {user_name(st.st_uid)} (uid {st.st_uid}), not by you "
        f"({user_name(me)}, uid {me}); rem opens only a data dir of its own user: "
        f"pass your own --data, or `chown -R {user_name(me)} {path}`"
    )


def check_data_dir(root: Path) -> None:
    """Refuse a data dir owned by another user, or writable by group or others (one line, the fix)."""
    try:
        st = root.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DataDirError(f"cannot inspect data dir {root}: {exc.strerror}; pass another --data") from None
    if not stat.S_ISDIR(st.st_mode):
        return  # `DataDir.check_usable` names that one
    if st.st_uid != os.geteuid():
        raise _not_yours(root, st, "data dir")
    if st.st_mode & LOOSE_WRITE:
        raise DataDirError(
            f"data dir {root} is writable by group or others (mode {stat.S_IMODE(st.st_mode):03o}); "
            f"rem keeps its data private: `chmod 700 {root}`, or pass another --data"
        )
    for name in (*TOP_FILES, *TREES):
        _check_entry_owner(root / name)


def _check_entry_owner(path: Path) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if st.st_uid != os.geteuid():
        raise _not_yours(path, st, "data dir entry")


def _tree(path: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every real file and directory at and under `path`, never through a symlink."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    yield path, st
    if stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(OSError):
            for child in sorted(path.iterdir()):
                yield from _tree(child)


def tighten(root: Path) -> list[str]:
    """Make what rem keeps in `root` private (0700 dirs, 0600 files); returns what changed.

    Symlinks are never followed and files of other users are never touched
    (`check_data_dir` refuses those at the top; below it they stay as they are).
    """
    changed = []
    entries = [(root, root.stat())] + [e for name in TOP_FILES for e in _tree(root / name)]
    entries += [e for name in TREES for e in _tree(root / name)]
    for path, st in entries:
        if st.st_uid != os.geteuid() or stat.S_ISLNK(st.st_mode):
            continue
        wanted = DIR_MODE if stat.S_ISDIR(st.st_mode) else FILE_MODE
        if stat.S_IMODE(st.st_mode) & ~wanted:
            with contextlib.suppress(FileNotFoundError):  # a -shm or log may vanish meanwhile
                os.chmod(path, stat.S_IMODE(st.st_mode) & wanted)
                changed.append(str(path))
    return changed


def make_private_dir(path: Path) -> None:
    """Create `path` (and missing parents) with the new directories 0700."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)


def _refuse_link(path: Path, exc: OSError) -> DataDirError:
    return DataDirError(
        f"{path} is a symlink (or cannot be opened without following one: {exc.strerror}); "
        "rem never writes through a link in its data dir: remove it"
    )


def open_private_append(path: Path) -> IO[bytes]:
    """A log opened for appending: created 0600, never through a symlink."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # a symlink (EMLINK is FreeBSD's answer)
            raise _refuse_link(path, exc) from None
        raise DataDirError(f"cannot open {path}: {exc.strerror}; check the data dir") from None
    return os.fdopen(fd, "ab")


def create_private_file(path: Path) -> bool:
    """Create an empty 0600 file unless something is there; True when this call created it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def write_private_text(path: Path, text: str) -> None:
    """Replace `path` atomically with `text` in a 0600 file (never written through a symlink)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        raise DataDirError(f"cannot write {path}: {exc.strerror}; check the data dir") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def inside(path: Path, root: Path) -> bool:
    """True when `path` is `root` or lies under it, symlinks resolved on both sides."""
    resolved, base = path.resolve(), root.resolve()
    return resolved == base or base in resolved.parents


def export_path(raw: str, data_root: Path) -> Path:
    """The file an export goes to: an operator-named path outside the data dir, not there yet.

    Refuses (BadInput, one line) an empty or unprintable name, a path inside
    the data dir (read-only means the data dir gets no new bytes), a missing
    folder, and anything that already exists (an export never overwrites).
    """
    text = raw.strip()
    if not text:
        raise BadInput("name the file to export to, e.g. ~/incident-receipts.csv")
    if not text.isprintable() or "\x00" in text:
        raise BadInput("the export path has control characters; type a plain path")
    try:
        return _new_path_outside(Path(text).expanduser(), data_root)
    except (OSError, RuntimeError) as exc:  # a name too long, a symlink loop, no home directory
        raise BadInput(f"cannot use {text!r} as the export path ({exc}); name another file") from None


def _new_path_outside(path: Path, data_root: Path) -> Path:
    if not path.is_absolute():
        path = Path.cwd() / path
    if inside(path, data_root):
        raise BadInput(
            f"{path} is inside the data dir {data_root}; exports go outside it (e.g. ~/{path.name})"
        )
    if not path.parent.is_dir():
        raise BadInput(f"folder {path.parent} does not exist; create it or name another path")
    if len(os.fsencode(path.name)) > 255:
        raise BadInput("the export file name is longer than 255 bytes; name a shorter file")
    if os.path.lexists(path):
        raise BadInput(f"{path} already exists; rem never overwrites an export: name a new file")
    return path


def create_export(path: Path, text: str) -> None:
    """Write `text` to a new 0600 file at `path`: refuses an existing file or a symlink."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        raise BadInput(f"{path} already exists; rem never overwrites an export: name a new file") from None
    except OSError as exc:
        raise BadInput(f"cannot create {path}: {exc.strerror}; name another path") from None
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def private_child() -> None:
    """preexec_fn for a process rem starts: umask 077."""
    os.umask(PRIVATE_UMASK)


def private_child_dying_with_parent() -> None:
    """preexec_fn: umask 077, and SIGTERM when the spawning thread's process dies (PR_SET_PDEATHSIG)."""
    os.umask(PRIVATE_UMASK)
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)


def private_to_owner(st: os.stat_result) -> bool:
    """A secret's file (a key, a token) as rem accepts it: yours, and no one else may read or write it."""
    return st.st_uid == os.geteuid() and not stat.S_IMODE(st.st_mode) & 0o077


@dataclass(frozen=True)
class Exposed:
    """A file or folder another user could change: what lets them, and the command that stops it."""

    path: Path
    what: str  # "/x is writable by group or others (mode 666)"
    fix: str  # "`chmod go-w /x`"


def exposed(path: Path) -> Exposed | None:
    """The first thing on `path`'s way another user could change (None: only you or root can).

    Checked with `lstat`, nearest first: the file itself, then every folder above it, on
    the path as written and as resolved (a symlink on the way counts by its owner: it
    decides where the path leads). What does not exist is skipped (its folder decides
    who may create it). Root's files pass; a folder writable by group or others passes
    only with its sticky bit (/tmp), a file never.
    """
    absolute = Path(os.path.abspath(path))
    real = Path(os.path.realpath(absolute))
    seen: set[Path] = set()
    for entry in (absolute, real, *absolute.parents, *real.parents):
        if entry in seen:
            continue
        seen.add(entry)
        try:
            st = entry.lstat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            return Exposed(entry, f"{entry} cannot be inspected ({exc.strerror})", "fix its folder's modes")
        found = _exposure(entry, st)
        if found is not None:
            return found
    return None


def _exposure(path: Path, st: os.stat_result) -> Exposed | None:
    me, quoted = os.geteuid(), shlex.quote(str(path))
    link = stat.S_ISLNK(st.st_mode)
    kind = "the symlink " if link else "the folder " if stat.S_ISDIR(st.st_mode) else ""
    if st.st_uid not in (me, 0):
        return Exposed(
            path,
            f"{kind}{path} is owned by {user_name(st.st_uid)} (uid {st.st_uid}), not by you "
            f"({user_name(me)}) or root",
            f"`chown {shlex.quote(user_name(me))} {quoted}`, or keep it in a folder of your own",
        )
    sticky_folder = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if not link and st.st_mode & LOOSE_WRITE and not sticky_folder:
        return Exposed(
            path,
            f"{kind}{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):03o})",
            f"`chmod go-w {quoted}`",
        )
    return None


PR_SET_DUMPABLE = 4


def make_undumpable() -> bool:
    """Make this process non-dumpable (Linux `PR_SET_DUMPABLE` 0); True when it is now.

    The kernel then lets only root (CAP_SYS_PTRACE) read its /proc/PID/environ, mem,
    maps, fd, cwd and exe, or ptrace it: a tool server running as rem's user cannot
    read the model key or a database password from rem's environment or memory.
    /proc/PID/cmdline, stat and status stay readable (`ps`, start times). No core
    dumps either. A child is dumpable again once it execs.
    """
    with contextlib.suppress(Exception):  # not Linux: nothing to do, and nothing it protects
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    return False
