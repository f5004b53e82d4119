"""The offline extractor: entities, concepts and typed relations, deterministically."""

from __future__ import annotations

from backend.dream.extractor import KeywordExtractor


def _keys(found: object) -> set[str]:
    return {t.node_id for t in found}  # type: ignore[attr-defined]


def test_entities_concepts_and_typed_relations() -> None:
    found, relations = KeywordExtractor().extract_text(
        "The Chroma Server uses SQLite for storage. Bank of America depends on Kubernetes. "
        "Please keep storage durable."
    )
    assert {
        "entity:chroma server",
        "entity:sqlite",
        "entity:bank of america",
        "entity:kubernetes",
        "concept:storage",
        "concept:durable",
    } <= _keys(found)
    assert "entity:the" not in _keys(found) and "entity:please" not in _keys(found)
    assert {(r.src.key, r.kind, r.dst.key) for r in relations} == {
        ("chroma server", "uses", "sqlite"),
        ("bank of america", "depends_on", "kubernetes"),
    }


def test_a_sentence_initial_word_is_a_name_only_if_it_is_one_elsewhere() -> None:
    turns = [
        {"id": "a", "text": "Redis depends on Linux. Caching matters."},
        {"id": "b", "text": "We keep Redis small."},
    ]
    extraction = KeywordExtractor().extract(turns)
    first = _keys(extraction.turns[0].mentions)
    assert "entity:redis" in first and "entity:caching" not in first and "concept:caching" in first


def test_unicode_text_is_normalised_and_deterministic() -> None:
    nfd = "Cafe\u0301 Noir serves Zürich. Straße and straße."
    turns = [{"id": "a", "text": nfd}, {"id": "b", "text": "東京 is large. Ünïcode Straße is here."}]
    first, second = KeywordExtractor().extract(turns), KeywordExtractor().extract(turns)
    assert first == second
    keys = _keys(first.topics) | _keys(first.turns[1].mentions)
    # keys are casefolded (ß -> ss) so spellings meet; labels keep the surface form
    assert {"entity:café noir", "entity:zürich", "concept:strasse", "entity:ünïcode strasse"} <= keys
    assert {t.label for t in first.turns[1].mentions} >= {"Ünïcode Straße"}
    assert first.topics[next(t for t in first.topics if t.key == "strasse")] == 2


def test_topics_keep_recurring_concepts_only() -> None:
    turns = [{"id": "a", "text": "latency latency budget"}, {"id": "b", "text": "latency and throughput"}]
    topics = {t.key: n for t, n in KeywordExtractor().extract(turns).topics.items()}
    assert topics == {"latency": 3}
