"""Token budgets for embedding calls: what one text may hand an embedder.

Counted with WordLlama's tokenizer (Llama 2's, shipped in the `wordllama`
wheel), the default embedder's own; for a remote embedder it is an estimate
on the safe side (it splits English into more tokens than OpenAI's), so a
text cut to N of its tokens is at most about N of the endpoint's.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backend.core.settings import settings

WORDLLAMA_CONFIG = "l2_supercat"
# a generous ceiling of characters a token: a text cut here still holds its first N tokens,
# and the tokenizer never sees more than this of a huge text
CHARS_PER_TOKEN = 16
# where texts are cut when the tokenizer is missing (about 4 characters a token in English)
CHARS_PER_TOKEN_TYPICAL = 4

_lock = threading.Lock()
_loaded: list[Any] = []


def clip_chars(text: str, max_tokens: int) -> str:
    """The part of `text` that can hold its first `max_tokens` tokens (a cheap cut before tokenizing)."""
    return text[: max_tokens * CHARS_PER_TOKEN]


def tokenizer() -> Any:
    """WordLlama's tokenizer alone (no weights, no padding), or None when the wheel lacks it."""
    with _lock:
        if not _loaded:
            try:
                # import time: WordLlama's tokenizer, only when a text is counted
                import wordllama
                from tokenizers import Tokenizer

                folder = Path(wordllama.__file__).parent / "tokenizers"
                loaded = Tokenizer.from_file(str(folder / f"{WORDLLAMA_CONFIG}_tokenizer_config.json"))
                loaded.no_padding()
                loaded.no_truncation()
            except Exception:  # no wordllama, or no tokenizer file: `clip_to_tokens` cuts by characters
                loaded = None
            _loaded.append(loaded)
        return _loaded[0]


def clip_to_tokens(texts: Sequence[str]) -> list[str]:
    """Each text cut to its first `REM_EMBED_MAX_TOKENS` tokens, as text (what a remote embedder is sent)."""
    limit = settings.embed_max_tokens
    counter = tokenizer()
    if counter is None:
        return [t[: limit * CHARS_PER_TOKEN_TYPICAL] for t in texts]
    clipped = [clip_chars(t, limit) for t in texts]
    encoded = counter.encode_batch(clipped, add_special_tokens=False)
    return [
        text if len(encoding.ids) <= limit else text[: encoding.offsets[limit - 1][1]]
        for text, encoding in zip(clipped, encoded, strict=True)
    ]
