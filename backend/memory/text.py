"""Text for the recall index and its queries: words, stop words, dates, FTS5 MATCH strings.

FTS5 (`porter unicode61`) tokenises the indexed text itself; this module
decides what text each column holds and turns a free-text query into a MATCH
expression that cannot be a syntax error: the query's non-stop words, each
double-quoted (quotes escape every FTS5 operator), OR-ed together, limited
to the scope column of one project or session.
"""

from __future__ import annotations

import hashlib
import re
import time

# NLTK's English stop words plus question fillers (the LoCoMo study's list)
STOPWORDS = frozenset(
    """
i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself
yourselves he him his himself she she's her hers herself it it's its itself they them their
theirs themselves what which who whom this that that'll these those am is are was were be been
being have has had having do does did doing a an the and but if or because as until while of at
by for with about against between into through during before after above below to from up down
in out on off over under again further then once here there when where why how all any both each
few more most other some such no nor not only own same so than too very s t can will just don
don't should should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn
doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn
needn't shan shan't shouldn shouldn't wasn wasn't weren weren't won won't wouldn wouldn't
would could might may also
""".split()
)

WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?")
MAX_QUERY_TERMS = 64


def words(text: str) -> list[str]:
    """The words of `text`, as written."""
    return WORD.findall(text)


def normalise(word: str) -> str:
    """Lower case, without a possessive 's and without apostrophes."""
    w = word.lower().replace("’", "'")
    if w.endswith("'s"):
        w = w[:-2]
    return w.replace("'", "")


def query_terms(query: str) -> list[str]:
    """The query's distinct non-stop words, normalised, in order (at most MAX_QUERY_TERMS)."""
    out: list[str] = []
    seen: set[str] = set()
    for raw in words(query):
        if raw.lower().replace("’", "'") in STOPWORDS:
            continue
        term = normalise(raw)
        if term and term not in STOPWORDS and term not in seen:
            seen.add(term)
            out.append(term)
    return out[:MAX_QUERY_TERMS]


def quoted(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def scope_token(kind: str, name: str) -> str:
    """The FTS5 token that stands for one project (`p`) or session (`s`): exact, never a prefix."""
    return kind + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:20]


FTS_TABLE_PREFIX = "memory_fts_"


def fts_table(project: str) -> str:
    """The FTS5 table of one project's turns: `memory_fts_p<20 hex>` (an identifier, never user text).

    One table per project, not one for everything: FTS5 scores every row a
    query matches and reads each term's whole posting list for its IDF, so a
    query's cost follows the size of the table it searches. In one table of
    1 000 000 turns a project-scoped query cost 27 / 79 ms of CPU (p50 / p95);
    in the project's own table it costs what the project holds.
    """
    return FTS_TABLE_PREFIX + scope_token("p", project)


def fts_table_ddl(table: str) -> str:
    """CREATE for a project's FTS5 table (rowid = memory_turn.id; `scope` holds the session token)."""
    return f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING fts5(body, ctx, scope, tokenize = 'porter unicode61')"


# the project FTS5 tables that exist (their shadow tables are plain tables named <table>_data, ...)
FTS_TABLES_SQL = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name GLOB 'memory_fts_p*' "
    "AND sql LIKE 'CREATE VIRTUAL TABLE%' ORDER BY name"
)


def scope_text(project: str, session_id: str) -> str:
    """The `scope` column of a turn: its project's token and its session's token."""
    return f"{scope_token('p', project)} {scope_token('s', session_id)}"


def fts_match(terms: list[str], project: str | None, session_id: str | None) -> str | None:
    """The MATCH expression for `terms` within a project and/or session; None without terms."""
    if not terms:
        return None
    body = "{body ctx}: (" + " OR ".join(quoted(t) for t in terms) + ")"
    scopes = []
    if project is not None:
        scopes.append("scope: " + quoted(scope_token("p", project)))
    if session_id is not None:
        scopes.append("scope: " + quoted(scope_token("s", session_id)))
    return " AND ".join([*scopes, body])


_MONTHS = "January February March April May June July August September October November December".split()


def date_words(ms: int) -> str:
    """'8 May 2023' for a Unix time in ms (UTC): how people name a day in a question."""
    t = time.gmtime(ms / 1000)
    return f"{t.tm_mday} {_MONTHS[t.tm_mon - 1]} {t.tm_year}"


def clip(text: str, chars: int) -> str:
    """At most `chars` characters of `text`, whitespace collapsed."""
    flat = " ".join(text.split())
    return flat if len(flat) <= chars else flat[: chars - 1] + "…"


def mentions_name(query: str, name: str) -> bool:
    """Whether `query` names `name` as a whole word (case-insensitive)."""
    if len(name) < 2:
        return False
    return re.search(r"(?<![^\W_])" + re.escape(name) + r"(?![^\W_])", query, re.IGNORECASE) is not None
