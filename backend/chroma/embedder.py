"""Offline embeddings: rem always passes its own vectors to Chroma.

Chroma's default embedding function downloads a model at run time, which fails
offline; rem never lets it run. The default `HashingEmbedder` is a signed
feature-hashing bag of words and character trigrams (deterministic, no model,
no network). A real model plugs in through `REM_EMBEDDER=module:factory`.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Protocol

from backend.core.plugins import load_plugin
from backend.core.settings import settings

_WORD = re.compile(r"\w+", re.UNICODE)


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: list[str]) -> list[list[float]]: ...


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


def load_embedder() -> Embedder:
    """The configured embedder (`REM_EMBEDDER`: a `rem.embedders` name or module:factory)."""
    embedder: Embedder = load_plugin("rem.embedders", settings.embedder, "REM_EMBEDDER")
    return embedder
