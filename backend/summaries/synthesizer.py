"""Summary synthesis: a pluggable model call with an honest offline default.

The default `ExtractiveSynthesizer` is deterministic and needs no model: it
scores every sentence of the raw turns by the frequency of its content words
and keeps the best few in transcript order, then derives a title, a category
and keywords from the same words. A real model plugs in through
`REM_SYNTHESIZER=module:factory` (the factory returns a `Synthesizer`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from backend.core.plugins import load_plugin
from backend.core.settings import settings

Turn = Mapping[str, Any]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"[^\W\d_][\w'-]*", re.UNICODE)
STOPWORDS = frozenset(
    """
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further had has
have having he her here hers herself him himself his how i if in into is it its itself just let me
more most my myself no nor not now of off on once only or other our ours ourselves out over own same
she should so some such than that the their theirs them themselves then there these they this those
through to too under until up very was we were what when where which while who whom why will with
would you your yours yourself yourselves ok okay yes please thanks thank sure like get got one two
use using want need make made see say said well still even much many may might must shall
""".split()
)

# category -> words that vote for it; the category with most votes wins
CATEGORIES: dict[str, frozenset[str]] = {
    "code": frozenset(
        """code python function error bug test tests stack traceback compile api sql
        database query class method exception import module script debug refactor type types
        variable commit branch merge build""".split()
    ),
    "operations": frozenset(
        """deploy deployment server incident outage latency restart kubernetes
        disk memory cpu alert alerts pager rollback backup cluster node nodes service logs
        monitoring uptime load""".split()
    ),
    "planning": frozenset(
        """plan plans schedule roadmap deadline meeting milestone milestones
        priority priorities timeline goal goals week weeks quarter sprint task tasks""".split()
    ),
    "writing": frozenset(
        """write draft essay email letter edit rewrite paragraph story article
        blog tone wording outline""".split()
    ),
    "research": frozenset(
        """research paper papers study data analysis compare evidence source
        sources experiment results hypothesis""".split()
    ),
}


@dataclass(frozen=True)
class Synthesis:
    """A synthesized summary: the document Chroma stores and its descriptive metadata."""

    document: str
    title: str
    category: str
    keywords: list[str]


class Synthesizer(Protocol):
    """A summary model: turns in canonical order in, a `Synthesis` out."""

    name: str

    async def synthesize(self, session_id: str, turns: Sequence[Turn]) -> Synthesis: ...


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _content_words(text: str) -> list[str]:
    return [w for w in _words(text) if len(w) > 2 and w not in STOPWORDS]


def _sentences(turns: Sequence[Turn]) -> list[tuple[str, str]]:
    """(role, sentence) pairs in transcript order."""
    out = []
    for turn in turns:
        for piece in _SENTENCE_END.split(str(turn.get("text") or "")):
            piece = " ".join(piece.split())
            if piece:
                out.append((str(turn.get("role", "user")), piece))
    return out


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0].rstrip(",;:-")
    return (cut or text[:limit]) + "…"


class ExtractiveSynthesizer:
    """Frequency-scored extractive summary; deterministic, offline."""

    name = "rem-extractive-v1"

    def __init__(self, max_sentences: int = 5, max_keywords: int = 8) -> None:
        self.max_sentences = max_sentences
        self.max_keywords = max_keywords

    async def synthesize(self, session_id: str, turns: Sequence[Turn]) -> Synthesis:
        return self.summarize(turns)

    def summarize(self, turns: Sequence[Turn]) -> Synthesis:
        """The synthesis of a session's raw turns."""
        sentences = _sentences(turns)
        freq = Counter(w for _, s in sentences for w in _content_words(s))
        keywords = [w for w, _ in sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))[: self.max_keywords]]
        chosen = self._top_sentences(sentences, freq)
        title = self._title(sentences, keywords)
        lines = [f"{role}: {_shorten(text, 400)}" for role, text in chosen]
        header = f"{title} ({len(turns)} turns)"
        document = "\n".join([header, *lines]) if lines else header
        return Synthesis(
            document=document, title=title, category=self._category(freq, sentences), keywords=keywords
        )

    def _top_sentences(self, sentences: list[tuple[str, str]], freq: Counter[str]) -> list[tuple[str, str]]:
        def score(item: tuple[int, tuple[str, str]]) -> tuple[float, int]:
            words = set(_content_words(item[1][1]))
            return (-sum(freq[w] for w in words) / math.sqrt(len(words) + 1), item[0])

        ranked = sorted(enumerate(sentences), key=score)[: self.max_sentences]
        return [sentence for _, sentence in sorted(ranked)]

    @staticmethod
    def _title(sentences: list[tuple[str, str]], keywords: list[str]) -> str:
        first_user = next((s for role, s in sentences if role == "user"), None)
        if first_user:
            return _shorten(first_user.rstrip(".!? "), 80)
        return ", ".join(keywords[:3]).capitalize() or "Untitled session"

    @staticmethod
    def _category(freq: Counter[str], sentences: list[tuple[str, str]]) -> str:
        votes = {name: sum(freq[w] for w in words) for name, words in CATEGORIES.items()}
        best = max(votes, key=lambda name: (votes[name], -list(CATEGORIES).index(name)))
        if votes[best] > 0:
            return best
        questions = sum(1 for role, s in sentences if role == "user" and s.endswith("?"))
        return "question" if questions else "general"


def load_synthesizer() -> Synthesizer:
    """The configured synthesizer (`REM_SYNTHESIZER`: a `rem.synthesizers` name or module:factory)."""
    synthesizer: Synthesizer = load_plugin(
        "rem.synthesizers", settings.synthesizer, "REM_SYNTHESIZER", Synthesizer
    )
    return synthesizer
