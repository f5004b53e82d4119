"""Row counters kept by triggers in the same transaction as the rows they count (`status_count`).

The status snapshot shows how many rows of each kind there are (receipts by
verdict, summary jobs and Dream rows by state, inputs waiting, sessions,
execution leases by owner, the recall index's lag). Counting them with
`count(*)` after every commit costs time in proportion to the tables (95 000
present receipts at 1 000 000 sessions); reading a counter costs the same at
any size. Each counter is declared once here as a predicate over one
table's row; schema v6 (`backend.store.schema`) creates, for each, three
row triggers that move it by the change of that predicate:

* after INSERT, when the new row matches: +1;
* after DELETE, when the old row matched: -1;
* after UPDATE OF the columns it reads, when the match (or the key) changed:
  -1 on the old row's key, +1 on the new row's.

A trigger runs inside the statement that fired it, so a counter commits and
rolls back with its rows: a SIGKILL mid-transaction loses both or neither.
The writers need not know the counters exist. `rem check` compares every
counter with a real count (`drift_sync`), so a path that bypasses triggers
(a REPLACE conflict resolution with recursive triggers off deletes rows
without firing DELETE triggers: rem never uses it) is caught.

Each trigger body is one `UPDATE` of the counter's row (created by the
backfill), or for a keyed counter an `INSERT ... ON CONFLICT (name, key) DO
UPDATE` plus a `DELETE` of a key that fell to 0,
and each `WHEN` a CASE over `new`/`old` columns: PostgreSQL expresses the
same as `AFTER ... FOR EACH ROW WHEN (...) EXECUTE FUNCTION` with the body in
a PL/pgSQL function (`trigger_parts` gives the pieces, per counter and event).

On PostgreSQL the counters are not kept: there the snapshot reads each
counter's real count (`truth_sql`), and schema v6 creates no triggers and no
`status_count` table. A kept counter is one row that every writer of its
table updates: with writers on several hosts it would serialise them until
commit, and transactions bumping two counters in opposite orders would
deadlock. Delta rows folded by a reader (or sharded keys) are the way to
keep them there; until then PostgreSQL pays a count per counter per snapshot.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from backend.store.db import Conn, engine_of

TABLE = "status_count"
TABLE_SQL = f"""
CREATE TABLE {TABLE} (
    name TEXT NOT NULL,
    -- '' for a plain counter; the group's value for a keyed one (an owner id)
    key  TEXT NOT NULL DEFAULT '',
    n    INTEGER NOT NULL,
    PRIMARY KEY (name, key)
) WITHOUT ROWID"""


@dataclass(frozen=True)
class Counter:
    """How many rows of `table` match `where` (SQL over the row's columns; None: every row), per `key`."""

    name: str
    table: str
    where: str | None
    # the columns `where` and `key` read: UPDATE triggers fire only when one of them is set
    columns: tuple[str, ...]
    # a column whose value groups the count (one row per value, none for a value with 0)
    key: str | None = None
    # SQL over the row's NOT NULL columns: the counter keeps its sum over the matching rows
    # instead of their count (a plain counter only)
    amount: str | None = None

    def truth_sql(self) -> str:
        """The real count(s), as `rem check` and the backfill read them: rows of (key, n)."""
        where = f" WHERE {self.where}" if self.where else ""
        if self.amount is not None:
            return f"SELECT '' AS key, coalesce(sum({self.amount}), 0) AS n FROM {self.table}{where}"
        if self.key is None:
            return f"SELECT '' AS key, count(*) AS n FROM {self.table}{where}"
        return f"SELECT {self.key} AS key, count(*) AS n FROM {self.table}{where} GROUP BY {self.key}"


# The literal states below are the CHECK constraints' values (tests/backend/test_counters.py
# holds them to JobStatus, DigestState and ReceiptVerdict, which live in higher layers).
JOB_STATES = ("pending", "in_progress", "failed")
DREAM_STATES = ("pending", "in_progress", "deferred", "undigestible", "legacy")
VERDICTS = ("present", "missing", "document_differs", "keys_differ", "quarantined")
_DRIFTING = "input_revision IS NOT NULL AND completed_revision IS NOT input_revision"

# schema v6's counters; a change here needs a migration that recreates their triggers
COUNTERS: tuple[Counter, ...] = (
    Counter("sessions", "session", None, ()),
    Counter(
        "inputs_total",
        "session_input",
        "wake_pending IN (0, 1) AND promoted_seq IS NULL",
        ("wake_pending", "promoted_seq"),
    ),
    *(Counter(f"summary_{s}", "summary_job", f"status = '{s}'", ("status",)) for s in JOB_STATES),
    Counter("summary_stale", "summary_job", "dirty_seq > clean_seq", ("dirty_seq", "clean_seq")),
    Counter("dream_pending", "dream_state", _DRIFTING, ("input_revision", "completed_revision")),
    *(
        Counter(f"dream_state_{s}", "dream_state", f"digest_state = '{s}'", ("digest_state",))
        for s in DREAM_STATES
    ),
    *(Counter(f"receipt_{v}", "summary_job", f"verdict = '{v}'", ("verdict",)) for v in VERDICTS),
    Counter(
        "receipt_unchecked",
        "summary_job",
        "verdict IS NULL AND result_staged_at IS NOT NULL",
        ("verdict", "result_staged_at"),
    ),
    # the recall index's lag (backend.memory.index.index_lag_sync)
    Counter(
        "index_behind",
        "dream_state",
        "input_revision IS NOT NULL AND indexed_revision IS NOT input_revision",
        ("input_revision", "indexed_revision"),
    ),
    Counter("vectors_pending", "memory_turn", "vector_digest IS NOT digest", ("vector_digest", "digest")),
    # execution leases held, per owner (the totals' held and dead-owner figures)
    Counter("execution_held", "session_execution", None, ("owner_id",), key="owner_id"),
)
# schema v8's: the model usage totals (`rem status`, the console's usage panel), summed over
# the sessions that used a model or failed to (`USAGE_WHERE`, the predicate of the usage index
# `session_usage_idx` and of the usage panel's list, `backend.ops.model_health`)
USAGE_WHERE = "tokens_input > 0 OR tokens_output > 0 OR model_error IS NOT NULL"
USAGE_TOKENS = ("input", "output", "reasoning", "cache_read", "cache_write")
_USAGE_COLUMNS = ("tokens_input", "tokens_output", "model_error")
SUMS: tuple[Counter, ...] = (
    Counter("usage_sessions", "session", USAGE_WHERE, _USAGE_COLUMNS),
    Counter("usage_cost", "session", USAGE_WHERE, (*_USAGE_COLUMNS, "cost"), amount="cost"),
    *(
        Counter(
            f"usage_tokens_{name}",
            "session",
            USAGE_WHERE,
            tuple(dict.fromkeys((*_USAGE_COLUMNS, f"tokens_{name}"))),
            amount=f"tokens_{name}",
        )
        for name in USAGE_TOKENS
    ),
)
# schema v12's: agent tool calls by state and tool (`rem status`'s `tools.counts`, the metrics
# `rem_tool_calls_total{tool,outcome}` and `rem_tool_calls_waiting{state}`), keyed `STATE:TOOL`
# (a state never holds a colon: split at the first one)
TOOL_CALLS: tuple[Counter, ...] = (
    Counter("tool_calls", "tool_call", None, ("state", "tool"), key="state || ':' || tool"),
)
V6_COUNTERS = COUNTERS
COUNTERS = (*V6_COUNTERS, *SUMS, *TOOL_CALLS)
BY_NAME = {c.name: c for c in COUNTERS}


def _row(sql: str, row: str) -> str:
    """`sql` over the columns of `row` (`new` or `old`): every column a counter reads is qualified."""
    out = sql
    for column in sorted({c for counter in COUNTERS for c in counter.columns}, key=len, reverse=True):
        out = _qualify(out, column, row)
    return out


def _qualify(sql: str, column: str, row: str) -> str:
    return re.sub(rf"(?<![\w.']){column}(?![\w'])", f"{row}.{column}", sql)


def _matches(counter: Counter, row: str) -> str:
    """1 when the row is counted, else 0 (NULL never: a CASE, not the bare predicate)."""
    if counter.where is None:
        return "1"
    return f"(CASE WHEN {_row(counter.where, row)} THEN 1 ELSE 0 END)"


def _value(counter: Counter, row: str) -> str:
    """What the row adds to a summing counter: its amount when it matches, else 0."""
    amount = _row(str(counter.amount), row)
    if counter.where is None:
        return f"({amount})"
    return f"(CASE WHEN {_row(counter.where, row)} THEN {amount} ELSE 0 END)"


def _key(counter: Counter, row: str) -> str:
    """The group a row counts in: its key column, or the key expression over the row's columns."""
    if not counter.key:
        return "''"
    return f"{row}.{counter.key}" if counter.key.isidentifier() else f"({_row(counter.key, row)})"


def _bump(counter: Counter, delta: str, key: str) -> str:
    """Move the counter: a plain one's row exists from the backfill on (an UPDATE, the cheaper
    write on every turn); a keyed one's row appears with its first row (an upsert)."""
    if counter.key is None:
        return f"UPDATE {TABLE} SET n = n + {delta} WHERE name = '{counter.name}' AND key = ''"
    return (
        f"INSERT INTO {TABLE} (name, key, n) VALUES ('{counter.name}', {key}, {delta}) "
        f"ON CONFLICT (name, key) DO UPDATE SET n = {TABLE}.n + excluded.n"
    )


def _drop_zero(counter: Counter, key: str) -> str:
    return f"DELETE FROM {TABLE} WHERE name = '{counter.name}' AND key = {key} AND n = 0"


def trigger_parts(counter: Counter) -> list[tuple[str, str, str | None, list[str]]]:
    """(trigger name, event, WHEN condition or None, body statements) of each of the counter's triggers."""
    if counter.amount is not None:
        return _sum_trigger_parts(counter)
    new, old = _matches(counter, "new"), _matches(counter, "old")
    new_key, old_key = _key(counter, "new"), _key(counter, "old")
    every = counter.where is None
    insert = (
        f"{TABLE}_{counter.name}_ins",
        "INSERT",
        None if every else f"{new} = 1",
        [_bump(counter, "1", new_key)],
    )
    delete = (
        f"{TABLE}_{counter.name}_del",
        "DELETE",
        None if every else f"{old} = 1",
        [_bump(counter, "-1", old_key)],
    )
    parts = [insert, delete]
    if counter.key is None:
        if counter.columns:
            update = [_bump(counter, f"{new} - {old}", "''")]
            parts.append(
                (
                    f"{TABLE}_{counter.name}_upd",
                    f"UPDATE OF {', '.join(counter.columns)}",
                    f"{new} <> {old}",
                    update,
                )
            )
    else:
        moved = f"{old_key} IS NOT {new_key}"
        update = [
            _bump(counter, f"-{old}", old_key),
            _bump(counter, new, new_key),
            _drop_zero(counter, old_key),
        ]
        when = moved if every else f"({new} <> {old} OR {moved})"
        parts.append((f"{TABLE}_{counter.name}_upd", f"UPDATE OF {', '.join(counter.columns)}", when, update))
        delete[3].append(_drop_zero(counter, old_key))  # a key at 0 (an owner holding nothing) is not kept
    return parts


def _sum_trigger_parts(counter: Counter) -> list[tuple[str, str, str | None, list[str]]]:
    """A summing counter's triggers: each moves it by the change of what the row adds."""
    assert counter.key is None, "a summing counter is a plain one"
    new, old = _value(counter, "new"), _value(counter, "old")
    return [
        (f"{TABLE}_{counter.name}_ins", "INSERT", f"{new} <> 0", [_bump(counter, new, "''")]),
        (f"{TABLE}_{counter.name}_del", "DELETE", f"{old} <> 0", [_bump(counter, f"-{old}", "''")]),
        (
            f"{TABLE}_{counter.name}_upd",
            f"UPDATE OF {', '.join(counter.columns)}",
            f"{new} <> {old}",
            [_bump(counter, f"{new} - {old}", "''")],
        ),
    ]


def trigger_sql(counter: Counter) -> list[str]:
    """The SQLite `CREATE TRIGGER` statements of one counter."""
    return [
        f"CREATE TRIGGER {name} AFTER {event} ON {counter.table}"
        + (f" WHEN {when}" if when else "")
        + "\nBEGIN\n"
        + "".join(f"    {statement};\n" for statement in body)
        + "END"
        for name, event, when, body in trigger_parts(counter)
    ]


def backfill_sql(counter: Counter) -> str:
    """Set the counter from a real count (the v6 migration, inside its write transaction)."""
    return f"INSERT INTO {TABLE} (name, key, n) SELECT '{counter.name}', key, n FROM ({counter.truth_sql()})"


def migration_sql(version: int = 6) -> str:
    """Schema v6's counter part (the table, every v6 counter's triggers and backfill), v8's
    (the usage sums' triggers and backfill) or v12's (the tool calls')."""
    statements = [TABLE_SQL] if version == 6 else []
    for counter in {6: V6_COUNTERS, 8: SUMS, 12: TOOL_CALLS}[version]:
        statements += trigger_sql(counter)
        statements.append(backfill_sql(counter))
    return "".join(f"{s};\n" for s in statements)


def counts_sync(conn: Conn) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
    """Every counter: the plain ones by name, the keyed ones by name and key (one small read).

    A count or a token sum is an int; a cost sum a float."""
    plain: dict[str, Any] = dict.fromkeys((c.name for c in COUNTERS if c.key is None), 0)
    keyed: dict[str, dict[str, int]] = {c.name: {} for c in COUNTERS if c.key is not None}
    for name, key, n in _kept_or_real_sync(conn):
        if name in keyed:
            keyed[name][key] = int(n)
        elif name in plain:
            plain[name] = _number(BY_NAME[name], n)
    return plain, keyed


def _number(counter: Counter, n: Any) -> int | float:
    return float(n) if counter.amount == "cost" else int(n)


def kept_by_triggers(conn: Conn) -> bool:
    """Whether this store keeps the counters by triggers (SQLite) or counts on each read (PostgreSQL)."""
    return engine_of(conn) != "postgresql"


def sessions_estimate_sync(conn: Conn) -> int:
    """How many sessions there are, cheaply at any size: the kept counter on SQLite, the
    planner's row estimate on PostgreSQL (which keeps no counter: a real count walks the table)."""
    if kept_by_triggers(conn):
        row = conn.execute(f"SELECT n FROM {TABLE} WHERE name = 'sessions' AND key = ''").fetchone()
    else:  # -1: never analyzed (a new database; autovacuum analyzes a table once it has grown)
        row = conn.execute(
            "SELECT CASE WHEN reltuples < 0 THEN (SELECT count(*) FROM session) "
            "ELSE CAST(reltuples AS BIGINT) END FROM pg_class WHERE oid = CAST('session' AS regclass)"
        ).fetchone()
    return max(0, int(row[0])) if row and row[0] is not None else 0


def _real_counts_sql() -> str:
    """Every counter's real count in one statement, as rows of (name, key, n).

    The plain counters over the same rows (the usage count and its six sums) are read in one
    pass of those rows: one by one, at 30 000 sessions that had used a model, they cost
    PostgreSQL ~14 ms a snapshot, together ~3.6 ms (the union's `n` is the same type as before:
    double precision, the common type of a count and a sum)."""
    shared: dict[tuple[str, str | None], list[Counter]] = {}
    for c in COUNTERS:
        if c.key is None:
            shared.setdefault((c.table, c.where), []).append(c)
    passes, branches = [], []
    for i, c in enumerate(COUNTERS):
        group = shared.get((c.table, c.where), [])
        if len(group) < 2:
            branches.append(f"SELECT '{c.name}' AS name, q{i}.key, q{i}.n FROM ({c.truth_sql()}) AS q{i}")
            continue
        at = list(shared).index((c.table, c.where))
        if c is group[0]:
            columns = ", ".join(f"{_aggregate(m)} AS n{j}" for j, m in enumerate(group))
            where = f" WHERE {c.where}" if c.where else ""
            passes.append(f"p{at} AS (SELECT {columns} FROM {c.table}{where})")
        branches.append(f"SELECT '{c.name}' AS name, '' AS key, p{at}.n{group.index(c)} AS n FROM p{at}")
    head = f"WITH {', '.join(passes)} " if passes else ""
    return head + " UNION ALL ".join(branches)


def _aggregate(counter: Counter) -> str:
    """A plain counter's aggregate over its rows (as `truth_sql` computes it)."""
    return "count(*)" if counter.amount is None else f"coalesce(sum({counter.amount}), 0)"


# every counter's real count in one statement (PostgreSQL: one round trip, not one per counter)
REAL_COUNTS_SQL = _real_counts_sql()


KEPT_COUNTS_SQL = f"SELECT name, key, n FROM {TABLE}"


def counts_sql_sync(conn: Conn) -> str:
    """The statement `counts_sync` reads every counter with, on this connection's engine."""
    return KEPT_COUNTS_SQL if kept_by_triggers(conn) else REAL_COUNTS_SQL


def _kept_or_real_sync(conn: Conn) -> list[tuple[str, str, int]]:
    return [(r[0], r[1], r[2]) for r in conn.execute(counts_sql_sync(conn)).fetchall()]


def drift_sync(conn: Conn, counter: Counter) -> list[dict[str, object]]:
    """Where `counter` differs from the real count, in the caller's read transaction: (key, kept, real).

    Nothing where the counters are not kept (PostgreSQL): every read is a real count there.
    """
    if not kept_by_triggers(conn):
        return []
    kept = {
        r[0]: _number(counter, r[1])
        for r in conn.execute(f"SELECT key, n FROM {TABLE} WHERE name = ?", (counter.name,)).fetchall()
    }
    real = {r[0]: _number(counter, r[1]) for r in conn.execute(counter.truth_sql()).fetchall()}
    return [
        {"counter": counter.name, "key": key, "kept": kept.get(key), "real": real.get(key, 0)}
        for key in sorted(set(kept) | set(real))
        if not _same(kept.get(key), real.get(key, 0))
        and not (counter.key and kept.get(key) is None and real.get(key) == 0)
    ]


def _same(kept: int | float | None, real: int | float) -> bool:
    """Equal; a float sum (cost) within its rounding: a running sum of doubles drifts in the last bits."""
    if kept is None or isinstance(kept, int) or isinstance(real, int):
        return kept == real
    return math.isclose(kept, real, rel_tol=1e-9, abs_tol=1e-9)
