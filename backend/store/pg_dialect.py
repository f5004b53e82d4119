"""rem's SQL, written once in SQLite's dialect, as PostgreSQL runs it: one translation per distinct
statement, cached (the table of differences is in `backend.store.postgres`'s docstring)."""

from __future__ import annotations

import functools
import re

# -- SQL translation -----------------------------------------------------------
_LITERAL = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*")
_PLACEHOLDER = re.compile(r"\?|(?<![:\w]):([A-Za-z_]\w*)|%")
_IS_NOT = re.compile(r"\bIS\s+NOT\s+(?!NULL\b|DISTINCT\b|TRUE\b|FALSE\b)", re.IGNORECASE)
_IS = re.compile(r"\bIS\s+(?!NOT\b|NULL\b|DISTINCT\b|TRUE\b|FALSE\b|JSON\b)", re.IGNORECASE)
_MINMAX = re.compile(r"\b(max|min)\s*\(", re.IGNORECASE)
_PARAM_IS_NULL = re.compile(r"(%\(\w+\)s|%s)(\s+IS\s+(?:NOT\s+)?NULL\b)", re.IGNORECASE)
_INDEX_HINT = re.compile(r"\b(?:INDEXED\s+BY\s+\w+|NOT\s+INDEXED)\b", re.IGNORECASE)
_GLOB = re.compile(r"\bGLOB\s+'([^'%_]*)'", re.IGNORECASE)
# SQLite's `CROSS JOIN t ON ...` is an inner join whose order the planner keeps (a hint)
_CROSS_JOIN_ON = re.compile(r"\bCROSS\s+JOIN\s+(\w+(?:\s+AS\s+\w+)?\s+ON)\b", re.IGNORECASE)
_STATEMENTS = {
    "BEGIN IMMEDIATE": "BEGIN ISOLATION LEVEL READ COMMITTED",
    "BEGIN": "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
}


# a subquery in FROM or JOIN, and what may follow one that has no alias
_SUBQUERY = re.compile(r"\b(?:FROM|JOIN)\s*(\()\s*(?:SELECT|WITH|VALUES)\b", re.IGNORECASE)
_NEXT_WORD = re.compile(r"\s*(\w+)")
_NOT_AN_ALIAS = frozenset(
    "WHERE GROUP ORDER HAVING LIMIT OFFSET UNION EXCEPT INTERSECT JOIN LEFT RIGHT INNER OUTER CROSS "
    "FULL NATURAL ON USING WINDOW RETURNING FOR".split()
)


@functools.lru_cache(maxsize=4096)
def translate_sql(sql: str) -> str:
    """rem's SQLite-dialect statement as PostgreSQL runs it (see the module doc)."""
    whole = _STATEMENTS.get(" ".join(sql.split()).upper())
    if whole is not None:
        return whole
    sql = alias_subqueries(_GLOB.sub(_glob_as_like, sql))
    out, last = [], 0
    for literal in _LITERAL.finditer(sql):
        out.append(_translate_code(sql[last : literal.start()]))
        out.append(literal.group(0).replace("%", "%%") if not literal.group(0).startswith("--") else "")
        last = literal.end()
    out.append(_translate_code(sql[last:]))
    return "".join(out)


def alias_subqueries(sql: str) -> str:
    """Give every subquery in FROM / JOIN without an alias one (`rem_subN`): PostgreSQL 14 and 15
    refuse `FROM (SELECT ...)` alone ("subquery in FROM must have an alias"), SQLite and 16+ take it."""
    masked = _LITERAL.sub(lambda m: "_" * len(m.group(0)), sql)  # no parenthesis inside text counts
    inserts = []
    for match in _SUBQUERY.finditer(masked):
        depth = 0
        for close in range(match.start(1), len(masked)):
            depth += {"(": 1, ")": -1}.get(masked[close], 0)
            if depth == 0:
                break
        word = _NEXT_WORD.match(masked, close + 1)
        if word is None or word.group(1).upper() in _NOT_AN_ALIAS:
            inserts.append(close + 1)
    # from the end back (a subquery inside another closes first but is found after it)
    for n, at in sorted(enumerate(inserts, start=1), key=lambda pair: -pair[1]):
        sql = f"{sql[:at]} AS rem_sub{n}{sql[at:]}"
    return sql


def _glob_as_like(match: re.Match[str]) -> str:
    """`x GLOB 'a.*'` (a literal pattern without LIKE's own wildcards) as `x LIKE 'a.%'`."""
    return "LIKE '" + match.group(1).replace("*", "%").replace("?", "_") + "'"


def _translate_code(code: str) -> str:
    code = _INDEX_HINT.sub("", code)  # SQLite's planner hints; PostgreSQL plans for itself
    code = _CROSS_JOIN_ON.sub(r"JOIN \1", code)
    code = _IS_NOT.sub("IS DISTINCT FROM ", code)
    code = _IS.sub("IS NOT DISTINCT FROM ", code)
    code = _scalar_minmax(code)
    code = _PLACEHOLDER.sub(_placeholder, code)
    # `:x IS NULL` alone gives a NULL parameter no type PostgreSQL can infer
    return _PARAM_IS_NULL.sub(r"CAST(\1 AS text)\2", code)


def _placeholder(match: re.Match[str]) -> str:
    if match.group(0) == "?":
        return "%s"
    if match.group(0) == "%":
        return "%%"
    return f"%({match.group(1)})s"


def _scalar_minmax(code: str) -> str:
    """`max(a, b)` (SQLite's scalar form, two or more arguments) as GREATEST; aggregates untouched."""
    pos = 0
    while True:
        match = _MINMAX.search(code, pos)
        if match is None:
            return code
        depth, commas, end = 0, 0, match.end() - 1
        for end in range(match.end() - 1, len(code)):
            char = code[end]
            if char == "(":
                depth += 1
            elif char == ")":
                depth -= 1
                if depth == 0:
                    break
            elif char == "," and depth == 1:
                commas += 1
        if commas:
            name = "GREATEST" if match.group(1).lower() == "max" else "LEAST"
            code = code[: match.start()] + name + "(" + code[match.end() :]
        pos = match.start() + 1
