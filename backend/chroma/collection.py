"""rem's access to its Chroma collection over HTTP, with rem's own embeddings.

All calls run in a thread (the chromadb client is synchronous) and map
transport failures to `ChromaUnreachable`. On failure the client is dropped
and the server re-resolved on the next call, so a Chroma restart (even on a
new port) is picked up without restarting the daemon.

Semantics relied on (and proven by tests/backend/test_chroma_witness.py
against a real server): `upsert` and `update` *merge* metadata (keys not named
are kept, a `None` value deletes a key, `{}` is refused), and values round-trip
with their type (`1`, `1.0` and `True` stay distinct).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from array import array
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

from backend.chroma import auth
from backend.chroma.embedder import Embedder, load_embedder
from backend.core.errors import ChromaNotReady, ChromaUnreachable, ReadOnly
from backend.core.settings import Settings
from backend.models.errors import ModelError

log = logging.getLogger("rem.chroma_store")

COLLECTION = Settings.chroma_collection.default
Metadata = dict[str, Any]


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
# (its vector index is neither cached nor persisted yet), or with the rows but fewer vectors.
# The same read succeeds moments later, so reads of vectors retry with these pauses (3.15 s
# in all) before giving up.
VECTOR_INDEX_NOT_READY = "Nothing found on disk"
VECTOR_READ_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)


def _vector_index_not_ready(exc: BaseException) -> bool:
    return type(exc).__name__ == "InternalError" and VECTOR_INDEX_NOT_READY in str(exc)


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


EMPTY_COLLECTION = _EmptyCollection()


def _page_of_ids(collection: Any, *, limit: int, offset: int) -> Any:
    return collection.get(include=[], limit=limit, offset=offset)


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
    ) -> None:
        self._resolve = url_resolver
        self.collection_name = collection
        # read-only: never create the collection, never write (a missing collection reads as empty)
        self.read_only = read_only
        self.embedder = embedder or load_embedder()
        self._collection: Any = None
        self._url: str | None = None
        self._guard = threading.Lock()

    @property
    def url(self) -> str | None:
        return self._url

    def _connect(self) -> Any:
        import chromadb
        from chromadb.config import Settings
        from chromadb.errors import NotFoundError

        url = self._resolve()
        from urllib.parse import urlparse

        parsed = urlparse(url)
        client = chromadb.HttpClient(
            host=parsed.hostname or "127.0.0.1",
            port=parsed.port or (443 if parsed.scheme == "https" else 80),
            ssl=parsed.scheme == "https",
            settings=Settings(anonymized_telemetry=False, **auth.client_settings()),
        )
        self._url = url
        # embedding_function=None: Chroma's default would download a model.
        if self.read_only:
            try:
                return client.get_collection(self.collection_name, embedding_function=None)
            except NotFoundError:
                return None  # not created yet: nothing to read, and read-only creates nothing
        return client.get_or_create_collection(
            self.collection_name, embedding_function=None, metadata={"hnsw:space": "cosine"}
        )

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        with self._guard:
            try:
                if self._collection is None:
                    self._collection = self._connect()
                if self._collection is None:
                    return fn(EMPTY_COLLECTION)  # looked up again next call: it may exist by then
                return fn(self._collection)
            except ChromaUnreachable:
                self._collection = None
                raise
            except Exception as exc:
                if _is_transport_error(exc):
                    self._collection = None
                    raise ChromaUnreachable(
                        f"Chroma at {self._url or 'its URL'} stopped answering ({type(exc).__name__}); "
                        "rem retries, or check `rem status`"
                    ) from exc
                raise

    async def _run(self, fn: Callable[[Any], Any]) -> Any:
        return await asyncio.to_thread(self._call, fn)

    async def get(self, ids: Sequence[str], *, include_embeddings: bool = False) -> dict[str, ChromaRow]:
        """`{id: ChromaRow(document, metadata)}` for the ids that exist (one round trip)."""
        include = ["documents", "metadatas"] + (["embeddings"] if include_embeddings else [])
        if not ids:
            return {}
        result = await self._run(lambda c: c.get(ids=list(ids), include=include))
        rows: dict[str, ChromaRow] = {}
        for i, row_id in enumerate(result["ids"]):
            rows[row_id] = ChromaRow(
                document=result["documents"][i], metadata=dict(result["metadatas"][i] or {})
            )
        return rows

    def _refuse_write(self, what: str) -> None:
        if self.read_only:
            raise ReadOnly(f"refused {what} of Chroma rows: this rem is read-only")

    async def _read_vectors(self, ids: list[str], include: list[str]) -> Any:
        """`collection.get` of rows with their vectors, through Chroma's not-ready window."""
        for pause in (*VECTOR_READ_PAUSES, None):
            try:
                result = await self._run(lambda c: c.get(ids=ids, include=include))
                vectors = result.get("embeddings")
                if not result["ids"] or (vectors is not None and len(vectors) == len(result["ids"])):
                    return result
                problem = f"{len(result['ids'])} rows came back with {0 if vectors is None else len(vectors)} vectors"
            except Exception as exc:
                if not _vector_index_not_ready(exc):
                    raise
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
        include = ["documents", "metadatas", "embeddings"]
        result = await self._read_vectors(list(ids), include)
        vectors = result.get("embeddings")
        if vectors is not None and len(vectors):
            import numpy  # one float64 matrix for the batch: each row's vector is a view of it

            vectors = numpy.asarray(vectors, dtype=numpy.float64)
        return {
            row_id: LiveRow(
                result["documents"][i],
                dict(result["metadatas"][i] or {}),
                vectors[i],
            )
            for i, row_id in enumerate(result["ids"])
        }

    async def embed(self, documents: Sequence[str]) -> list[list[float]]:
        """rem's vectors for `documents`, rounded to float32 as Chroma stores them.

        Rounded here so that what a receipt's digest covers is exactly what the
        server keeps (a float32 value survives the JSON round trip unchanged).
        In a thread: a model embedder waits on the network (and on its retries'
        backoff). A model failure is EmbeddingFailed: nothing is written.
        """
        try:
            vectors = await asyncio.to_thread(self.embedder.embed, list(documents))
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
        metadatas: Sequence[Metadata],
        *,
        embeddings: Sequence[Sequence[float]] | None = None,
    ) -> None:
        """Write rows with rem's embeddings (`embeddings`, else embedded now); metadata merges into what is there."""
        self._refuse_write("an upsert")
        if not ids:
            return
        vectors = (
            await self.embed(documents) if embeddings is None else [list(array("f", v)) for v in embeddings]
        )
        await self._run(
            lambda c: c.upsert(
                ids=list(ids),
                documents=list(documents),
                embeddings=vectors,
                metadatas=[dict(m) for m in metadatas],
            )
        )

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

    async def count(self) -> int:
        return int(await self._run(lambda c: c.count()))

    async def all_ids(self, page: int = 5000) -> list[str]:
        """Every id in the collection, paged."""
        ids: list[str] = []
        offset = 0
        while True:
            batch = await self._run(partial(_page_of_ids, limit=page, offset=offset))
            ids.extend(batch["ids"])
            if len(batch["ids"]) < page:
                return ids
            offset += page
