"""What a receipt recovery pass records in state.db, one transaction per batch: quarantined envelopes,
rows confirmed present, rewritten rows settled (lease released, read-back verdict recorded), the
jobs it completed, and the journal events that go with each."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

import aiosqlite

from backend.core.settings import settings
from backend.store import fencing
from backend.store.db import Database, execute, fetchone
from backend.store.events import EventKind, append_event
from backend.store.fencing import Lease
from backend.store.handoffs import publish_input_revision
from backend.summaries import receipts
from backend.summaries.receipts import Receipt, ReceiptVerdict, Verdict
from backend.summaries.replay_jobs import NOT_LEASED, Job
from backend.summaries.replay_report import Counters, ReplayOutcome, Report, row_report

log = logging.getLogger("rem.replay")
# quarantined envelopes up to this size are copied into the journal as evidence
JOURNAL_ENVELOPE_MAX = 64 * 1024


@dataclass(kw_only=True)
class Checked:
    """A decoded receipt and the verdict on its live row."""

    job: Job
    receipt: Receipt
    verdict: Verdict
    lease: Lease | None = None  # the lease this pass took to re-write the row

    @property
    def epoch(self) -> int:
        return 0 if self.lease is None else self.lease.epoch


_ACK_SET = (
    "status = 'completed', result_acknowledged_at = :now, summarized_revision = :rev, owner_id = NULL, "
    "lease_expires_at = NULL, attempts = 0, last_error = NULL, time_updated = :now, "
)
_VERDICT_SET = "verdict = :verdict, verdict_detail = :detail, verdict_checked_at = :now "
# quarantine the job's receipt, if the job still holds the receipt the pass read
_QUARANTINE_SQL = (
    "UPDATE summary_job SET quarantined_at = :now, quarantine_reason = :reason, verdict = :verdict, "
    "verdict_detail = :detail, verdict_checked_at = :now "
    "WHERE session_id = :sid AND result_envelope IS :env AND result_staged_at IS :staged"
)
# the job still holds the receipt the pass read, and no one holds its lease
_UNCHANGED_UNLEASED = (
    f"WHERE session_id = :sid AND result_envelope IS :env AND result_staged_at IS :staged AND {NOT_LEASED}"
)


def _unverified_reason(after: Verdict) -> str:
    if any(k.reason == receipts.KeyReason.VECTOR_DIFFERS for k in after.keys):
        return (
            "read-back after replay still differs: the configured embedder "
            f"(REM_EMBEDDER={settings.embedder}) no longer reproduces the vector this receipt attests "
            "(was the embedder changed since it was written?)"
        )
    return "read-back after replay still differs"


def needs_write(c: Checked) -> bool:
    """A present row needs a write only to acknowledge it or to correct a stale verdict."""
    return (
        c.job.acknowledged_at is None
        or c.job.verdict != ReceiptVerdict.PRESENT
        or c.job.verdict_detail is not None
    )


def _evidence(envelope: Any) -> dict[str, Any]:
    raw = envelope.encode("utf-8", "surrogatepass") if isinstance(envelope, str) else bytes(envelope or b"")
    evidence: dict[str, Any] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    if len(raw) <= JOURNAL_ENVELOPE_MAX:
        evidence["envelope_b64"] = base64.b64encode(raw).decode("ascii")
    return evidence


class Finalization:
    """The state.db side of a recovery pass (`receipt_replay.Recovery` is the rest of it)."""

    db: Database
    actor: str
    report: Report
    report_present: bool
    # an event (kind, data) appended in the same transaction as the pass's last effects
    final_event: dict[str, Any] | None

    @property
    def counters(self) -> Counters:
        return self.report.counters

    def _note(
        self, job: Job, outcome: ReplayOutcome, verdict: Verdict | None = None, reason: str | None = None
    ) -> None:
        if outcome != ReplayOutcome.PRESENT or self.report_present:
            self.report.rows.append(row_report(job, outcome, verdict, reason))

    async def _finalize(
        self,
        conn: aiosqlite.Connection,
        corrupt: list[tuple[Job, str]],
        present: list[Checked],
        replayed: list[tuple[Checked, Verdict]],
        now: int,
    ) -> None:
        for job, reason in corrupt:
            await self._quarantine(conn, job, reason, now)
        for c in present:
            await self._confirm(conn, c, now)
        for c, after in replayed:
            await self._settle(conn, c, after, now)

    async def _quarantine(self, conn: aiosqlite.Connection, job: Job, reason: str, now: int) -> None:
        self.counters.quarantined += 1
        self._note(job, ReplayOutcome.QUARANTINED, reason=reason)
        if job.quarantined_at is not None:
            return
        detail = json.dumps({"verdict": ReceiptVerdict.QUARANTINED, "reason": reason, "keys": []})
        quarantined = {"now": now, "reason": reason, "detail": detail, "verdict": ReceiptVerdict.QUARANTINED}
        changed = await execute(conn, _QUARANTINE_SQL, {**job.cas(), **quarantined})
        if not changed:
            self.counters.quarantined -= 1
            self.counters.superseded += 1
            return
        self.report.rows_written += 1
        log.warning("receipt %s quarantined: %s", job.summary_id, reason)
        await self._journal_quarantined(conn, job, reason, now)

    async def _journal_quarantined(self, conn: aiosqlite.Connection, job: Job, reason: str, now: int) -> None:
        """`receipt.quarantined`, with the evidence of the envelope that could not be read."""
        await append_event(
            conn,
            kind=EventKind.RECEIPT_QUARANTINED,
            actor=self.actor,
            session_id=job.session_id,
            target=job.summary_id,
            data={"reason": reason, **_evidence(job.envelope)},
            now=now,
        )

    async def _confirm(self, conn: aiosqlite.Connection, c: Checked, now: int) -> None:
        """A row found present: acknowledge it if unacknowledged, refresh a stale verdict."""
        if not needs_write(c):
            self._count_completed(c, ReplayOutcome.PRESENT)
            return
        ack = c.job.acknowledged_at is None
        present = {"now": now, "rev": c.receipt.revision, "verdict": ReceiptVerdict.PRESENT, "detail": None}
        changed = await execute(
            conn,
            "UPDATE summary_job SET " + _ACK_SET * ack + _VERDICT_SET + _UNCHANGED_UNLEASED,
            {**c.job.cas(), **present},
        )
        if not changed:
            await self._lost(conn, c.job, now)
            return
        self.report.rows_written += 1
        if ack:
            await self._acknowledged(conn, c, now, replayed=False)
        self._count_completed(c, ReplayOutcome.PRESENT)

    async def _settle(self, conn: aiosqlite.Connection, c: Checked, after: Verdict, now: int) -> None:
        """A row this pass re-wrote: release the lease, record the read-back verdict."""
        ack = after.present and c.job.acknowledged_at is None
        detail = after.detail()
        assert c.lease is not None
        changed = await fencing.write_if_held(
            conn,
            c.lease,
            "owner_id = NULL, lease_expires_at = NULL, result_last_replayed_at = :now, "
            # an unacknowledged row that still differs waits for the next attempt, owned by nobody
            + (
                _ACK_SET.replace("owner_id = NULL, lease_expires_at = NULL, ", "")  # set above already
                if ack
                else "status = CASE WHEN result_acknowledged_at IS NULL THEN 'pending' ELSE status END, "
            )
            + _VERDICT_SET,
            {
                "now": now,
                "rev": c.receipt.revision,
                "verdict": after.verdict,
                "detail": json.dumps(detail) if detail else None,
            },
        )
        if not changed:
            log.warning("replay of %s lost its lease (epoch %d)", c.job.summary_id, c.epoch)
            self.counters.superseded += 1
            self._note(c.job, ReplayOutcome.SUPERSEDED, reason="lease lost during replay")
            return
        self.report.rows_written += 1
        self.counters.replayed += 1
        await append_event(
            conn,
            kind=EventKind.RECEIPT_REPLAYED,
            actor=self.actor,
            session_id=c.job.session_id,
            target=c.job.summary_id,
            data={"before": c.verdict.detail(), "verified": after.present, "after": detail},
            now=now,
        )
        if ack:
            await self._acknowledged(conn, c, now, replayed=True)
        if c.verdict.verdict == ReceiptVerdict.MISSING:
            # the row was re-created from the receipt: Dream's keys went with the old row,
            # so ask Dream to write its overlay again (it never creates rows itself)
            await execute(
                conn,
                "UPDATE dream_state SET overlay_pending = 1, overlay_retry_at = 0 "
                "WHERE session_id = ? AND (completed_revision IS NOT NULL "
                "OR digest_state IN ('deferred', 'undigestible'))",
                (c.job.session_id,),
            )
        if after.present:
            self._count_completed(c, ReplayOutcome.REPLAYED)
        else:
            self.counters.unverified += 1
            self._note(c.job, ReplayOutcome.UNVERIFIED, after, reason=_unverified_reason(after))

    def _count_completed(self, c: Checked, outcome: ReplayOutcome) -> None:
        self.counters.completed += 1
        if outcome == ReplayOutcome.PRESENT:
            self.counters.present += 1
        self._note(c.job, outcome, c.verdict)

    async def _acknowledged(
        self, conn: aiosqlite.Connection, c: Checked, now: int, *, replayed: bool
    ) -> None:
        """Recovery completed a job its summarizer never acknowledged: publish its revision too."""
        self.counters.acknowledged += 1
        await publish_input_revision(conn, c.job.session_id, c.receipt.revision, now)
        await append_event(
            conn,
            kind=EventKind.SUMMARY_COMPLETED,
            actor=self.actor,
            session_id=c.job.session_id,
            target=c.job.summary_id,
            data={"revision": c.receipt.revision, "recovered": True, "replayed": replayed},
            now=now,
        )
        log.info("summary %s completed by recovery (replayed=%s)", c.job.summary_id, replayed)

    async def _lost(self, conn: aiosqlite.Connection, job: Job, now: int) -> None:
        """Count a row whose compare-and-swap failed: re-staged meanwhile, or leased by someone."""
        row = await fetchone(
            conn,
            "SELECT result_envelope, result_staged_at, owner_id, lease_expires_at "
            "FROM summary_job WHERE session_id = ?",
            (job.session_id,),
        )
        if (
            row is not None
            and row["result_envelope"] == job.envelope
            and row["result_staged_at"] == job.staged_at
            and row["owner_id"]
            and (row["lease_expires_at"] or 0) > now
        ):
            self.counters.skipped_active += 1
            self._note(job, ReplayOutcome.SKIPPED_ACTIVE, reason=f"leased by {row['owner_id']}")
        else:
            self.counters.superseded += 1
            self._note(job, ReplayOutcome.SUPERSEDED, reason="re-staged since it was read")

    async def _final_event(self, conn: aiosqlite.Connection) -> None:
        if self.final_event is None:
            return
        data = {**self.final_event.get("data", {}), "counters": asdict(self.counters), "ok": self.report.ok}
        await append_event(conn, kind=self.final_event["kind"], actor=self.actor, data=data)
