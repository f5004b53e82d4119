"""Rows of one collection as last fetched, each kept under the version its caller read for it.

Recall ranks a project's summary rows on every query; fetching them from Chroma
(vectors, documents, metadata) was its slowest step. The caller names each
row's version from the state store (`vector_search.summary_rows`): a row is
taken from here only under the same version it was fetched under, so a row
rewritten since (under a new version) is fetched again, and a row with no
version (being written) is never kept. Least recently used rows go first past
`limit`. Thread-safe (a store is used from worker threads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

# ~1 KB of vector and a few KB of text a summary row: at most some tens of MB a process
CACHED_ROWS = 10_000


class CachedRow(NamedTuple):
    """A fetched row: its vector (as chromadb returned it), document and metadata."""

    embedding: Any
    document: str | None
    metadata: dict[str, Any]


class RowCache:
    """Rows by id, each valid for the one version it was fetched under (LRU, at most `limit`)."""

    def __init__(self, limit: int = CACHED_ROWS) -> None:
        self.limit = limit
        self._rows: OrderedDict[str, tuple[Hashable, CachedRow]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, row_id: str, version: Hashable | None) -> CachedRow | None:
        """The row kept under `version`, or None (not kept, kept under another, or no version)."""
        if version is None:
            return None
        with self._lock:
            kept = self._rows.get(row_id)
            if kept is None or kept[0] != version:
                return None
            self._rows.move_to_end(row_id)
            return kept[1]

    def put(self, row_id: str, version: Hashable | None, row: CachedRow) -> None:
        """Keep `row` under `version` (a row without a version is dropped, not kept)."""
        with self._lock:
            if version is None:
                self._rows.pop(row_id, None)
                return
            self._rows[row_id] = (version, row)
            self._rows.move_to_end(row_id)
            while len(self._rows) > self.limit:
                self._rows.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()

    def __len__(self) -> int:
        return len(self._rows)


def cached_rows(result: Any) -> dict[str, CachedRow]:
    """The rows of a chromadb `get` of vectors, documents and metadata, by id."""
    vectors, documents, metadatas = result["embeddings"], result["documents"], result["metadatas"]
    return {
        str(row_id): CachedRow(vectors[i], documents[i], dict(metadatas[i] or {}))
        for i, row_id in enumerate(result["ids"])
    }


def ranked(ids: Sequence[str], embeddings: Any, embedding: Sequence[float]) -> list[tuple[int, float]]:
    """(index, cosine distance) of each fetched row (`ids`, `embeddings` in the same order), nearest first
    (ties by id)."""
    if not ids:
        return []
    # import time: numpy, chromadb's own dependency: every rem command would pay ~0.3 s for it
    import numpy as np

    query = np.asarray(embedding, dtype=np.float64)
    matrix = np.asarray(embeddings, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1) * (np.linalg.norm(query) or 1.0)
    distances = 1.0 - (matrix @ query) / np.where(norms > 0, norms, 1.0)
    order = sorted(range(len(ids)), key=lambda i: (float(distances[i]), ids[i]))
    return [(i, float(distances[i])) for i in order]
