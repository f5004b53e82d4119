"""What one embedding call receives is bounded: a text's first `REM_EMBED_MAX_TOKENS` tokens.

WordLlama used to pad a batch to its longest text: one 50 MB turn next to a
short one asked numpy for gigabytes. Now each text is cut to its first N
tokens, and the pooling pads only texts of similar length together, giving
exactly the vectors WordLlama's own `embed` gives for texts within the bound.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from wordllama.inference import WordLlamaInference

from backend.chroma.embedder import HashingEmbedder, WordLlamaEmbedder
from backend.models.embedder import OpenAIEmbedder
from backend.models.tokens import clip_to_tokens, tokenizer
from tests.fake_openai import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[2]

TEXTS = [
    "My dog Biscuit loves the beach.",
    "",
    "   ",
    "日本語のテキストと emoji 🎉",
    *[f"turn {i} about the nightly ledger export " * (1 + i % 9) for i in range(300)],
]


@pytest.fixture(scope="module")
def wordllama() -> WordLlamaEmbedder:
    return WordLlamaEmbedder()


def test_wordllama_vectors_equal_wordllamas_own_for_texts_within_the_bound(
    wordllama: WordLlamaEmbedder,
) -> None:
    model = wordllama.model()
    own = WordLlamaInference(model.embedding[:-1], model.tokenizer)  # the table without rem's padding row
    try:
        expected = own.embed([t if t.strip() else wordllama.BLANK for t in TEXTS], norm=True, batch_size=512)
    finally:
        model.tokenizer.no_padding()
    assert np.array_equal(wordllama.embed_array(TEXTS), expected)


def test_a_huge_text_is_embedded_by_its_first_tokens_in_bounded_memory(
    wordllama: WordLlamaEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_EMBED_MAX_TOKENS", "64")
    head = "the export window closed before the ledger job finished its retries " * 8
    huge = head + "unrelated filler words " * 2_500_000  # 57 MB
    ids = tokenizer().encode(head, add_special_tokens=False).ids
    assert len(ids) > 64
    wordllama.model()
    tracemalloc.start()
    try:
        vectors = wordllama.embed_array([huge, "short"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, peak  # the 57 MB text is never copied, tokenized or padded whole
    assert wordllama.token_ids([huge])[0] == ids[:64]
    assert np.array_equal(vectors[0], wordllama._pool(np, [ids[:64]])[0])


def test_the_hashing_embedder_reads_only_the_first_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REM_EMBED_MAX_TOKENS", "16")
    hashing = HashingEmbedder()
    words = " ".join(f"w{i}" for i in range(16))
    assert hashing.embed([words + " and then a great many more" * 1000]) == hashing.embed([words])


def test_a_remote_embedder_is_sent_each_text_cut_to_the_bound(
    fake_model: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REM_EMBEDDING_MODEL", "text-embedding-3-small")
    monkeypatch.setenv("REM_EMBED_MAX_TOKENS", "100")
    long = "the ledger export stalled again " * 5000
    vectors = OpenAIEmbedder().embed([long, "short one"])
    assert len(vectors) == 2
    (request,) = [r for r in fake_model.requests() if r.path == "/v1/embeddings"]
    sent = request.body["input"]
    assert sent[1] == "short one" and long.startswith(sent[0])
    assert len(tokenizer().encode(sent[0], add_special_tokens=False).ids) == 100
    assert clip_to_tokens([long]) == [sent[0]]


def test_loading_wordllama_leaves_the_callers_logging_as_it_was() -> None:
    # wordllama's import calls `logging.basicConfig(level=INFO)`: a library caller that had not
    # configured logging then printed every HTTP request to Chroma on stderr
    probe = (
        "import logging\n"
        "from backend.chroma.embedder import WordLlamaEmbedder\n"
        "WordLlamaEmbedder().embed(['hello'])\n"
        "root = logging.getLogger()\n"
        "print(root.level, len(root.handlers))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == [str(logging.WARNING), "0"]
