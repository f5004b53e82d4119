"""The recall pipeline's knobs, in one place, with the values measured on LoCoMo.

Two kinds:

* **index time** (`IndexConfig`): what text goes into the FTS5 columns and the
  dense vector of each turn. They are part of each row's digest, so a change
  is picked up by the next index pass of a session, and by `rem reindex` for
  all of them at once.
* **query time** (`RecallConfig`): how the query is built and how the
  retrievers' lists are fused; the `recall_*` settings (backend/core/settings.py) override
  the main ones.

The defaults come from the LoCoMo retrieval study done for this issue (5
conversations, WordLlama + SQLite FTS5): the turn's date and the previous
turns as a down-weighted FTS5 column lift BM25 the most; WordLlama adds a
little on top as a 0.1-weight linear fusion (reciprocal-rank fusion with
equal weights lost to BM25 alone there); a turn by the one speaker the
question names gets x1.5. `benchmarks/locomo.py` measures any change.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.core.settings import settings


@dataclass(frozen=True)
class IndexConfig:
    """What is indexed for each raw turn."""

    # previous turns of the same session whose text fills the FTS5 `ctx` column
    ctx_turns: int = 3
    # previous turns appended to the dense text ("... || speaker: text")
    dense_prev_turns: int = 1
    # the turn's date ("8 May 2023") in the FTS5 body and the dense text
    date_in_text: bool = True
    # characters of one neighbour's text kept in ctx / dense text
    neighbour_chars: int = 600

    def key(self) -> str:
        """A short string naming this configuration (part of each row's digest)."""
        return f"c{self.ctx_turns}d{self.dense_prev_turns}t{int(self.date_in_text)}n{self.neighbour_chars}"


@dataclass(frozen=True)
class RecallConfig:
    """How a query is answered."""

    # bm25 column weights: body, ctx (scope is a filter, weight 0)
    fts_weights: tuple[float, float] = (1.0, 0.5)
    # candidates FTS5 contributes before fusion
    candidates: int = 200
    # candidates the dense side contributes (a Chroma round trip grows with it; weight 0.1)
    dense_candidates: int = 100
    # "linear" (min-max normalised, weighted sum) or "rrf" (reciprocal rank)
    fusion: str = "linear"
    # weights of the lexical and dense lists in the fusion
    lexical_weight: float = 0.9
    dense_weight: float = 0.1
    rrf_k: int = 60
    # score multiplier (1 + boost) for turns by the one speaker the query names
    speaker_boost: float = 0.5
    # weight of turns reached through the Dream graph (query concepts -> mentioning turns)
    graph_weight: float = 0.05
    # where a summary / a fact ranks among turns: its normalised score times this
    summary_weight: float = 0.5
    fact_weight: float = 0.4
    # summaries and facts considered per query
    summaries: int = 5
    facts: int = 5


def recall_config() -> RecallConfig:
    """The defaults with the `recall_*` settings applied."""
    dense = settings.recall_dense_weight
    return RecallConfig(
        fusion=settings.recall_fusion,
        dense_weight=dense,
        lexical_weight=1.0 - dense if settings.recall_fusion == "linear" else 1.0,
        candidates=settings.recall_candidates,
    )


INDEX = IndexConfig()
