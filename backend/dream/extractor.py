"""Dream's offline extraction: entities, concepts and typed relations from raw turn text.

The default `KeywordExtractor` is small and deterministic (no model, no
network): entities are runs of capitalised words ("Chroma Server",
"SQLite", "New York"), concepts are the most frequent non-stopword terms of a
turn, and relations between two entities of one sentence are typed by the
words between them ("X uses Y" -> `uses`, "X depends on Y" -> `depends_on`),
else `co_occurs`. Equal input always gives an equal `Extraction`. A real
model can stand in through the `Extractor` protocol.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

CONCEPTS_PER_TURN = 8
SESSION_TOPICS = 10
MAX_ENTITY_WORDS = 4
MAX_TERM_CHARS = 40
RELATION_GAP_WORDS = 4

STOPWORDS = frozenset(
    """
a about above after again against all also am an and any are aren't as at be because been before
being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
don't down during each either else etc even ever every few for from further get gets got had hadn't
has hasn't have haven't having he he'd he'll he's her here here's hers herself him himself his how
how's however i i'd i'll i'm i've if in into is isn't it it's its itself just let let's like made
make many may me might more most much must mustn't my myself need needs no nor not now of off on once
one only or other ought our ours ourselves out over own please same shall shan't she she'd she'll
she's should shouldn't so some such than thank thanks that that's the their theirs them themselves
then there there's these they they'd they'll they're they've this those though through thus to too
under until up upon us use used uses using very via was wasn't we we'd we'll we're we've well were
weren't what what's when when's where where's whether which while who who's whom whose why why's will
with within without won't would wouldn't yes yet you you'd you'll you're you've your yours yourself
yourselves ok okay sure really thing things want wants way ways also just still yeah
""".split()
)

# words between two entities of a sentence -> relation kind (first match wins)
RELATION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("depends_on", re.compile(r"\b(depends? on|requires?|needs?|relies? on)\b")),
    ("uses", re.compile(r"\b(uses?|using|used by|runs? on|calls?|talks? to)\b")),
    ("is_a", re.compile(r"\b(is an?|are|was an?|is the)\b")),
    ("part_of", re.compile(r"\b(part of|inside|belongs to|in)\b")),
    ("has_part", re.compile(r"\b(has|have|contains?|includes?)\b")),
    ("replaces", re.compile(r"\b(replaces?|replaced|instead of|supersedes?)\b")),
)
ENTITY_CONNECTORS = frozenset({"of", "de", "la", "von", "van", "der", "du"})

_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n+")
_TOKEN = re.compile(r"[^\W_](?:[\w'’.-]*[^\W_])?")


@dataclass(frozen=True)
class Term:
    """A concept or entity, identified by its kind and normalised key."""

    kind: str  # "concept" | "entity"
    key: str
    label: str

    @property
    def node_id(self) -> str:
        return f"{self.kind}:{self.key}"


@dataclass(frozen=True)
class Relation:
    src: Term
    kind: str
    dst: Term


@dataclass
class TurnExtraction:
    turn_id: str
    mentions: dict[Term, int] = field(default_factory=dict)


@dataclass
class Extraction:
    """What the graph is built from: per-turn mentions, session topics, relations."""

    turns: list[TurnExtraction]
    topics: dict[Term, int]
    relations: dict[Relation, int]


class Extractor(Protocol):
    def extract(self, turns: Sequence[Mapping[str, Any]]) -> Extraction:
        """Extract from canonical raw-turn records (`id`, `role`, `text`, `time`)."""
        ...


def normalise(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _is_capitalised(token: str) -> bool:
    return token[0].isupper() or any(c.isupper() for c in token[1:])


def _is_strong(token: str) -> bool:
    """A token that is a name even at the start of a sentence (SQLite, API, GPT-4)."""
    return any(c.isupper() for c in token[1:]) or any(c.isdigit() for c in token)


def _entity_spans(tokens: list[re.Match[str]]) -> list[tuple[int, int]]:
    """Token index ranges [start, end) of capitalised runs."""
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(tokens):
        if not _is_capitalised(tokens[i].group()):
            i += 1
            continue
        j = i + 1
        while j < len(tokens) and j - i < MAX_ENTITY_WORDS:
            word = tokens[j].group()
            if _is_capitalised(word):
                j += 1
            elif word in ENTITY_CONNECTORS and j + 1 < len(tokens) and _is_capitalised(tokens[j + 1].group()):
                j += 2
            else:
                break
        spans.append((i, j))
        i = j
    return spans


def _entity_term(words: list[str], sentence_start: bool, known: frozenset[str]) -> Term | None:
    # leading stopwords ("The Chroma server") are sentence capitalisation, not the name
    while words and words[0].casefold() in STOPWORDS:
        words = words[1:]
        sentence_start = False
    if not words or all(len(w) == 1 for w in words):
        return None
    # "Redis depends on ..." : a capitalised first word is a name only if it is
    # one elsewhere in the session (mid-sentence) or looks like one (SQLite, GPT-4)
    if len(words) == 1 and sentence_start and not _is_strong(words[0]) and words[0].casefold() not in known:
        return None
    label = " ".join(words)
    return Term("entity", label.casefold(), label)


def _concept_term(word: str) -> Term | None:
    key = word.casefold().strip("'’.-")
    if key.endswith(("'s", "’s")):
        key = key[:-2]
    if len(key) < 3 or len(key) > MAX_TERM_CHARS or key in STOPWORDS or key.replace(".", "").isdigit():
        return None
    return Term("concept", key, key)


def _relation_kind(gap: str) -> str | None:
    if len(gap.split()) > RELATION_GAP_WORDS:
        return None
    for kind, pattern in RELATION_PATTERNS:
        if pattern.search(gap):
            return kind
    return "co_occurs"


def _sentence_relations(sentence: str, located: list[tuple[int, int, Term]]) -> list[Relation]:
    relations = []
    for (_, end, left), (start, _, right) in zip(located, located[1:], strict=False):
        if left == right:
            continue
        kind = _relation_kind(sentence[end:start].casefold())
        if kind is None:
            continue
        if kind == "co_occurs" and right.key < left.key:
            left, right = right, left  # undirected: one canonical direction
        relations.append(Relation(left, kind, right))
    return relations


class KeywordExtractor:
    """The default offline extractor (deterministic; see the module docstring)."""

    def extract(self, turns: Sequence[Mapping[str, Any]]) -> Extraction:
        per_turn: list[TurnExtraction] = []
        topics: Counter[Term] = Counter()
        entities: Counter[Term] = Counter()
        relations: Counter[Relation] = Counter()
        known = self.known_entities(turn.get("text") or "" for turn in turns)
        for turn in turns:
            found, turn_relations = self.extract_text(turn.get("text") or "", known)
            concepts = Counter({t: n for t, n in found.items() if t.kind == "concept"})
            kept = dict(
                sorted(concepts.items(), key=lambda item: (-item[1], item[0].key))[:CONCEPTS_PER_TURN]
            )
            kept.update({t: n for t, n in found.items() if t.kind == "entity"})
            per_turn.append(TurnExtraction(str(turn["id"]), kept))
            topics.update(concepts)
            entities.update({t: n for t, n in found.items() if t.kind == "entity"})
            relations.update(turn_relations)
        top = sorted(((t, n) for t, n in topics.items() if n >= 2), key=lambda item: (-item[1], item[0].key))
        session_terms = dict(top[:SESSION_TOPICS])
        session_terms.update(entities)
        return Extraction(per_turn, session_terms, dict(relations))

    def known_entities(self, texts: Iterable[str]) -> frozenset[str]:
        """Keys of the names that appear capitalised mid-sentence somewhere in `texts`."""
        known: set[str] = set()
        for text in texts:
            found, _ = self.extract_text(text)
            known.update(t.key for t in found if t.kind == "entity")
        return frozenset(known)

    def extract_text(
        self, text: str, known: frozenset[str] = frozenset()
    ) -> tuple[Counter[Term], list[Relation]]:
        """Terms (with counts) and relations of one text."""
        found: Counter[Term] = Counter()
        relations: list[Relation] = []
        if not isinstance(text, str):
            text = str(text)
        for sentence in _SENTENCE.split(normalise(text)):
            tokens = list(_TOKEN.finditer(sentence))
            located, covered = _located_entities(tokens, known)
            found.update(term for _, _, term in located)
            for index, token in enumerate(tokens):
                concept = None if index in covered else _concept_term(token.group())
                if concept is not None:
                    found[concept] += 1
            relations.extend(_sentence_relations(sentence, located))
        return found, relations


def _located_entities(
    tokens: list[re.Match[str]], known: frozenset[str]
) -> tuple[list[tuple[int, int, Term]], set[int]]:
    """A sentence's entities with their character spans, and the token indexes they cover."""
    located: list[tuple[int, int, Term]] = []
    covered: set[int] = set()
    for start, end in _entity_spans(tokens):
        term = _entity_term([t.group() for t in tokens[start:end]], start == 0, known)
        if term is not None:
            covered.update(range(start, end))
            located.append((tokens[start].start(), tokens[end - 1].end(), term))
    return located, covered
