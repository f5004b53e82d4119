"""Receipt recovery: put every staged receipt back on its Chroma row, with no model call.

One pass works in batches: one Chroma `get` for the batch, one `upsert` of the
rows that are not present, one read-back `get` of those, each judged by the
same ownership-aware predicate (`receipts.verify`). Rows it re-writes are
leased first (fencing epoch), so a summarizer cannot stage a newer receipt
underneath a replay and have it overwritten by the older one. Finalization is
a compare-and-swap on the envelope bytes and `result_staged_at`: a row
re-staged meanwhile is counted `superseded` and left alone.

A corrupt envelope is quarantined (bytes kept, reason recorded, journaled)
and the pass goes on. A row whose verdict has not changed is not rewritten,
so a pass over a healthy store writes nothing at all.

The summary_job rows a pass works on and their selections are in
`replay_jobs`, what it reports in `replay_report`, what it records in
state.db batch by batch in `replay_finalization` (`Recovery`'s base class),
re-recording the vectors after an embedder change in `receipt_reissue`;
their names are importable from here as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiosqlite

from backend.chroma.collection import ChromaStore
from backend.core import clock, faults
from backend.core.errors import ReceiptCorrupt
from backend.core.settings import settings
from backend.store import fencing
from backend.store.db import Database
from backend.store.events import EventKind, append_event
from backend.summaries import receipts
from backend.summaries.receipt_reissue import reissue_batch, reissue_counts, reissue_for_embedder
from backend.summaries.receipts import Receipt, Verdict
from backend.summaries.replay_finalization import JOURNAL_ENVELOPE_MAX, Checked, Finalization, needs_write
from backend.summaries.replay_jobs import (
    ALL_SQL,
    BATCH_SIZE,
    JOB_COLUMNS,
    JOB_FIELDS,
    NOT_LEASED,
    PENDING_SQL,
    RETRY_AFTER_MS,
    Job,
    all_batches,
    in_batches,
    named_jobs,
    pending_batches,
    reread,
)
from backend.summaries.replay_report import (
    Counters,
    ReplayOutcome,
    ReplayReport,
    ReplayRow,
    Report,
)

# the names callers have always imported from here (the rows, the report, reissuing: modules of their own)
__all__ = [
    "ALL_SQL",
    "BATCH_SIZE",
    "JOB_COLUMNS",
    "JOB_FIELDS",
    "JOURNAL_ENVELOPE_MAX",
    "NOT_LEASED",
    "PENDING_SQL",
    "RETRY_AFTER_MS",
    "Checked",
    "Counters",
    "Job",
    "Recovery",
    "ReplayOutcome",
    "ReplayReport",
    "ReplayRow",
    "Report",
    "all_batches",
    "in_batches",
    "named_jobs",
    "pending_batches",
    "reissue_batch",
    "reissue_counts",
    "reissue_for_embedder",
    "replay_receipts",
    "reread",
    "summary_lease_ms",
]

log = logging.getLogger("rem.replay")


def summary_lease_ms() -> int:
    """The summary_job lease length (`REM_SUMMARY_LEASE_MS`, default 5 min)."""
    return settings.summary_lease_ms


class Recovery(Finalization):
    """One recovery pass over batches of summary_job rows."""

    def __init__(
        self,
        db: Database,
        store: ChromaStore,
        *,
        actor: str,
        dry_run: bool = False,
        lease_ms: int | None = None,
        report_present: bool = False,
        final_event: dict[str, Any] | None = None,
    ) -> None:
        self.db = db
        self.store = store
        self.actor = actor
        self.dry_run = dry_run
        self.lease_ms = lease_ms or summary_lease_ms()
        self.report_present = report_present
        # an event (kind, data) appended in the same transaction as the pass's last effects
        self.final_event = final_event
        self.report = Report(dry_run=dry_run)

    async def run(self, batches: AsyncIterator[list[Job]]) -> Report:
        """Process every batch; the final event lands with the last batch's effects."""
        batch = await anext(batches, None)
        if batch is None and self.final_event is not None and not self.dry_run:
            async with self.db.tx() as conn:
                await self._final_event(conn)
        while batch is not None:
            # read the next batch from state.db while this one waits on Chroma
            following = asyncio.ensure_future(anext(batches, None))
            try:
                await self._process(batch, following)
            except BaseException:
                following.cancel()
                raise
            batch = await following
        return self.report

    # -- one batch -------------------------------------------------------------

    async def _process(self, batch: list[Job], following: asyncio.Future[list[Job] | None]) -> None:
        now = clock.now_ms()
        self.counters.scanned += len(batch)
        checked, corrupt = await self._check(batch, now)
        present = [c for c in checked if c.verdict.present]
        mismatched = [c for c in checked if not c.verdict.present]
        self.counters.mismatched += len(mismatched)
        if self.dry_run:
            self._report_dry(present, mismatched, corrupt)
            return
        leased = await self._lease(mismatched, now) if mismatched else []
        replayed = await self._rewrite(leased) if leased else []
        if replayed:
            faults.point("replay.after_rewrite")
        last = self.final_event is not None and await following is None
        await self._write_outcomes(corrupt, present, replayed, last)

    async def _write_outcomes(
        self,
        corrupt: list[tuple[Job, str]],
        present: list[Checked],
        replayed: list[tuple[Checked, Verdict]],
        last: bool,
    ) -> None:
        """The batch's outcomes in one transaction (with the final event after the `last` batch);
        a batch with nothing to write is only counted."""
        if corrupt or replayed or last or any(needs_write(c) for c in present):
            async with self.db.tx() as conn:
                await self._finalize(conn, corrupt, present, replayed, clock.now_ms())
                if last:
                    await self._final_event(conn)
        else:
            for c in present:
                self._count_completed(c, ReplayOutcome.PRESENT)

    def _unleased(self, batch: list[Job], now: int) -> list[Job]:
        """The jobs no one holds a lease on; each leased one is counted and noted as skipped."""
        eligible = []
        for job in batch:
            if job.leased(now):
                self.counters.skipped_active += 1
                self._note(job, ReplayOutcome.SKIPPED_ACTIVE, reason=f"leased by {job.owner_id}")
            else:
                eligible.append(job)
        return eligible

    async def _check(self, batch: list[Job], now: int) -> tuple[list[Checked], list[tuple[Job, str]]]:
        """Decode every envelope and judge it against its live row (one Chroma get)."""
        eligible = self._unleased(batch, now)
        # decode while Chroma answers: the get runs in a thread
        fetch = asyncio.ensure_future(self.store.rows([job.summary_id for job in eligible]))
        decoded: list[tuple[Job, Receipt]] = []
        corrupt: list[tuple[Job, str]] = []
        try:
            for job in eligible:
                try:
                    decoded.append((job, receipts.decode(job.envelope, job.encoding)))
                except ReceiptCorrupt as exc:
                    corrupt.append((job, str(exc)))
        finally:
            rows = await fetch
        checked = [
            Checked(job=job, receipt=r, verdict=receipts.verify(r, rows.get(job.summary_id)))
            for job, r in decoded
        ]
        return checked, corrupt

    def _report_dry(
        self, present: list[Checked], mismatched: list[Checked], corrupt: list[tuple[Job, str]]
    ) -> None:
        self.counters.present += len(present)
        for c in present:
            self._note(c.job, ReplayOutcome.PRESENT, c.verdict)
        for c in mismatched:
            self._note(c.job, ReplayOutcome.WOULD_REPLAY, c.verdict)
        for job, reason in corrupt:
            self.counters.quarantined += 1
            self._note(
                job,
                ReplayOutcome.QUARANTINED if job.quarantined_at else ReplayOutcome.WOULD_QUARANTINE,
                reason=reason,
            )

    async def _lease(self, mismatched: list[Checked], now: int) -> list[Checked]:
        """Take the lease on every row this pass will re-write (CAS on envelope and staged_at).

        The same transaction journals the intent (`receipt.replaying`, the rows
        about to be written): it is durable before anything is sent to Chroma.
        """
        leased: list[Checked] = []
        async with self.db.tx() as conn:
            for c in mismatched:
                claimed = await fencing.claim_row(
                    conn,
                    fencing.SUMMARY_JOB,
                    c.job.session_id,
                    self.actor,
                    now=now,
                    length_ms=self.lease_ms,
                    when=f"result_envelope IS :env AND result_staged_at IS :staged AND {NOT_LEASED}",
                    params={**c.job.cas(), "now": now},
                )
                if claimed is not None:
                    c.lease = claimed[0]
                    leased.append(c)
                else:
                    await self._lost(conn, c.job, now)
            if leased:
                await self._journal_replaying(conn, leased, now)
        return leased

    async def _journal_replaying(self, conn: aiosqlite.Connection, leased: list[Checked], now: int) -> None:
        """`receipt.replaying`: the rows about to be written, each with the verdict that sent it."""
        await append_event(
            conn,
            kind=EventKind.RECEIPT_REPLAYING,
            actor=self.actor,
            data={
                "summary_ids": [c.job.summary_id for c in leased],
                "verdicts": {c.job.summary_id: c.verdict.verdict for c in leased},
            },
            now=now,
        )

    async def _rewrite(self, leased: list[Checked]) -> list[tuple[Checked, Verdict]]:
        """One upsert of the leased rows and one strict read-back; releases the leases on failure.

        The upsert names every owned key: the receipt's values, and None (delete)
        for the owned keys it attests absent; the vector is the embedder's for
        the receipt's document, which the read-back compares with the digest.
        """
        ids = [c.job.summary_id for c in leased]
        try:
            documents = [c.receipt.document for c in leased]
            await self.store.upsert(
                ids,
                documents,
                [receipts.chroma_metadata(c.receipt) for c in leased],
                embeddings=await self.store.embed(documents),
            )
            back = await self.store.rows(ids)
        except BaseException:
            await self._release(leased)
            raise
        return [(c, receipts.verify(c.receipt, back.get(c.job.summary_id))) for c in leased]

    async def _release(self, leased: list[Checked]) -> None:
        try:
            async with self.db.tx() as conn:
                for c in leased:
                    assert c.lease is not None
                    await fencing.write_if_held(conn, c.lease, "owner_id = NULL, lease_expires_at = NULL", {})
        except Exception:  # the leases expire on their own; the original error matters more
            log.warning("could not release %d replay leases", len(leased), exc_info=True)


async def replay_receipts(
    db: Database,
    store: ChromaStore,
    *,
    actor: str,
    summary_ids: Sequence[str] | None = None,
    dry_run: bool = False,
) -> Report:
    """Replay the named receipts (or all of them): `operator.replay_intent` before anything is written,
    one `operator.replay` (the outcome) with the last effects."""
    jobs = await named_jobs(db, summary_ids) if summary_ids else None
    batches = in_batches(jobs) if jobs is not None else all_batches(db)
    targets: list[str] | str = list(dict.fromkeys(summary_ids)) if summary_ids else "all"
    outcome = {"kind": EventKind.OPERATOR_REPLAY, "data": {"operator": actor, "targets": targets}}
    final = None if dry_run else outcome
    recovery = Recovery(
        db, store, actor=actor, dry_run=dry_run, report_present=jobs is not None, final_event=final
    )
    if not dry_run:  # the operator's intent is on record before the first Chroma write
        await _journal_intent(db, actor, targets)
    return await recovery.run(batches)


async def _journal_intent(db: Database, actor: str, targets: list[str] | str) -> None:
    async with db.tx() as conn:
        await append_event(
            conn,
            kind=EventKind.OPERATOR_REPLAY_INTENT,
            actor=actor,
            data={"operator": actor, "targets": targets},
        )
