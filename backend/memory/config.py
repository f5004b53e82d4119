"""The recall pipeline's knobs as values: each is a `recall_*` or `index_*` setting, declared
with its default in `backend.core.settings` (the values measured on LoCoMo).

Two kinds:

* **index time** (`IndexConfig`): what text goes into the FTS5 columns and the
  dense vector of each turn. They are part of each row's digest, so a change
  is picked up by the next index pass of a session, and by `rem reindex` for
  all of them at once.
* **query time** (`RecallConfig`): how the query is built and how the
  retrievers' lists are fused, read per query.

The defaults come from the LoCoMo retrieval study done for this issue (5
conversations, WordLlama + SQLite FTS5): the turn's date and the previous
turns as a down-weighted FTS5 column lift BM25 the most; WordLlama adds a
little on top as a 0.1-weight linear fusion (reciprocal-rank fusion with
equal weights lost to BM25 alone there); a turn by the one speaker the
question names gets x1.5. `benchmarks/locomo.py` measures any change.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.core.settings import Settings, settings


@dataclass(frozen=True)
class IndexConfig:
    """What is indexed for each raw turn (the `index_*` settings)."""

    # previous turns of the same session whose text fills the FTS5 `ctx` column
    ctx_turns: int = Settings.index_context_turns.default
    # previous turns appended to the dense text ("... || speaker: text")
    dense_prev_turns: int = Settings.index_dense_turns.default
    # the turn's date ("8 May 2023") in the FTS5 body and the dense text
    date_in_text: bool = Settings.index_date_in_text.default
    # characters of one neighbour's text kept in ctx / dense text
    neighbour_chars: int = Settings.index_neighbour_chars.default

    def key(self) -> str:
        """A short string naming this configuration (part of each row's digest)."""
        return f"c{self.ctx_turns}d{self.dense_prev_turns}t{int(self.date_in_text)}n{self.neighbour_chars}"


@dataclass(frozen=True)
class RecallConfig:
    """How a query is answered (the `recall_*` settings)."""

    # bm25 column weights: body, ctx (scope is a filter, weight 0)
    fts_weights: tuple[float, float] = (1.0, Settings.recall_context_weight.default)
    # candidates FTS5 contributes before fusion
    candidates: int = Settings.recall_candidates.default
    # candidates the dense side contributes (a Chroma round trip grows with it)
    dense_candidates: int = Settings.recall_dense_candidates.default
    # "linear" (min-max normalised, weighted sum) or "rrf" (reciprocal rank)
    fusion: str = Settings.recall_fusion.default
    # weights of the lexical and dense lists in the fusion
    lexical_weight: float = 1.0 - Settings.recall_dense_weight.default
    dense_weight: float = Settings.recall_dense_weight.default
    rrf_k: int = Settings.recall_rrf_k.default
    # score multiplier (1 + boost) for turns by the one speaker the query names
    speaker_boost: float = Settings.recall_speaker_boost.default
    # weight of turns reached through the Dream graph (query concepts -> mentioning turns)
    graph_weight: float = Settings.recall_graph_weight.default
    # the second hop (`expansion.hop`): its weight against the best fused score, and its seeds
    hop_weight: float = Settings.recall_hop_weight.default
    hop_seeds: int = Settings.recall_hop_seeds.default
    # dates (`expansion.fit_dates`): turns whose days fit the query's, turns that name a day for "when"
    date_boost: float = Settings.recall_date_boost.default
    when_boost: float = Settings.recall_when_boost.default
    # the spread across sessions (`expansion.diversify`)
    session_decay: float = Settings.recall_session_decay.default
    # where a summary / a fact ranks among turns: its normalised score times this
    summary_weight: float = Settings.recall_summary_weight.default
    fact_weight: float = Settings.recall_fact_weight.default
    # summaries and facts considered per query
    summaries: int = Settings.recall_summaries.default
    facts: int = Settings.recall_facts.default


def recall_config() -> RecallConfig:
    """The `recall_*` settings as one value, read now (per query)."""
    dense = settings.recall_dense_weight
    return RecallConfig(
        fts_weights=(1.0, settings.recall_context_weight),
        candidates=settings.recall_candidates,
        dense_candidates=settings.recall_dense_candidates,
        fusion=settings.recall_fusion,
        dense_weight=dense,
        lexical_weight=1.0 - dense if settings.recall_fusion == "linear" else 1.0,
        rrf_k=settings.recall_rrf_k,
        speaker_boost=settings.recall_speaker_boost,
        graph_weight=settings.recall_graph_weight,
        hop_weight=settings.recall_hop_weight,
        hop_seeds=settings.recall_hop_seeds,
        date_boost=settings.recall_date_boost,
        when_boost=settings.recall_when_boost,
        session_decay=settings.recall_session_decay,
        summary_weight=settings.recall_summary_weight,
        fact_weight=settings.recall_fact_weight,
        summaries=settings.recall_summaries,
        facts=settings.recall_facts,
    )


def index_config() -> IndexConfig:
    """The `index_*` settings as one value."""
    return IndexConfig(
        ctx_turns=settings.index_context_turns,
        dense_prev_turns=settings.index_dense_turns,
        date_in_text=settings.index_date_in_text,
        neighbour_chars=settings.index_neighbour_chars,
    )


# this process's index configuration, read once: every turn it indexes gets the same digest
INDEX = index_config()
