"""What the status snapshot reads, known before it runs: PostgreSQL sends it ahead in one round trip.

`snapshot_reads_sync` lists the statements `snapshot.snapshot_sync` sends
when it reads everything again, each with its parameters, for
`db.read_ahead_sync`; a statement it did not foresee is sent on its own in the
same transaction, so a wrong guess costs a round trip, never a wrong row.
"""

from __future__ import annotations

from collections.abc import Mapping

from backend.memory.index import INDEX_LAG_SQL, TURNS_INDEXED_SQL
from backend.ops import api_status, model_health, tool_status
from backend.ops.snapshot import OLDEST_INPUTS, RECENT_STOPPED_MS, ListLimits
from backend.ops.status_queries import FAILED_SUMMARIES, LIST_CAP, LIST_QUERIES, Window
from backend.ops.totals import TOTALS_QUERIES
from backend.store import counters, workers
from backend.store.db import Conn, Query, engine_of


def snapshot_reads_sync(
    conn: Conn, now: int, limits: ListLimits | None = None, taken: Mapping[str, int] | None = None
) -> list[Query]:
    """The statements `snapshot_sync(conn, now, limits=limits)` sends when it reads everything again
    (no cache hit), each with its parameters: what PostgreSQL reads ahead in one round trip
    (`db.read_ahead_sync`). A Backlog or drift window's caps are guessed with the rows each list
    read last time (`taken`, the last read's; none: empty lists): a guess that misses costs a round
    trip, never a wrong row."""
    lists, guess = limits or ListLimits(), _Guess(taken or {})
    reads: list[Query] = [(counters.counts_sql_sync(conn), ())]
    reads += _backlog_reads(lists.backlog, guess, engine_of(conn) == "postgresql")
    reads += [
        (LIST_QUERIES["leases"], {"cap": LIST_CAP}),
        (LIST_QUERIES["receipt_mismatched"], {"cap": lists.mismatched}),
    ]
    drift = Window(None if limits is None else lists.drift)
    reads += guess.lists(drift, ("dream_drift", "dream_legacy", "summary_stale_rows"), LIST_CAP)
    reads += [
        (LIST_QUERIES["recent_actions"], {"cap": lists.actions}),
        (LIST_QUERIES["events"], {"tail": lists.events}),
        (LIST_QUERIES["workers"], {"recent": now - RECENT_STOPPED_MS, "cap": LIST_CAP}),
        (INDEX_LAG_SQL, ()),
        (TURNS_INDEXED_SQL, ()),
        (model_health.CALLS_SQL, {"since": now - model_health.WINDOW_MS, "cap": model_health.WINDOW_ROWS}),
        (model_health.LAST_CALL_SQL, ()),
        (api_status.QUERIES["api_servers"], {"cap": api_status.SERVER_CAP}),
    ]
    if lists.sessions > 0:
        reads.append((model_health.USAGE_SESSIONS_SQL, {"cap": lists.sessions}))
    by_time = {"now": now}
    fresh = {"fresh": now - workers.WORKER_DEAD_AFTER_MS}
    for name, sql in TOTALS_QUERIES.items():
        params = fresh if name == "alive_owners" else by_time if ":now" in sql else ()
        reads.append((sql, params))
    return reads


def _backlog_reads(window: int | None, guess: _Guess, counted: bool) -> list[Query]:
    """`_backlog_rows_sync`'s statements, each list guessed to read what it read last time."""
    read = Window(window)
    reads: list[Query] = []
    for name, sql in tool_status.CALL_QUERIES.items():
        reads.append((sql, {"cap": read.cap(LIST_CAP)}))
        guess.took(read, name, LIST_CAP)
    reads.append((tool_status.QUERIES["tools_servers"], {"cap": LIST_CAP}))
    if read.cap(model_health.USAGE_CAP) > 0:
        reads.append((model_health.HELD_SQL, {"cap": read.cap(model_health.USAGE_CAP)}))
    guess.took(read, "held", model_health.USAGE_CAP)
    if window is None:
        reads += guess.lists(read, ("recoveries",), LIST_CAP)
    else:
        reads.append((LIST_QUERIES["held_count"], ()))
        reads += guess.lists(read, ("recoveries_parked_first",), LIST_CAP)
    reads += guess.lists(read, ("summary_failed",), FAILED_SUMMARIES)
    if read.cap(LIST_CAP) > 0:
        reads.append((LIST_QUERIES[OLDEST_INPUTS[counted]], {"scan": read.cap(LIST_CAP)}))
    return reads


class _Guess:
    """A window's lists read as `Window` reads them, each guessed to take the rows it took last time."""

    def __init__(self, taken: Mapping[str, int]) -> None:
        self.taken = taken

    def took(self, read: Window, name: str, default: int) -> None:
        read.took(min(self.taken.get(name, 0), read.cap(default)))

    def lists(self, read: Window, names: tuple[str, ...], default: int) -> list[Query]:
        """The statements `read.rows(conn, name, default)` sends for each of `names`, in order."""
        reads: list[Query] = []
        for name in names:
            if read.cap(default) > 0:
                reads.append((LIST_QUERIES[name], {"cap": read.cap(default)}))
            self.took(read, name, default)
        return reads
