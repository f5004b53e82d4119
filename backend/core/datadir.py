"""The data directory: where state.db, the Chroma folder and logs live."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from backend.core.errors import DataDirError
from backend.core.settings import settings


def default_data_root() -> Path:
    """`$REM_DATA`, else the platform's user data dir for rem."""
    env = settings.data
    if env:
        return Path(env).expanduser()
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

    def check_usable(self) -> None:
        """Refuse a data dir that is a file or cannot be written."""
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

    def ensure(self) -> DataDir:
        """Create the data dir and its subfolders (idempotent)."""
        self.check_usable()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.logs.mkdir(exist_ok=True)
        except OSError as exc:
            raise DataDirError(
                f"cannot create data dir {self.root}: {exc.strerror}; pass another --data"
            ) from exc
        self.check_usable()
        return self

    def exists(self) -> bool:
        return self.state_db.is_file()
