"""Offline embeddings: rem always passes its own vectors to Chroma.

Chroma's default embedding function downloads a model at run time, which fails
offline; rem never lets it run. The default is `WordLlamaEmbedder`: a real
semantic embedder whose 256-d weights and tokenizer ship inside the
`wordllama` wheel, loaded from the package directory with downloads disabled
(~25 ms per 1 000 texts on this machine). `HashingEmbedder` (name `hashing`)
is a signed feature-hashing bag of words and character trigrams: no model at
all, lexical only. Others plug in through `REM_EMBEDDER` (a `rem.embedders`
entry-point name or `module:factory`).

Every embedder has a `name` and a `dim`; a Chroma collection records both
(`backend.chroma.collection`) and refuses vectors from another embedder.

No text is embedded whole: each is cut to its first `REM_EMBED_MAX_TOKENS`
tokens (WordLlama's tokenizer; the hashing embedder's words), after a cut
to `backend.models.tokens.CHARS_PER_TOKEN` characters a token so the tokenizer never sees a huge
text either. WordLlama's own `embed` pads a batch to its longest text (one
50 MB turn in a batch of two asked numpy for 1.3 GB a text), so rem pools
each text's token vectors itself, a bounded block of tokens at a time
(and faster: texts of similar length are padded together).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from backend.core.errors import UsageError
from backend.core.plugins import load_plugin
from backend.core.settings import settings
from backend.models.tokens import WORDLLAMA_CONFIG, clip_chars

_WORD = re.compile(r"\w+", re.UNICODE)
# token vectors gathered at once when pooling, padding included (x 256 float32: 32 MB)
POOL_BLOCK_TOKENS = 32_768


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: list[str]) -> list[list[float]]: ...


class EmbedderUnavailable(UsageError):
    """The configured embedder cannot load its model."""


class HashingEmbedder:
    """Signed feature hashing of words and trigrams into `dim` buckets, L2-normalised."""

    name = "rem-hashing-v1"

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim

    def _features(self, text: str) -> list[str]:
        limit = settings.embed_max_tokens
        words = [m.group().lower() for m in itertools.islice(_WORD.finditer(clip_chars(text, limit)), limit)]
        grams = [w[i : i + 3] for w in words for i in range(max(1, len(w) - 2))]
        return words + ["#" + g for g in grams]

    def embed_one(self, text: str) -> list[float]:
        vector = [0.0] * self.dim
        for feature in self._features(text):
            digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dim
            sign = 1.0 if digest[4] & 1 else -1.0
            vector[bucket] += sign
        norm = math.sqrt(sum(v * v for v in vector))
        if norm == 0.0:
            vector[0] = 1.0  # Chroma refuses nothing, but cosine needs a non-zero vector
            return vector
        return [v / norm for v in vector]

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_one(t) for t in texts]


class WordLlamaEmbedder:
    """WordLlama (`l2_supercat`, 256-d) from its own wheel: no download, no network, ever.

    The model loads on first use (importing `wordllama` and reading its
    weights takes ~1-2 s), so a process that never embeds never pays for it.
    """

    config = WORDLLAMA_CONFIG
    dim = 256
    name = f"wordllama-{config}-{dim}"
    # a blank text embeds to a zero vector, which cosine distance cannot rank
    BLANK = "(empty)"

    def __init__(self) -> None:
        self._model: Any = None
        self._pad = 0  # the padding token id: the zero row `_load` appends to the table
        self._lock = threading.Lock()

    def model(self) -> Any:
        """The loaded WordLlama model (loaded once per process, thread-safe)."""
        with self._lock:
            if self._model is None:
                self._model = self._load()
            return self._model

    def _load(self) -> Any:
        wordllama = _import_wordllama()
        package_dir = Path(wordllama.__file__).parent  # holds weights/ and tokenizers/
        try:
            model = wordllama.WordLlama.load(
                config=self.config, dim=self.dim, cache_dir=package_dir, disable_download=True
            )
        except Exception as exc:  # a wheel without its weights: say so, never download
            raise EmbedderUnavailable(
                f"WordLlama weights for {self.config}/{self.dim} are not in {package_dir} "
                f"({type(exc).__name__}: {exc}); reinstall wordllama or set REM_EMBEDDER=hashing"
            ) from None
        model.tokenizer.no_padding()  # rem pools each text itself (`embed_array`)
        # a zero row at the end: the padding id, so a padded sum needs no mask
        # import time: numpy, only when something is embedded
        import numpy as np

        self._pad = model.embedding.shape[0]
        model.embedding = np.vstack([model.embedding, np.zeros((1, self.dim), dtype=np.float32)])
        return model

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's first `REM_EMBED_MAX_TOKENS` token ids (a blank text: the `BLANK` text's)."""
        limit = settings.embed_max_tokens
        clipped = [clip_chars(t, limit) for t in texts]
        cleaned = [
            t if t.strip() else self.BLANK for t in clipped
        ]  # strip() on the cut text: no copy of a huge one
        encoded = self.model().tokenizer.encode_batch(cleaned, add_special_tokens=False)
        blank: list[int] | None = None
        ids = []
        for encoding in encoded:
            row = list(encoding.ids[:limit])
            if not row:  # nothing the tokenizer kept: embed it as a blank text
                blank = blank or self.token_ids([self.BLANK])[0]
                row = blank
            ids.append(row)
        return ids

    def embed_array(self, texts: list[str]) -> Any:
        """L2-normalised float32 vectors as one numpy array (rows in `texts` order).

        The mean of each text's token vectors, exactly as WordLlama's `embed(norm=True)`
        computes it, but padded only within groups of texts of similar length, each
        group at most `POOL_BLOCK_TOKENS` tokens padded (WordLlama pads a whole batch
        to its longest text).
        """
        # import time: numpy, only when something is embedded
        import numpy as np

        rows = self.token_ids(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for group in _length_groups(rows):
            out[group] = self._pool(np, [rows[i] for i in group])
        return out

    def _pool(self, np: Any, rows: list[list[int]]) -> Any:
        """The normalised mean token vector of each row of ids (shortest first, padded to the last)."""
        table = self.model().embedding
        padded = np.full((len(rows), len(rows[-1])), self._pad, dtype=np.int64)
        for i, ids in enumerate(rows):
            padded[i, : len(ids)] = ids
        np.clip(padded, 0, self._pad, out=padded)
        lengths = np.array([[len(ids)] for ids in rows], dtype=np.float32)
        means = table[padded].sum(axis=1, dtype=np.float32) / lengths
        return means / np.linalg.norm(means, axis=1, keepdims=True)

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        vectors: list[list[float]] = self.embed_array(texts).tolist()
        return vectors


def load_embedder() -> Embedder:
    """The configured embedder (`REM_EMBEDDER`: a `rem.embedders` name or module:factory)."""
    embedder: Embedder = load_plugin("rem.embedders", settings.embedder, "REM_EMBEDDER", Embedder)
    return embedder


def _length_groups(rows: list[list[int]]) -> Iterator[list[int]]:
    """The indexes of `rows`, shortest first, in groups padding at most `POOL_BLOCK_TOKENS` tokens."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    start = 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and (stop - start + 1) * len(rows[order[stop]]) <= POOL_BLOCK_TOKENS:
            stop += 1
        yield order[start:stop]
        start = stop


def _import_wordllama() -> Any:
    """The wordllama module, or EmbedderUnavailable saying how to get it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        # import time: WordLlama and its weights, only when something is embedded
        import wordllama
    except ImportError as exc:
        raise EmbedderUnavailable(
            f"REM_EMBEDDER=wordllama needs the wordllama package ({exc}); "
            "reinstall rem (`pip install -e .`) or set REM_EMBEDDER=hashing"
        ) from None
    finally:
        # its import calls `logging.basicConfig(level=INFO)`: in a program that had not configured
        # logging (a library caller, a benchmark), every HTTP request to Chroma was then logged
        root.handlers[:] = handlers
        root.setLevel(level)
    return wordllama


# the collection metadata that records which embedder wrote a collection
EMBEDDER_KEY = "rem:embedder"
DIM_KEY = "rem:dim"
# what wrote a collection created before collections recorded their embedder
LEGACY_EMBEDDER = ("rem-hashing-v1", 256)


def embedder_record(embedder: Embedder) -> dict[str, Any]:
    """The collection metadata naming `embedder` (cosine space, its name and dimension)."""
    return {"hnsw:space": "cosine", EMBEDDER_KEY: embedder.name, DIM_KEY: int(embedder.dim)}


def recorded_embedder(metadata: dict[str, Any] | None, count: int) -> tuple[str, int] | None:
    """(name, dim) of the embedder that wrote a collection; None for an empty unrecorded one."""
    metadata = metadata or {}
    if EMBEDDER_KEY in metadata:
        return str(metadata[EMBEDDER_KEY]), int(metadata.get(DIM_KEY) or 0)
    return LEGACY_EMBEDDER if count else None
