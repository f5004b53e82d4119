"""The built-in model embedder: any OpenAI-compatible `/embeddings` endpoint.

`REM_EMBEDDER=openai` with `REM_EMBEDDING_MODEL`. The embedder interface is
synchronous (rem runs it in a worker thread), so this uses the SDK's
synchronous client, with the same retries, request cap and records as chat
requests. The vectors must keep one dimension for the life of a Chroma
collection: changing the model means `rem reindex` into a fresh collection.
Each text is cut to its first `REM_EMBED_MAX_TOKENS` tokens before it is sent
(`backend.models.tokens.clip_to_tokens`): an endpoint refuses a text over
its model's context (OpenAI's: 8191 tokens), and nothing is sent whole.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from backend.models import health
from backend.models.config import ModelConfig
from backend.models.errors import ModelError, ModelErrorClass
from backend.models.health import CallKind, CallRecord
from backend.models.tokens import clip_to_tokens

BATCH = 256


class OpenAIEmbedder:
    """Embeddings from the configured embedding model, in batches."""

    def __init__(self, config: ModelConfig | None = None) -> None:
        self.config = config or ModelConfig.from_settings()
        self.model = self.config.require_embedding_model()
        self.name = f"openai:{self.model}"
        self.dim = 0  # known after the first answer
        self._client: Any = None
        self._slots = threading.BoundedSemaphore(self.config.concurrency)
        self._lock = threading.Lock()

    def _sdk(self) -> Any:
        with self._lock:
            if self._client is None:
                # import time: the openai SDK costs seconds: only when a model embedder is actually used
                import openai

                c = self.config
                self._client = openai.OpenAI(
                    base_url=c.base_url,
                    api_key=c.api_key,
                    max_retries=0,
                    timeout=openai.Timeout(
                        c.request_timeout_s, connect=c.connect_timeout_s, read=c.read_timeout_s
                    ),
                )
            return self._client

    def embed(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), BATCH):
            vectors += self._embed_batch(clip_to_tokens(texts[start : start + BATCH]))
        return vectors

    def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        # import time: the openai SDK, only when a model embedder is used
        from backend.models.classify import classify
        from backend.models.client import final_error, retry_wait

        client = self._sdk()
        attempt = 0
        while True:
            attempt += 1
            call = CallRecord(CallKind.EMBEDDING, self.config.endpoint, self.model, attempt)
            started = time.perf_counter()
            try:
                with self._slots:
                    result = client.embeddings.create(model=self.model, input=batch, encoding_format="float")
                vectors = [list(item.embedding) for item in sorted(result.data, key=lambda d: d.index)]
                if len(vectors) != len(batch) or len({len(v) for v in vectors}) != 1:
                    raise ModelError(
                        ModelErrorClass.BAD_RESPONSE,
                        f"{len(vectors)} embeddings of mixed sizes for {len(batch)} texts",
                    )
            except Exception as exc:  # classified, counted, retried with backoff
                error = classify(exc, mid_stream=False)
                message = self.config.scrub(str(error))
                call.outcome, call.status, call.error = error.error_class, error.status, message[:500]
                call.duration_ms = (time.perf_counter() - started) * 1000
                health.record(call)
                wait = retry_wait(self.config, error, attempt)
                if wait is None:
                    raise final_error(self.config, error, attempt) from None
                time.sleep(wait)
                continue
            call.duration_ms = (time.perf_counter() - started) * 1000
            call.tokens_in = getattr(result.usage, "prompt_tokens", None)
            health.record(call)
            self.dim = len(vectors[0])
            return vectors
