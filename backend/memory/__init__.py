"""Memory that can be recalled: the turn index, recall, projects, reindexing.

Sits below `execution | summaries | dream` (the executor recalls for each
step's context; Dream writes the index) and above `runtime`. It reads the
Dream graph tables with SQL rather than importing `backend.dream`.

    config     the recall pipeline's knobs (what is indexed, query, fusion), in one place
    text       tokenising, stop words, query terms, FTS5 MATCH strings, the indexed texts
    index      the recall index of raw turns: FTS5 rows in state.db, vectors in Chroma
    recall     the entry: query -> retrievers side by side -> fusion and expansion -> the result
    query      what recall reads out of a question: words, graph nodes, days, whether it asks when
    dates      time words ("yesterday", "last Tuesday", "two weeks ago") resolved to absolute days
    scope      where recall looks (a project, a session, everywhere) and the turns it leaves out
    lexical_search  recall's FTS5 / PostgreSQL full-text retriever
    vector_search   recall's Chroma retrievers: nearest turn vectors, nearest session summaries
    graph_search    recall's Dream-graph retrievers: turns by concept, entity and day, typed facts
    candidate  one turn a retriever found, carried from the retrievers to the items
    fusion     one score per turn from the retrievers' lists, then the expansions, then the items
    expansion  the second hop through the graph, the fit of dates, the spread across sessions
    projects   project names and listing
    reindex    rebuild every vector with the configured embedder (`rem reindex`)
"""

from __future__ import annotations
