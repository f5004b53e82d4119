"""The data directory: where state.db, the Chroma folder and logs live."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from backend.core import private
from backend.core.errors import DataDirError
from backend.core.settings import settings

# data dirs this process has already made private (tightening walks chroma/: once is enough)
_tightened: set[Path] = set()


def default_data_root() -> Path:
    """`$REM_DATA`, else the platform's user data dir for rem."""
    env = settings.data
    if env:
        return Path(env).expanduser()
    # import time: platformdirs, only when neither --data nor REM_DATA names the data dir
    import platformdirs

    return Path(platformdirs.user_data_dir("rem", appauthor=False))


@dataclass(frozen=True)
class DataDir:
    """Paths inside one data dir. `ensure()` creates and validates it."""

    root: Path

    @classmethod
    def resolve(cls, explicit: str | os.PathLike[str] | None = None) -> DataDir:
        root = Path(explicit).expanduser() if explicit else default_data_root()
        return cls(root.absolute())

    @property
    def state_db(self) -> Path:
        return self.root / "state.db"

    @property
    def chroma_dir(self) -> Path:
        return self.root / "chroma"

    @property
    def chroma_url_file(self) -> Path:
        return self.root / "chroma.url"

    @property
    def chroma_lock(self) -> Path:
        return self.root / "chroma.lock"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def up_manifest(self) -> Path:
        return self.root / "up.json"

    def check_reachable(self) -> None:
        """Refuse a data dir under a directory this user may not enter: one line naming that
        directory, not the `PermissionError` every later look at the path would raise."""
        try:
            self.root.stat()
        except PermissionError:
            blocked = next((p for p in reversed(self.root.parents) if not os.access(p, os.X_OK)), self.root)
            raise DataDirError(
                f"data dir {self.root} cannot be reached: this user ({private.user_name(os.geteuid())}) "
                f"may not enter {blocked}; run rem as the user the data dir belongs to, or pass another --data"
            ) from None
        except OSError:
            return  # missing (created later) or not a directory: `check_usable` says which

    def check_usable(self) -> None:
        """Refuse a data dir that cannot be reached, is a file, cannot be written, or is not private
        to this user."""
        self.check_reachable()
        if self.root.exists() and not self.root.is_dir():
            raise DataDirError(
                f"data dir {self.root} is a file, not a directory; pass --data with a directory path"
            )
        if self.root.is_dir() and not os.access(self.root, os.W_OK | os.X_OK):
            raise DataDirError(
                f"data dir {self.root} is not writable; fix its permissions or pass another --data"
            )
        if self.state_db.exists() and self.state_db.is_dir():
            raise DataDirError(f"{self.state_db} is a directory; remove it or pass another --data")
        private.check_data_dir(self.root)

    def ensure(self) -> DataDir:
        """Create the data dir and its subfolders (idempotent), private to this user.

        An existing data dir of this user is tightened (0700 dirs, 0600 files)
        the first time this process opens it; one of another user, or
        writable by group or others, is refused.
        """
        self.check_usable()
        try:
            private.make_private_dir(self.root)
            private.make_private_dir(self.logs)
        except OSError as exc:
            raise DataDirError(
                f"cannot create data dir {self.root}: {exc.strerror}; pass another --data"
            ) from exc
        self.check_usable()
        if self.root not in _tightened:
            private.tighten(self.root)
            _tightened.add(self.root)
        return self

    def open_log(self, name: str) -> IO[bytes]:
        """`logs/<name>` for appending: private, never through a symlink."""
        private.make_private_dir(self.logs)
        return private.open_private_append(self.logs / name)

    def exists(self) -> bool:
        self.check_reachable()
        return self.state_db.is_file()
