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
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from pathlib import Path
from typing import Any, Protocol

from backend.core.errors import UsageError
from backend.core.plugins import load_plugin
from backend.core.settings import settings

_WORD = re.compile(r"\w+", re.UNICODE)


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
        words = [w.lower() for w in _WORD.findall(text)]
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

    config = "l2_supercat"
    dim = 256
    name = f"wordllama-{config}-{dim}"
    # a blank text embeds to a zero vector, which cosine distance cannot rank
    BLANK = "(empty)"

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    def model(self) -> Any:
        """The loaded WordLlama model (loaded once per process, thread-safe)."""
        with self._lock:
            if self._model is None:
                self._model = self._load()
            return self._model

    def _load(self) -> Any:
        try:
            import wordllama
            from wordllama import WordLlama
        except ImportError as exc:
            raise EmbedderUnavailable(
                f"REM_EMBEDDER=wordllama needs the wordllama package ({exc}); "
                "reinstall rem (`pip install -e .`) or set REM_EMBEDDER=hashing"
            ) from None
        package_dir = Path(wordllama.__file__).parent  # holds weights/ and tokenizers/
        try:
            return WordLlama.load(
                config=self.config, dim=self.dim, cache_dir=package_dir, disable_download=True
            )
        except Exception as exc:  # a wheel without its weights: say so, never download
            raise EmbedderUnavailable(
                f"WordLlama weights for {self.config}/{self.dim} are not in {package_dir} "
                f"({type(exc).__name__}: {exc}); reinstall wordllama or set REM_EMBEDDER=hashing"
            ) from None

    def embed_array(self, texts: list[str]) -> Any:
        """L2-normalised float32 vectors as one numpy array (rows in `texts` order)."""
        cleaned = [t if t.strip() else self.BLANK for t in texts]
        return self.model().embed(cleaned, norm=True, batch_size=512)

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        vectors: list[list[float]] = self.embed_array(texts).tolist()
        return vectors


def load_embedder() -> Embedder:
    """The configured embedder (`REM_EMBEDDER`: a `rem.embedders` name or module:factory)."""
    embedder: Embedder = load_plugin("rem.embedders", settings.embedder, "REM_EMBEDDER")
    return embedder
