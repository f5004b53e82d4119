"""A `Context` is one process's handle on a data dir: state.db, Chroma, read-only flag."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from backend.chroma import server as chroma_server
from backend.chroma.collection import ChromaStore
from backend.chroma.server import ChromaServer
from backend.core.datadir import DataDir
from backend.core.errors import DataDirError, ReadOnly
from backend.core.settings import settings
from backend.store.db import Database
from backend.store.events import operator_name
from backend.store.schema import migrate, refuse_unusable

log = logging.getLogger("rem.context")


@dataclass
class Context:
    """What every backend entry point takes: where the data is and how to reach it."""

    data: DataDir
    chroma_url: str | None = None
    read_only: bool = False
    operator: str = field(default_factory=operator_name)
    # start a Chroma server for this process's lifetime when none is running
    start_chroma: bool = field(default_factory=lambda: settings.chroma_autostart)
    # the Chroma collection of summary rows (tests use one per test)
    collection: str = field(default_factory=lambda: settings.chroma_collection)
    _db: Database | None = field(default=None, repr=False)
    _server: ChromaServer | None = field(default=None, repr=False)
    _store: ChromaStore | None = field(default=None, repr=False)

    @classmethod
    def for_path(cls, path: str | None = None, **kwargs: object) -> Context:
        return cls(DataDir.resolve(path), **kwargs)  # type: ignore[arg-type]

    def require_writable(self, action: str) -> None:
        """Refuse any action from a read-only context, before it touches anything."""
        if self.read_only:
            raise ReadOnly(f"refused {action}: this rem is read-only (started with --read-only)")

    async def db(self) -> Database:
        """state.db, created and migrated on first use (read-only contexts never migrate)."""
        if self._db is None:
            self._db = await self._open_db()
        return self._db

    async def _open_db(self) -> Database:
        if self.read_only:
            self.data.check_usable()
            if not self.data.exists():
                raise DataDirError(
                    f"no rem data at {self.data.root} (state.db missing); run `rem init --data {self.data.root}`"
                )
            db = await Database.open(self.data.state_db, read_only=True)
            try:
                await refuse_unusable(db)
            except BaseException:
                await db.close()
                raise
            return db
        self.data.ensure()
        db = await Database.open(self.data.state_db)
        try:
            await migrate(db)
        except BaseException:
            await db.close()
            raise
        return db

    def chroma(self, *, start: bool | None = None) -> ChromaServer:
        """The Chroma server to use, started for this process's lifetime if needed.

        A read-only context never starts one: with no server running it says so.
        """
        server = self._server
        if server is not None and (server.external or server.alive()):
            return server
        wanted = self.start_chroma if start is None else start
        self._server = chroma_server.resolve(self.data, self.chroma_url, start=wanted and not self.read_only)
        return self._server

    def chroma_url_now(self) -> str:
        return self.chroma().url

    def store(self) -> ChromaStore:
        """The summary collection (lazily connected; reconnects after a Chroma restart).

        A read-only context's store never creates the collection: a missing one reads as empty.
        """
        if self._store is None:
            self._store = ChromaStore(
                self.chroma_url_now, collection=self.collection, read_only=self.read_only
            )
        return self._store

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None
        if self._server is not None and self._server.started_here:
            self._server.stop()
        self._server = None
        self._store = None

    async def __aenter__(self) -> Context:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
