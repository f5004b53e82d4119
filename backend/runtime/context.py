"""A `Context` is one process's handle on a data dir: state.db, Chroma, read-only flag."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

from backend.chroma import server as chroma_server
from backend.chroma.collection import ChromaStore
from backend.chroma.connections import ChromaTrust
from backend.chroma.embedder import Embedder, load_embedder
from backend.chroma.server import ChromaServer, DataDirTrust
from backend.core.datadir import DataDir
from backend.core.errors import ChromaUntrusted, DataDirError, ReadOnly
from backend.core.settings import Settings, settings
from backend.store.db import Database
from backend.store.events import operator_name
from backend.store.schema import migrate, refuse_unusable

log = logging.getLogger("rem.context")


def project_turn_collection(prefix: str, project: str) -> str:
    """`rem_turns-p<sha256 of the project, 20 hex>`: a valid Chroma name for any project name."""
    digest = hashlib.sha256(project.encode("utf-8", "surrogatepass")).hexdigest()[:20]
    return f"{prefix}-p{digest}"


def turn_collection_name(summary_collection: str) -> str:
    """`rem_summaries` -> `rem_turns`; any other name gets `-turns` appended."""
    if summary_collection.endswith("summaries"):
        return summary_collection[: -len("summaries")] + "turns"
    return summary_collection + "-turns"


def store_env(db_url: str | None) -> dict[str, str]:
    """The state store, for the environment of a rem process this one starts: never its argv (`ps`
    shows argv to every user). Blank (no `--db`) means state.db in the child's data dir."""
    return {Settings.db_url.env: db_url or ""}


@dataclass
class Context:
    """What every backend entry point takes: where the data is and how to reach it."""

    data: DataDir
    chroma_url: str | None = None
    read_only: bool = False
    # an operator's command on data that must already be there: a missing data dir is an error,
    # not one to create (a decision or a release on a mistyped --data would make an empty one)
    existing: bool = False
    # the state store on PostgreSQL (`--db` / REM_DB_URL); None: state.db in the data dir
    db_url: str | None = field(default_factory=lambda: settings.db_url)
    operator: str = field(default_factory=operator_name)
    # start a Chroma server for this process's lifetime when none is running
    start_chroma: bool = field(default_factory=lambda: settings.chroma_autostart)
    # the Chroma collection of summary rows (tests use one per test)
    collection: str = field(default_factory=lambda: settings.chroma_collection)
    # what a long-lived reader carries from one call to the next (the journal tally of
    # `backend/ops/throughput.py`), so a refresh reads only what changed since the last
    memo: dict[str, Any] = field(default_factory=dict, repr=False)
    # the Chroma listeners this process refused, newest last (a daemon journals and clears them)
    refusals: list[ChromaUntrusted] = field(default_factory=list, repr=False)
    # counts the servers this context resolved: a change means Chroma restarted (or moved), and
    # what it holds is worth checking again (Dream's turn vector sweep)
    chroma_generation: int = field(default=0, repr=False)
    # PostgreSQL: connections this process opens beside its Database (the API hub's reader), taken
    # from the write connections' share of REM_DB_MAX_CONNECTIONS when the store is opened
    spare_connections: int = field(default=0, repr=False)
    _db: Database | None = field(default=None, repr=False)
    _server: ChromaServer | None = field(default=None, repr=False)
    _store: ChromaStore | None = field(default=None, repr=False)
    _turn_stores: dict[str, ChromaStore] = field(default_factory=dict, repr=False)
    _embedder: Embedder | None = field(default=None, repr=False)

    @classmethod
    def for_path(cls, path: str | None = None, **kwargs: object) -> Context:
        return cls(DataDir.resolve(path), **kwargs)  # type: ignore[arg-type]

    def store_env(self) -> dict[str, str]:
        """The state store, for the environment of a rem process this one starts (`store_env`)."""
        return store_env(self.db_url)

    def require_writable(self, action: str) -> None:
        """Refuse any action from a read-only context, before it touches anything."""
        if self.read_only:
            raise ReadOnly(f"refused {action}: this rem is read-only (started with --read-only)")

    async def db(self) -> Database:
        """state.db, created and migrated on first use (read-only contexts never migrate)."""
        if self._db is None:
            self._db = await self._open_db()
        return self._db

    @property
    def store_name(self) -> str:
        """Which store this context uses, for operators: the state.db path or the URL (no password)."""
        if self.db_url:
            # import time: psycopg, only for a PostgreSQL store
            from backend.store.postgres import display_url

            return display_url(self.db_url)
        return str(self.data.state_db)

    def _refuse_missing(self) -> None:
        self.data.check_usable()
        if not self.data.exists():
            raise DataDirError(
                f"no rem data at {self.data.root} (state.db missing); run `rem init --data {self.data.root}`"
            )

    async def _open_db(self) -> Database:
        if self.db_url:
            return await self._open_postgres(self.db_url)
        if self.read_only or self.existing:
            self._refuse_missing()
        if self.read_only:
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

    async def _open_postgres(self, url: str) -> Database:
        if not self.read_only:
            self.data.ensure()  # logs, Chroma's folder and up.json still live in the data dir
        db = await Database.connect(url, read_only=self.read_only, spare=self.spare_connections)
        try:
            await (refuse_unusable(db) if self.read_only else migrate(db))
        except BaseException:
            await db.close()
            raise
        return db

    def chroma(self, *, start: bool | None = None) -> ChromaServer:
        """The Chroma server to use, started for this process's lifetime if needed.

        The server used last is checked again first (its listener, before a
        heartbeat); one that is gone, or whose port something else holds now, is
        looked up again from the data dir. A read-only context never starts one:
        with no server running it says so.
        """
        server = self._server
        if server is not None:
            try:
                if server.external or server.alive():
                    return server
            except ChromaUntrusted as exc:
                self.note_refusal(exc)  # `rem up` may have moved the server: look it up again
        wanted = self.start_chroma if start is None else start
        self._server = chroma_server.resolve(self.data, self.chroma_url, start=wanted and not self.read_only)
        self.chroma_generation += 1
        return self._server

    def note_refusal(self, exc: ChromaUntrusted) -> None:
        """Keep a refused listener for whoever journals them (the newest 16)."""
        self.refusals.append(exc)
        del self.refusals[:-16]

    def chroma_trust(self) -> ChromaTrust | None:
        """How this context's stores check their server: the data dir's own is checked on every
        connection; an external one (`--chroma-url`) is used as the operator named it."""
        if chroma_server.external_url(self.chroma_url) is not None:
            return None
        return DataDirTrust(self.data, self.note_refusal)

    def chroma_url_now(self) -> str:
        return self.chroma().url

    def embedder(self) -> Embedder:
        """The configured embedder, one per process (the model loads on first use)."""
        if self._embedder is None:
            self._embedder = load_embedder()
        return self._embedder

    def store(self) -> ChromaStore:
        """The summary collection (lazily connected; reconnects after a Chroma restart).

        A read-only context's store never creates the collection: a missing one reads as empty.
        """
        if self._store is None:
            self._store = ChromaStore(
                self.chroma_url_now,
                self.embedder(),
                collection=self.collection,
                read_only=self.read_only,
                trust=self.chroma_trust(),
            )
        return self._store

    def store_unchecked(self) -> ChromaStore:
        """A fresh handle on the summary collection that does not check its embedder: only for
        reading a collection that is about to be rebuilt (`rem reindex`)."""
        return ChromaStore(
            self.chroma_url_now,
            self.embedder(),
            collection=self.collection,
            check_embedder=False,
            trust=self.chroma_trust(),
        )

    @property
    def turn_collection(self) -> str:
        """The prefix of the Chroma collections of turn vectors (one per project)."""
        return turn_collection_name(self.collection)

    def turn_store(self, project: str) -> ChromaStore:
        """The project's turn collection (the recall index's dense side).

        One collection per project: Chroma's HNSW search with a restrictive
        `where` filter visits most of the graph (measured: 150-470 ms at 100 000
        vectors for a project holding 1/182 of them), while a project's own
        index answers in a few ms. Recall is scoped by project anyway.
        """
        store = self._turn_stores.get(project)
        if store is None:
            name = project_turn_collection(self.turn_collection, project)
            store = self._turn_stores[project] = ChromaStore(
                self.chroma_url_now,
                self.embedder(),
                collection=name,
                read_only=self.read_only,
                trust=self.chroma_trust(),
            )
        return store

    async def drop_turn_collections(self) -> int:
        """Delete every project's turn collection (`rem reindex`); returns how many."""
        trust = self.chroma_trust()
        probe = ChromaStore(
            self.chroma_url_now,
            self.embedder(),
            collection=self.turn_collection,
            check_embedder=False,
            trust=trust,
        )
        names = await probe.collection_names(prefix=self.turn_collection + "-p")
        for name in names:
            await ChromaStore(
                self.chroma_url_now, self.embedder(), collection=name, check_embedder=False, trust=trust
            ).drop()
        self._turn_stores.clear()
        return len(names)

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None
        if self._server is not None and self._server.started_here:
            self._server.stop()
        self._server = None
        self._store = None
        self._turn_stores = {}

    async def __aenter__(self) -> Context:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
