"""The summary_job rows receipt recovery works on: `Job`, its columns, and the selections of them
(pending, all, named), in batches."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

from backend.chroma.ownership import session_id_of, summary_row_id
from backend.core import clock
from backend.core.errors import BadInput, ReceiptNotFound
from backend.store.db import Database, Row
from backend.summaries.receipts import ReceiptVerdict

BATCH_SIZE = 500
# a row that stayed mismatched after a replay is retried no sooner than this
RETRY_AFTER_MS = 30_000

# a live lease: someone holds the row right now (a synthesis or another replay)
NOT_LEASED = "NOT (owner_id IS NOT NULL AND lease_expires_at > :now)"


@dataclass(kw_only=True)
class Job:
    """One summary_job row as recovery sees it."""

    session_id: str
    status: str
    owner_id: str | None
    epoch: int
    lease_expires_at: int | None
    envelope: Any
    encoding: str | None
    staged_at: int | None
    acknowledged_at: int | None
    last_replayed_at: int | None
    quarantined_at: int | None
    verdict: str | None  # the stored text: a ReceiptVerdict, unless the column was written by hand
    verdict_detail: str | None

    @classmethod
    def from_row(cls, row: Row) -> Job:
        return cls(**{field: row[column] for field, column in JOB_FIELDS.items()})

    @property
    def summary_id(self) -> str:
        return summary_row_id(self.session_id)

    def leased(self, now: int) -> bool:
        return self.owner_id is not None and (self.lease_expires_at or 0) > now

    def cas(self) -> dict[str, Any]:
        return {"sid": self.session_id, "env": self.envelope, "staged": self.staged_at}


# Job field -> its summary_job column (the receipt's own columns carry a `result_` prefix);
# the SELECT lists and Job.from_row both come from it
_RESULT_FIELDS = ("envelope", "encoding", "staged_at", "acknowledged_at", "last_replayed_at")
JOB_FIELDS = {f.name: f"result_{f.name}" if f.name in _RESULT_FIELDS else f.name for f in fields(Job)}
JOB_COLUMNS = ", ".join(JOB_FIELDS.values())
PENDING_SQL = f"""
SELECT {JOB_COLUMNS} FROM summary_job
WHERE result_staged_at IS NOT NULL AND result_acknowledged_at IS NULL AND quarantined_at IS NULL
  AND (result_staged_at, session_id) > (:staged, :sid)
ORDER BY result_staged_at, session_id LIMIT :n"""
ALL_SQL = f"""
SELECT {JOB_COLUMNS} FROM summary_job
WHERE result_staged_at IS NOT NULL AND session_id > :sid ORDER BY session_id LIMIT :n"""


# -- selections ------------------------------------------------------------------


async def pending_batches(
    db: Database, batch_size: int = BATCH_SIZE, *, now: int | None = None
) -> AsyncIterator[list[Job]]:
    """Staged receipts never acknowledged (a summarizer died), oldest first.

    A row that stayed mismatched after a replay waits RETRY_AFTER_MS before
    the next attempt, so a stubborn row cannot turn the daemon into a hot loop.
    """
    now = clock.now_ms() if now is None else now
    staged, sid = -1, ""
    while True:
        rows = await db.fetchall(PENDING_SQL, {"staged": staged, "sid": sid, "n": batch_size})
        if not rows:
            return
        jobs = [Job.from_row(r) for r in rows]
        staged, sid = jobs[-1].staged_at or 0, jobs[-1].session_id
        ready = [j for j in jobs if not _backing_off(j, now)]
        if ready:
            yield ready


def _backing_off(job: Job, now: int) -> bool:
    return (
        job.verdict not in (None, ReceiptVerdict.PRESENT)
        and job.last_replayed_at is not None
        and now - job.last_replayed_at < RETRY_AFTER_MS
    )


async def all_batches(db: Database, batch_size: int = BATCH_SIZE) -> AsyncIterator[list[Job]]:
    """Every staged receipt, by session id."""
    sid = ""
    while True:
        rows = await db.fetchall(ALL_SQL, {"sid": sid, "n": batch_size})
        if not rows:
            return
        jobs = [Job.from_row(r) for r in rows]
        sid = jobs[-1].session_id
        yield jobs


async def named_jobs(db: Database, summary_ids: Sequence[str]) -> list[Job]:
    """The rows behind the given summary ids; refuses bad or unknown ids before anything runs."""
    session_ids = []
    for summary_id in dict.fromkeys(summary_ids):
        session_id = session_id_of(summary_id)
        if not session_id:
            raise BadInput(f"{summary_id!r} is not a summary id; summary ids look like summary_<session_id>")
        session_ids.append(session_id)
    jobs = await _jobs_of(db, session_ids)
    unknown = [summary_row_id(s) for s in session_ids if s not in jobs]
    if unknown:
        raise ReceiptNotFound(f"no staged receipt for {', '.join(unknown)}; `rem status` lists the receipts")
    return [jobs[s] for s in session_ids]


async def reread(db: Database, jobs: Sequence[Job]) -> list[Job]:
    """The same receipts as they are now (one re-staged meanwhile reads new; one gone is left out)."""
    now = await _jobs_of(db, [j.session_id for j in jobs])
    return [now[j.session_id] for j in jobs if j.session_id in now]


async def _jobs_of(db: Database, session_ids: Sequence[str]) -> dict[str, Job]:
    if not session_ids:
        return {}
    marks = ",".join("?" * len(session_ids))
    rows = await db.fetchall(
        f"SELECT {JOB_COLUMNS} FROM summary_job WHERE session_id IN ({marks}) "
        "AND result_staged_at IS NOT NULL",
        list(session_ids),
    )
    return {r["session_id"]: Job.from_row(r) for r in rows}


async def in_batches(jobs: list[Job], batch_size: int = BATCH_SIZE) -> AsyncIterator[list[Job]]:
    for start in range(0, len(jobs), batch_size):
        yield jobs[start : start + batch_size]
