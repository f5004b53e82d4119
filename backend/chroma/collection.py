"""rem's access to its Chroma collection over HTTP, with rem's own embeddings.

All calls run in a thread (the chromadb client is synchronous) and map
transport failures to `ChromaUnreachable`. On failure the client is dropped
and the server re-resolved on the next call, so a Chroma restart (even on a
new port) is picked up without restarting the daemon.

The data dir's own server is checked on every connection, not once
(`backend.chroma.connections`). A reply that is not what Chroma's API
returns (a missing key, a wrong type) is `ChromaBadReply`, never a KeyError
in a daemon.

Semantics relied on (and proven by tests/backend/test_chroma_witness.py
against a real server): `upsert` and `update` *merge* metadata (keys not named
are kept, a `None` value deletes a key, `{}` is refused), and values round-trip
with their type (`1`, `1.0` and `True` stay distinct).

Every collection rem uses records the embedder that wrote its vectors
(`rem:embedder`, `rem:dim` in the collection's metadata, written when rem
creates it). Connecting with another embedder is refused with
`EmbedderMismatch` (one line: run `rem reindex`), because two embedders'
vectors of equal dimension would be compared silently and rank nonsense. A
non-empty collection from before the record existed was written by the only
embedder rem had then (`LEGACY_EMBEDDER`); an empty one is simply adopted.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from array import array
from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple, cast
from urllib.parse import urlparse

from backend.chroma import auth
from backend.chroma.connections import MALFORMED_REPLY, ChromaTrust, instrument
from backend.chroma.embedder import (
    DIM_KEY,
    EMBEDDER_KEY,
    Embedder,
    embedder_record,
    load_embedder,
    recorded_embedder,
)
from backend.chroma.row_cache import RowCache, cached_rows, ranked
from backend.core.errors import (
    ChromaBadReply,
    ChromaNotReady,
    ChromaUnreachable,
    ChromaUntrusted,
    EmbedderMismatch,
    ReadOnly,
)
from backend.core.settings import Settings
from backend.models.errors import ModelError

log = logging.getLogger("rem.chroma_store")

COLLECTION = Settings.chroma_collection.default
Metadata = dict[str, Any]


def _is_missing_collection(exc: BaseException) -> bool:
    return type(exc).__name__ == "NotFoundError" and "does not exist" in str(exc)


class ChromaRow(NamedTuple):
    """One row of the collection as `get` returns it."""

    document: str | None
    metadata: Metadata


class LiveRow(NamedTuple):
    """A summary row as Chroma holds it now (the embedding as chromadb returns it)."""

    document: str | None
    metadata: Metadata
    embedding: Any = None


# Chroma 1.5.9 answers a read that includes vectors, made while a new collection's first
# writes are being applied, with "Error creating hnsw segment reader: Nothing found on disk"
# (its vector index is neither cached nor persisted yet), or "Error executing plan: Internal
# error: Error finding id" (the same window: a clean-clone CI run met it on 2026-12-07), or with
# the rows but fewer vectors.
# The same read succeeds moments later, so reads of vectors retry with these pauses (3.15 s
# in all) before giving up. A search (`query`) meets the same error: it is ChromaNotReady (a
# ChromaUnreachable), which recall reports as degraded instead of failing the caller.
VECTOR_INDEX_NOT_READY = "Nothing found on disk"
VECTOR_INDEX_NOT_READY_ERRORS = ("Nothing found on disk", "Error finding id")
VECTOR_READ_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)


def _vector_index_not_ready(exc: BaseException) -> bool:
    text = str(exc)
    return type(exc).__name__ == "InternalError" and any(m in text for m in VECTOR_INDEX_NOT_READY_ERRORS)


def _is_transport_error(exc: BaseException) -> bool:
    name = type(exc).__name__
    module = type(exc).__module__
    return (
        isinstance(exc, (ConnectionError, TimeoutError, OSError))
        or module.startswith(("httpx", "httpcore", "urllib3", "requests"))
        or name in {"ConnectError", "ReadTimeout", "RemoteProtocolError", "ReadError"}
    )


class _EmptyCollection:
    """What a read-only store reads when the collection does not exist (yet): nothing."""

    def get(self, **_kwargs: Any) -> dict[str, list[Any]]:
        return {"ids": [], "documents": [], "metadatas": [], "embeddings": []}

    def count(self) -> int:
        return 0

    def query(self, **_kwargs: Any) -> dict[str, list[list[Any]]]:
        # recall's summary search before the first summary was written (`rem import`, then `rem recall`)
        return {"ids": [[]], "distances": [[]], "documents": [[]], "metadatas": [[]], "embeddings": [[]]}


EMPTY_COLLECTION = _EmptyCollection()


def _page_of_ids(collection: Any, *, limit: int, offset: int) -> list[str]:
    return [str(i) for i in collection.get(include=[], limit=limit, offset=offset)["ids"]]


class EmbeddingFailed(ChromaUnreachable):
    """The embedding model failed: like an unreachable Chroma, the write waits and is retried."""


class ChromaStore:
    """The summary collection. `url_resolver` returns the URL to use right now."""

    def __init__(
        self,
        url_resolver: Callable[[], str],
        embedder: Embedder | None = None,
        collection: str = COLLECTION,
        *,
        read_only: bool = False,
        check_embedder: bool = True,
        trust: ChromaTrust | None = None,
    ) -> None:
        self._resolve = url_resolver
        # None: an external server the operator named (`--chroma-url`), used as given
        self.trust = trust
        # off only to read a collection whose vectors are about to be rebuilt (`rem reindex`)
        self.check_embedder = check_embedder
        self.collection_name = collection
        # read-only: never create the collection, never write (a missing collection reads as empty)
        self.read_only = read_only
        self.embedder = embedder or load_embedder()
        self._collection: Any = None
        self._url: str | None = None
        self._guard = threading.Lock()
        self._replied = False  # a response came back during the current call
        # vectors `embed(..., keep=True)` computed, each taken by the next `embed` of its document
        self._kept: dict[str, list[float]] = {}
        # rows `nearest_among` fetched, each under the version its caller gave (emptied on connecting)
        self.row_cache = RowCache()

    @property
    def url(self) -> str | None:
        return self._url

    def client(self) -> Any:
        """A chromadb HttpClient on the server's current URL (rem's own embeddings only).

        With a trust: the listener is checked first, and every connection the client opens after.
        """
        # import time: chromadb (about a second), only when Chroma is reached
        import chromadb
        from chromadb.config import Settings

        url = self._resolve()
        parsed = urlparse(url)
        trust = self.trust
        if trust is not None:
            trust.listener(url)
        try:
            client = chromadb.HttpClient(
                host=parsed.hostname or "127.0.0.1",
                port=parsed.port or (443 if parsed.scheme == "https" else 80),
                ssl=parsed.scheme == "https",
                settings=Settings(anonymized_telemetry=False, **auth.client_settings()),
            )
        except ValueError as exc:  # chromadb's constructor turns every failure into a ValueError
            if "Could not connect" in str(exc):
                raise ChromaUnreachable(
                    f"Chroma at {url} is unreachable; rem retries, or check `rem status`"
                ) from exc
            raise ChromaBadReply(
                f"Chroma at {url} did not answer as Chroma when rem connected ({str(exc)[:200]}); "
                "rem retries, or check `rem status` and --chroma-url"
            ) from exc
        check = None if trust is None else partial(trust.connection, url)
        instrument(client, check, self._mark_replied)
        self._url = url
        return client

    def _mark_replied(self) -> None:
        self._replied = True

    def _connect(self) -> Any:
        self.row_cache.clear()  # another server, or the collection swapped (`rem reindex`): fetch afresh
        client = self.client()
        # import time: chromadb, only when Chroma is reached
        from chromadb.errors import NotFoundError

        # embedding_function=None: Chroma's default would download a model.
        if self.read_only:
            try:
                collection = client.get_collection(self.collection_name, embedding_function=None)
            except NotFoundError:
                return None  # not created yet: nothing to read, and read-only creates nothing
        else:
            collection = client.get_or_create_collection(
                self.collection_name, embedding_function=None, metadata=embedder_record(self.embedder)
            )
        if self.check_embedder:
            self._check_embedder(collection)
        return collection

    def _check_embedder(self, collection: Any) -> None:
        """Refuse a collection written by another embedder; record ours on an empty unrecorded one."""
        recorded = recorded_embedder(collection.metadata, collection.count())
        wanted = (self.embedder.name, int(self.embedder.dim))
        if recorded is None:
            if not self.read_only:  # read-only writes nothing, not even this record
                collection.modify(metadata={EMBEDDER_KEY: wanted[0], DIM_KEY: wanted[1]})
            return
        if recorded != wanted:
            raise EmbedderMismatch(
                f"Chroma collection {self.collection_name!r} holds {recorded[0]} vectors ({recorded[1]}-d) "
                f"but REM_EMBEDDER gives {wanted[0]} ({wanted[1]}-d); run `rem reindex` to rebuild it "
                "with the configured embedder, or set REM_EMBEDDER back"
            )

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        with self._guard:
            try:
                return self._call_once(fn)
            except Exception as exc:
                if not _is_missing_collection(exc):
                    raise
                # the collection was swapped under us (`rem reindex`): reconnect once
                self._collection = None
                return self._call_once(fn)

    def _call_once(self, fn: Callable[[Any], Any]) -> Any:
        self._replied = False
        try:
            if self._collection is None:
                self._collection = self._connect()
            if self._collection is None:
                return fn(EMPTY_COLLECTION)  # looked up again next call: it may exist by then
            return fn(self._collection)
        except Exception as exc:
            self._raise_mapped(exc)
            raise

    def _raise_mapped(self, exc: Exception) -> None:
        """Raise the RemError `exc` stands for (returns for an error that is not Chroma's doing)."""
        url = self._url or "its URL"
        if isinstance(exc, ChromaUnreachable):
            self._collection = None
            if isinstance(exc, ChromaUntrusted) and self.trust is not None:
                self.trust.refused(exc)
            raise exc
        if _is_transport_error(exc):
            self._collection = None
            raise ChromaUnreachable(
                f"Chroma at {url} stopped answering ({type(exc).__name__}); rem retries, or check `rem status`"
            ) from exc
        if _vector_index_not_ready(exc):  # a search or a read of vectors, moments too early
            raise ChromaNotReady(
                f"Chroma cannot read the vectors of collection {self.collection_name} yet "
                f"({VECTOR_INDEX_NOT_READY.lower()}: its index is still being written); rem retries"
            ) from exc
        if self._replied and isinstance(exc, MALFORMED_REPLY):
            self._collection = None  # reconnect (and check the server) before the next request
            raise ChromaBadReply(
                f"Chroma at {url} gave a reply that is not Chroma's ({type(exc).__name__}: "
                f"{str(exc)[:200]}); nothing was taken from it: rem retries, or check `rem status`"
            ) from exc

    async def _run(self, fn: Callable[[Any], Any]) -> Any:
        return await asyncio.to_thread(self._call, fn)

    async def _run_on_client(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(client)` for calls about the server's collections, with the same error mapping."""

        def call() -> Any:
            with self._guard:
                self._replied = False
                try:
                    return fn(self.client())
                except Exception as exc:
                    self._raise_mapped(exc)
                    raise

        return await asyncio.to_thread(call)

    async def get(self, ids: Sequence[str], *, include_embeddings: bool = False) -> dict[str, ChromaRow]:
        """`{id: ChromaRow(document, metadata)}` for the ids that exist (one round trip)."""
        include = ["documents", "metadatas"] + (["embeddings"] if include_embeddings else [])
        if not ids:
            return {}

        def read(c: Any) -> dict[str, ChromaRow]:
            result = c.get(ids=list(ids), include=include)
            documents, metadatas = result["documents"], result["metadatas"]
            return {
                str(row_id): ChromaRow(document=documents[i], metadata=dict(metadatas[i] or {}))
                for i, row_id in enumerate(result["ids"])
            }

        return cast(dict[str, ChromaRow], await self._run(read))

    def _refuse_write(self, what: str) -> None:
        if self.read_only:
            raise ReadOnly(f"refused {what} of Chroma rows: this rem is read-only")

    async def _read_vectors(self, ids: list[str], include: list[str]) -> dict[str, LiveRow]:
        """`collection.get` of rows with their vectors, through Chroma's not-ready window."""
        for pause in (*VECTOR_READ_PAUSES, None):
            try:
                rows = await self._run(lambda c: _live_rows(c.get(ids=ids, include=include)))
                if isinstance(rows, dict):
                    return rows
                problem = str(rows)
            except ChromaNotReady:
                problem = VECTOR_INDEX_NOT_READY.lower()
            if pause is None:
                raise ChromaNotReady(
                    f"Chroma cannot read the vectors of collection {self.collection_name} ({problem}, "
                    f"still after {sum(VECTOR_READ_PAUSES):.1f} s); rem retries, or restart Chroma with `rem up`"
                )
            log.debug("Chroma's vector index is not ready (%s): reading again in %.2f s", problem, pause)
            await asyncio.sleep(pause)
        raise AssertionError("unreachable")

    async def rows(self, ids: Sequence[str]) -> dict[str, LiveRow]:
        """`{id: (document, metadata, embedding)}` for the ids that exist (one round trip).

        What receipt verification reads: the vector is compared with the
        digest the receipt attests.
        """
        if not ids:
            return {}
        return await self._read_vectors(list(ids), ["documents", "metadatas", "embeddings"])

    async def embed(self, documents: Sequence[str], *, keep: bool = False) -> list[list[float]]:
        """rem's vectors for `documents`, rounded to float32 as Chroma stores them.

        Rounded here so that what a receipt's digest covers is exactly what the
        server keeps (a float32 value survives the JSON round trip unchanged).
        In a thread: a model embedder waits on the network (and on its retries'
        backoff). A model failure is EmbeddingFailed: nothing is written.

        `keep`: hold each vector until the next `embed` of the same document
        takes it (`rem reindex` records a vector in a receipt, then writes that
        receipt's row: one embedding per summary, and the row gets exactly the
        vector recorded, even from a remote model that is not bit-for-bit
        deterministic). `forget_kept()` drops what nobody took.
        """
        unique = dict.fromkeys(documents)
        kept = {d: self._kept.pop(d) for d in unique if d in self._kept}
        missing = [d for d in unique if d not in kept]
        fresh = dict(zip(missing, await self._embed_now(missing), strict=True)) if missing else {}
        if keep:
            self._kept.update(fresh)
        return [kept[d] if d in kept else fresh[d] for d in documents]

    def forget_kept(self) -> int:
        """Drop the kept vectors nobody took; how many."""
        dropped = len(self._kept)
        self._kept.clear()
        return dropped

    async def _embed_now(self, documents: list[str]) -> list[list[float]]:
        try:
            vectors = await asyncio.to_thread(self.embedder.embed, documents)
        except ModelError as exc:
            raise EmbeddingFailed(
                f"the embedding model failed ({exc.error_class}: {exc}); nothing was written to Chroma, "
                "and the staged receipts are replayed once it answers"
            ) from exc
        return [list(array("f", vector)) for vector in vectors]

    async def upsert(
        self,
        ids: Sequence[str],
        documents: Sequence[str],
        metadatas: Sequence[Metadata] | None,
        *,
        embeddings: Sequence[Sequence[float]] | None = None,
        embed_texts: Sequence[str] | None = None,
    ) -> None:
        """Write rows with rem's embeddings; metadata merges into what is there.

        The vectors are `embeddings` when given, else rem's embeddings of
        `embed_texts` (else of the documents), rounded to float32 either way.
        """
        self._refuse_write("an upsert")
        if not ids:
            return
        if embeddings is not None:
            vectors = [list(array("f", v)) for v in embeddings]
        else:
            vectors = await self.embed(list(embed_texts if embed_texts is not None else documents))

        def write(c: Any) -> None:
            c.upsert(
                ids=list(ids),
                documents=list(documents),
                embeddings=vectors,
                # None: rows without metadata (Chroma refuses an empty dict, which stays refused)
                metadatas=None if metadatas is None else [dict(m) for m in metadatas],
            )

        await self._run(write)

    async def nearest(
        self, embedding: Sequence[float], n: int, where: Metadata | None = None
    ) -> list[tuple[str, float]]:
        """(id, distance) of the `n` nearest rows (matching `where`), nothing else (the fast query)."""

        def search(c: Any) -> list[tuple[str, float]]:
            result = c.query(
                query_embeddings=[list(embedding)], n_results=n, where=where or None, include=["distances"]
            )
            return list(zip(result["ids"][0], (float(d) for d in result["distances"][0]), strict=True))

        return cast(list[tuple[str, float]], await self._run(search))

    async def query(
        self, embedding: Sequence[float], n: int, where: Metadata | None = None
    ) -> list[tuple[str, float, str | None, Metadata]]:
        """The `n` nearest rows to `embedding` (matching `where`): (id, distance, document, metadata)."""

        def search(c: Any) -> list[tuple[str, float, str | None, Metadata]]:
            result = c.query(
                query_embeddings=[list(embedding)],
                n_results=n,
                where=where or None,
                include=["distances", "documents", "metadatas"],
            )
            ids, distances = result["ids"][0], result["distances"][0]
            documents, metadatas = result["documents"][0], result["metadatas"][0]
            return [
                (ids[i], float(distances[i]), documents[i], dict(metadatas[i] or {})) for i in range(len(ids))
            ]

        return cast(list[tuple[str, float, str | None, Metadata]], await self._run(search))

    async def nearest_among(
        self,
        ids: Sequence[str],
        embedding: Sequence[float],
        n: int,
        versions: Mapping[str, Hashable | None] | None = None,
    ) -> list[tuple[str, float, str | None, Metadata]]:
        """`query` restricted to the rows `ids` (those that exist), ranked here by cosine distance.

        One fetch by id instead of a `where`-filtered search: on a collection of
        118 000 rows Chroma took 310 / 490 ms (p50 / p95) to answer a search
        filtered to one project's 78 rows, and 12-24 ms to return them by id.
        `versions`: each row's version as the caller read it (None: being written);
        a row kept under that version (`row_cache`) is not fetched again.
        """
        if not ids or n <= 0:
            return []
        versions = versions or {}
        rows = {i: row for i in ids if (row := self.row_cache.get(i, versions.get(i))) is not None}
        missing = [i for i in ids if i not in rows]
        if missing:
            include = ["embeddings", "documents", "metadatas"]
            fetched = await self._run(lambda c: cached_rows(c.get(ids=missing, include=include)))
            for row_id, row in fetched.items():
                self.row_cache.put(row_id, versions.get(row_id), row)
            rows.update(fetched)
        found = [i for i in ids if i in rows]
        order = ranked(found, [rows[i].embedding for i in found], embedding)[:n]
        return [
            (found[i], distance, rows[found[i]].document, dict(rows[found[i]].metadata))
            for i, distance in order
        ]

    async def nearest_by_id(
        self, ids: Sequence[str], embedding: Sequence[float], n: int
    ) -> list[tuple[str, float]]:
        """`nearest` restricted to the rows `ids` (those that exist): (id, cosine distance), by id fetch."""
        if not ids or n <= 0:
            return []

        def read(c: Any) -> list[tuple[str, float]]:
            result = c.get(ids=list(ids), include=["embeddings"])
            found = result["ids"]
            return [
                (found[i], distance) for i, distance in ranked(found, result["embeddings"], embedding)[:n]
            ]

        return cast(list[tuple[str, float]], await self._run(read))

    async def update_metadata(self, ids: Sequence[str], metadatas: Sequence[Metadata]) -> None:
        """Merge metadata into existing rows (`None` deletes a key)."""
        self._refuse_write("an update")
        if not ids:
            return
        await self._run(lambda c: c.update(ids=list(ids), metadatas=[dict(m) for m in metadatas]))

    async def delete(self, ids: Sequence[str]) -> None:
        self._refuse_write("a delete")
        if ids:
            await self._run(lambda c: c.delete(ids=list(ids)))

    async def collection_names(self, prefix: str = "") -> list[str]:
        """Names of the server's collections that start with `prefix`."""

        def names(client: Any) -> list[str]:
            found = [str(getattr(c, "name", c)) for c in client.list_collections()]
            return sorted(n for n in found if n.startswith(prefix))

        return cast(list[str], await self._run_on_client(names))

    async def exists(self) -> bool:
        """Whether the collection exists (without creating it)."""
        return self.collection_name in await self.collection_names()

    async def drop(self) -> bool:
        """Delete the whole collection (the next call recreates it with our embedder); False if absent."""
        self._refuse_write("a drop")

        def delete(client: Any) -> bool:
            self._collection = None
            try:
                client.delete_collection(self.collection_name)
            except Exception as exc:
                if type(exc).__name__ == "NotFoundError" or "does not exist" in str(exc):
                    return False
                raise
            return True

        return bool(await self._run_on_client(delete))

    async def page(self, offset: int, limit: int) -> dict[str, tuple[str | None, Metadata]]:
        """One page of rows (documents and metadata), in Chroma's order."""

        def read(c: Any) -> dict[str, tuple[str | None, Metadata]]:
            result = c.get(include=["documents", "metadatas"], limit=limit, offset=offset)
            documents, metadatas = result["documents"], result["metadatas"]
            return {
                row_id: (documents[i], dict(metadatas[i] or {})) for i, row_id in enumerate(result["ids"])
            }

        return cast(dict[str, tuple[str | None, Metadata]], await self._run(read))

    async def count(self) -> int:
        return int(await self._run(lambda c: int(c.count())))

    async def all_ids(self, page: int = 5000) -> list[str]:
        """Every id in the collection, paged."""
        ids: list[str] = []
        offset = 0
        while True:
            batch = await self._run(partial(_page_of_ids, limit=page, offset=offset))
            ids.extend(batch)
            if len(batch) < page:
                return ids
            offset += page


def _live_rows(result: Any) -> dict[str, LiveRow] | str:
    """The rows of a `get` with vectors; a description of the problem when the vectors are short."""
    found, vectors = result["ids"], result.get("embeddings")
    if found and (vectors is None or len(vectors) != len(found)):
        return f"{len(found)} rows came back with {0 if vectors is None else len(vectors)} vectors"
    if vectors is not None and len(vectors):
        # import time: numpy, only for vectors Chroma handed back
        import numpy  # one float64 matrix for the batch: each row's vector is a view of it

        vectors = numpy.asarray(vectors, dtype=numpy.float64)
    documents, metadatas = result["documents"], result["metadatas"]
    return {
        str(row_id): LiveRow(documents[i], dict(metadatas[i] or {}), vectors[i])
        for i, row_id in enumerate(found)
    }
