"""What recall reads out of a question before it asks any retriever: its words, the Dream graph
nodes it names, the days it names, and whether it asks when."""

from __future__ import annotations

import re
from dataclasses import dataclass

from backend.core import clock
from backend.memory import dates
from backend.memory.graph_search import graph_node_ids
from backend.memory.text import query_terms

# a question about time: "When did ...", "How long ago ...", "What year ..."
ASKS_WHEN = re.compile(r"^\W*(?:when|how long ago|what (?:date|day|month|year|time))\b", re.IGNORECASE)


@dataclass(frozen=True)
class Query:
    """One recall question, split into what each retriever and each expansion uses."""

    text: str
    terms: list[str]  # non-stop words, for the lexical retriever
    nodes: list[str]  # concept and entity node ids, for the graph retrievers
    spans: list[dates.DaySpan]  # the days it names ("in July 2022", "last week": against now)
    asks_when: bool


def parse(text: str, now_ms: int | None = None) -> Query:
    """The parts of `text` recall uses; relative days resolve against `now_ms` (default: now)."""
    terms = query_terms(text)
    return Query(
        text=text,
        terms=terms,
        nodes=graph_node_ids(text, terms),
        spans=dates.resolve(text, clock.now_ms() if now_ms is None else now_ms),
        asks_when=ASKS_WHEN.match(text) is not None,
    )
