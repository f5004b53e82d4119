"""Throughput from the journal: turns, summaries, Dream passes, operator actions, turn latency.

Counters must only grow, survive restarts and agree between processes, yet
`event` is pruned after its retention window and has no index by kind (every
index costs a page on the turn path). So the totals are a *tally*: the events
up to some journal id folded into counts, plus the events after it. `rem up`
keeps a tally in the history store (`backend/store/history.py`), folded every
few seconds, long before the journal's old end is pruned; every reader starts
from it and folds the journal's tail after it in bounded id ranges, and a
long-lived reader (the console, `rem metrics`) keeps its tally between calls,
so each refresh reads only the events that arrived since the last one. With
no history store (a data dir `rem up` never ran on), the tally starts at the
journal's oldest retained event; `since` says from when.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.core.errors import RemError
from backend.ops.records import LatencyHistogram, OperatorActionCount, Throughput
from backend.runtime.context import Context
from backend.store.db import Conn, Database, Reader, Row, read_together_sync
from backend.store.history import HistoryStore

# turn latency: input admitted -> the turn's reply completed (the executor's execution.completed)
TURN_LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# journal ids folded per query: bounds one read (and its transaction) whatever the backlog
FOLD_ID_RANGE = 50_000

COUNTED_KINDS = {
    "execution.completed": "turns_completed",
    "summary.completed": "summaries_completed",
    "summary.failed": "summaries_failed",
    "dream.completed": "dream_digested",
    "receipt.replayed": "receipts_replayed",
    "receipt.quarantined": "receipts_quarantined",
}
COUNTER_NAMES = tuple(COUNTED_KINDS.values())

_KINDS_SQL = ", ".join(f"'{k}'" for k in COUNTED_KINDS)
# one aggregate per id range: the rows never leave SQLite; operator kinds by prefix, so
# an action added later (operator.resume) is counted without a change here
FOLD_SQL = f"""
SELECT kind, json_extract(data, '$.result') AS result, CAST(json_extract(data, '$.forced') AS TEXT) IN ('1', 'true') AS forced,
       count(*) AS n
FROM event WHERE id > :after AND id <= :upto
  AND (kind IN ({_KINDS_SQL}) OR kind GLOB 'operator.*')
  AND (kind != 'execution.completed' OR CAST(json_extract(data, '$.turn') AS TEXT) IN ('1', 'true'))
GROUP BY 1, 2, 3
"""
_BUCKET_COLUMNS = ", ".join(f"sum(ms <= {b * 1000:g})" for b in TURN_LATENCY_BUCKETS_S)
LATENCY_SQL = f"""
SELECT count(ms), coalesce(sum(ms), 0), {_BUCKET_COLUMNS} FROM (
  SELECT CAST(json_extract(data, '$.latency_ms') AS DOUBLE PRECISION) AS ms FROM event
  WHERE id > :after AND id <= :upto AND kind = 'execution.completed' AND CAST(json_extract(data, '$.turn') AS TEXT) IN ('1', 'true'))
WHERE ms IS NOT NULL
"""
LAST_ID_SQL = "SELECT coalesce(max(id), 0) FROM event"
FIRST_SQL = "SELECT id - 1, time FROM event ORDER BY id LIMIT 1"


def _range_reader(params: dict[str, int]) -> Reader[tuple[list[Row], list[Row]]]:
    """An id range's event counts (`FOLD_SQL`) and turn latencies (`LATENCY_SQL`), in one round."""
    folded, latency = yield [(FOLD_SQL, params), (LATENCY_SQL, params)]
    return folded, latency


def action_result(result: Any, forced: Any) -> str:
    """An operator event's result label: what its data says, `forced`, or `ok`."""
    if isinstance(result, str) and result:
        return result
    return "forced" if forced else "ok"


@dataclass
class JournalTally:
    """Journal events folded into counts, up to and including `through_id`."""

    through_id: int = 0
    since: int | None = None
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTER_NAMES, 0))
    actions: dict[tuple[str, str], int] = field(default_factory=dict)
    # per bucket (not cumulative), the last one past the largest bound
    latency: list[int] = field(default_factory=lambda: [0] * (len(TURN_LATENCY_BUCKETS_S) + 1))
    latency_sum_ms: float = 0.0

    def fold_sync(self, conn: Conn, *, max_ranges: int | None = None) -> int:
        """Fold every event after `through_id` (in bounded id ranges); returns the ranges read."""
        if self.through_id == 0 and self.since is None:
            first = conn.execute(FIRST_SQL).fetchone()
            if first is None:
                return 0
            self.through_id, self.since = int(first[0]), int(first[1])
        last = int(conn.execute(LAST_ID_SQL).fetchone()[0])
        ranges = 0
        while self.through_id < last and (max_ranges is None or ranges < max_ranges):
            upto = min(last, self.through_id + FOLD_ID_RANGE)
            self._fold_range_sync(conn, self.through_id, upto)
            self.through_id = upto
            ranges += 1
        return ranges

    def _fold_range_sync(self, conn: Conn, after: int, upto: int) -> None:
        # both aggregates of the range read together (PostgreSQL: one round trip, not two)
        folded, latency = read_together_sync(conn, [_range_reader({"after": after, "upto": upto})])[0]
        for kind, result, forced, n in folded:
            if kind in COUNTED_KINDS:
                self.counters[COUNTED_KINDS[kind]] += n
            else:
                key = (kind.removeprefix("operator."), action_result(result, forced))
                self.actions[key] = self.actions.get(key, 0) + n
        row = latency[0]  # an aggregate: one row
        if row[0]:
            cumulative = [int(v or 0) for v in row[2:]] + [int(row[0])]
            previous = 0
            for i, value in enumerate(cumulative):
                self.latency[i] += value - previous
                previous = value
            self.latency_sum_ms += float(row[1])

    def as_dict(self) -> Throughput:
        cumulative, running = [], 0
        for value in self.latency:
            running += value
            cumulative.append(running)
        return Throughput(
            through_event_id=self.through_id,
            since=self.since,
            counters=dict(self.counters),
            turn_latency=LatencyHistogram(
                buckets_s=list(TURN_LATENCY_BUCKETS_S),
                cumulative=cumulative,
                count=running,
                sum_s=round(self.latency_sum_ms / 1000, 6),
            ),
            operator_actions=[
                OperatorActionCount(action=a, result=r, count=n) for (a, r), n in sorted(self.actions.items())
            ],
        )

    @classmethod
    def from_dict(cls, data: Throughput) -> JournalTally:
        """The tally a `Throughput` describes (the history store keeps it in this shape)."""
        tally = cls(through_id=int(data["through_event_id"]), since=data.get("since"))
        tally.counters.update({k: int(v) for k, v in data["counters"].items()})
        tally.actions = {(a["action"], a["result"]): int(a["count"]) for a in data["operator_actions"]}
        previous = 0
        for i, value in enumerate(data["turn_latency"]["cumulative"]):
            tally.latency[i] = int(value) - previous
            previous = int(value)
        tally.latency_sum_ms = float(data["turn_latency"]["sum_s"]) * 1000
        return tally


def stored_tally(root: Path) -> JournalTally | None:
    """The tally `rem up` keeps in the history store, if there is one to start from."""
    try:
        history = HistoryStore.open(root, read_only=True)
    except RemError:  # no history store (or an unreadable one): start from the journal
        return None
    try:
        stored = history.tally()
    finally:
        history.close()
    return JournalTally.from_dict(stored) if stored else None  # type: ignore[arg-type]


async def journal_tally(ctx: Context, db: Database) -> JournalTally:
    """The context's tally: started from the history store and folded up to now (in bounded id
    ranges, outside any read transaction) the first time; the caller folds it forward after."""
    tally = ctx.memo.get("journal_tally")
    if not isinstance(tally, JournalTally):
        tally = await asyncio.to_thread(stored_tally, ctx.data.root) or JournalTally()
        await db.run_in_thread(tally.fold_sync)
        ctx.memo["journal_tally"] = tally
    return tally


async def journal_throughput(ctx: Context, db: Database) -> Throughput:
    """The context's tally, started from the history store once, then folded forward each call."""
    tally = await journal_tally(ctx, db)
    await db.run_in_thread(tally.fold_sync)
    return tally.as_dict()
