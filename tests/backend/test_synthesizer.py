"""The default extractive synthesizer: real text from the turns, deterministic."""

from __future__ import annotations

from backend.summaries.synthesizer import ExtractiveSynthesizer, load_synthesizer

TURNS = [
    {
        "id": "m1",
        "role": "user",
        "text": "The payments service keeps timing out. How do I restart the service safely?",
    },
    {
        "id": "m2",
        "role": "assistant",
        "text": "Drain the node first. Then restart the service and watch the latency "
        "alert. If the latency stays high, roll back the deployment.",
    },
    {"id": "m3", "role": "user", "text": "The latency alert fired again after the restart."},
]


def test_summary_is_extracted_from_the_turns() -> None:
    synthesis = ExtractiveSynthesizer(max_sentences=3).summarize(TURNS)
    lines = synthesis.document.splitlines()
    assert lines[0] == "The payments service keeps timing out (3 turns)"
    assert len(lines) == 4
    source = " ".join(t["text"] for t in TURNS)
    for line in lines[1:]:
        role, _, sentence = line.partition(": ")
        assert role in ("user", "assistant") and sentence in source
    assert synthesis.title == "The payments service keeps timing out"
    assert synthesis.keywords[:3] == ["latency", "restart", "service"]  # 3 mentions each, ties by name
    assert synthesis.category == "operations"


def test_synthesis_is_deterministic_and_follows_the_input() -> None:
    first = ExtractiveSynthesizer().summarize(TURNS)
    assert ExtractiveSynthesizer().summarize([dict(t) for t in TURNS]) == first
    changed = ExtractiveSynthesizer().summarize(
        [*TURNS, {"id": "m4", "role": "assistant", "text": "Write a python test for the retry function."}]
    )
    assert changed.document != first.document


def test_questions_without_topic_words_are_categorised_as_questions() -> None:
    synthesis = ExtractiveSynthesizer().summarize([{"role": "user", "text": "Is it raining in Lisbon?"}])
    assert synthesis.category == "question"
    assert synthesis.keywords == ["lisbon", "raining"]


def test_the_synthesizer_is_pluggable(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("REM_SYNTHESIZER", "tests.counting_synthesizer:factory")
    assert load_synthesizer().name == "rem-extractive-v1+counting"
    monkeypatch.delenv("REM_SYNTHESIZER")
    assert isinstance(load_synthesizer(), ExtractiveSynthesizer)
