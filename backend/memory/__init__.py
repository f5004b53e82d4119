"""Memory that can be recalled: the turn index, recall, projects, reindexing.

Sits below `execution | summaries | dream` (the executor recalls for each
step's context; Dream writes the index) and above `runtime`. It reads the
Dream graph tables with SQL rather than importing `backend.dream`.

    config     the recall pipeline's knobs (what is indexed, query, fusion), in one place
    text       tokenising, stop words, query terms, FTS5 MATCH strings, the indexed texts
    index      the recall index of raw turns: FTS5 rows in state.db, vectors in Chroma
    recall     hybrid recall: dense + FTS5 fused, graph expansion, session summaries
    projects   project names and listing
    reindex    rebuild every vector with the configured embedder (`rem reindex`)
"""

from __future__ import annotations
