"""The summarizer daemon: recover receipts, then summarize sessions whose raw turns drifted.

Order of one synthesis, chosen so that every point of death is recoverable
without calling the model again (write-ahead receipt):

1. claim   (tx)  lease + fencing epoch; the raw turns and their revision are read in
                 the same transaction, so the revision matches the turns exactly.
2. synthesize    the model call. Death here loses only this call: nothing durable yet.
3. stage   (tx)  the receipt envelope into summary_job, fenced on (owner, epoch).
                 From here on the output is durable; the model is never called again.
4. write         Chroma upsert of `summary_<session_id>` (metadata merges: Dream's
                 keys survive), then a read-back verified with `receipts.verify`.
5. acknowledge (tx)  status completed, clean_seq, summarized_revision, verdict, and
                 `publish_input_revision` for Dream, all in one transaction.

A death after 3 leaves an unacknowledged staged receipt; once its lease
expires, the next pass's recovery (which always runs first) replays it if the
row is missing or differs, and acknowledges it, publishing the revision.
Drift is decided by revision: a session whose turns hash to the revision it
was last summarized at is just marked clean.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from backend.chroma.collection import LiveRow
from backend.chroma.ownership import summary_row_id
from backend.core import clock, faults
from backend.core.errors import ChromaUnreachable, LeaseLost, ReceiptCorrupt
from backend.core.settings import settings
from backend.models.errors import ModelError
from backend.runtime.context import Context
from backend.runtime.daemon import Daemon
from backend.store import fencing
from backend.store.db import execute, fetchone, skip_locked
from backend.store.events import EventKind, append_event
from backend.store.fencing import Lease
from backend.store.handoffs import publish_input_revision
from backend.store.revision import raw_revision
from backend.store.states import JobStatus
from backend.store.workers import WorkerRole
from backend.summaries import receipt_replay, receipts
from backend.summaries.synthesizer import Synthesis, Synthesizer, load_synthesizer

MAX_ATTEMPTS = 3
RETRY_BASE_MS = 5_000

DRIFTED_SQL = """
SELECT session_id FROM summary_job
WHERE dirty_seq > clean_seq AND (lease_expires_at IS NULL OR lease_expires_at <= :now)
ORDER BY time_updated, session_id LIMIT :n"""
CLAIM_READ_SQL = """
SELECT dirty_seq, clean_seq, epoch, lease_expires_at, summarized_revision, input_revision,
       result_envelope, result_encoding, result_acknowledged_at, quarantined_at
FROM summary_job WHERE session_id = ?"""
# the grant's own columns: the attempt is counted per revision
CLAIM_SETS = (
    "status = 'in_progress', input_revision = :rev, last_error = NULL, time_updated = :now, "
    "attempts = CASE WHEN input_revision IS :rev THEN attempts + 1 ELSE 1 END"
)
STAGE_SETS = (
    "result_envelope = :env, result_encoding = :enc, result_staged_at = :now, result_acknowledged_at = NULL, "
    "result_last_replayed_at = NULL, quarantined_at = NULL, quarantine_reason = NULL, verdict = NULL, "
    "verdict_detail = NULL, verdict_checked_at = NULL, time_updated = :now"
)
ACKNOWLEDGE_SETS = (
    "status = 'completed', result_acknowledged_at = :now, summarized_revision = :rev, "
    "clean_seq = MAX(clean_seq, :dirty), owner_id = NULL, lease_expires_at = NULL, attempts = 0, "
    "last_error = NULL, verdict = 'present', verdict_detail = NULL, verdict_checked_at = :now, time_updated = :now"
)
RELEASE_SETS = (
    "status = 'pending', owner_id = NULL, lease_expires_at = NULL, last_error = :reason, time_updated = :now"
)
VERDICT_SETS = ", verdict = :verdict, verdict_detail = :detail, verdict_checked_at = :now"
# a pending row's lease_expires_at (with no owner) is its retry-after time
FAIL_SETS = (
    "status = :status, owner_id = NULL, last_error = :error, time_updated = :now, lease_expires_at = :retry, "
    "clean_seq = CASE WHEN :final = 1 THEN MAX(clean_seq, :dirty) ELSE clean_seq END"
)


@dataclass(kw_only=True)
class Claim:
    """A summary_job lease this summarizer holds, and the turns it read under it."""

    lease: Lease
    revision: str
    turns: list[dict[str, Any]]
    dirty_seq: int
    attempts: int
    project: str = "default"

    @property
    def session_id(self) -> str:
        return self.lease.key

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    @property
    def summary_id(self) -> str:
        return summary_row_id(self.session_id)


CLEAN = "clean"


class Summarizer(Daemon):
    role = WorkerRole.SUMMARIZER

    def __init__(
        self,
        ctx: Context,
        *,
        once: bool = False,
        owner_id: str | None = None,
        synthesizer: Synthesizer | None = None,
    ) -> None:
        super().__init__(ctx, once=once, owner_id=owner_id)
        self.synthesizer = synthesizer or load_synthesizer()
        self.lease_ms = receipt_replay.summary_lease_ms()
        # a full verification sweep runs on the first pass and then at this interval
        self.sweep_ms = settings.receipt_sweep_ms
        self.batch = settings.summary_batch
        self._last_sweep: int | None = None
        self._claim: Claim | None = None

    def info(self) -> dict[str, Any]:
        return {"synthesizer": self.synthesizer.name, "lease_ms": self.lease_ms}

    async def run_pass(self) -> int:
        """Recover receipts first, then summarize drifted sessions."""
        handled = await self.recover()
        for session_id in await self._drifted():
            if self.draining.is_set():
                break
            handled += await self.summarize(session_id)
        return handled

    # -- recovery -------------------------------------------------------------

    async def recover(self) -> int:
        """Replay unacknowledged receipts (and, periodically, verify all of them)."""
        now = clock.now_ms()
        sweep = self._last_sweep is None or now - self._last_sweep >= self.sweep_ms
        batches = (
            receipt_replay.all_batches(self.db) if sweep else receipt_replay.pending_batches(self.db, now=now)
        )
        recovery = receipt_replay.Recovery(
            self.db, self.ctx.store(), actor=self.owner_id, lease_ms=self.lease_ms
        )
        report = await recovery.run(batches)
        if sweep:
            self._last_sweep = now
        self._log_recovery(report, sweep)
        return report.rows_written

    def _log_recovery(self, report: receipt_replay.Report, sweep: bool) -> None:
        """One line for a recovery pass that wrote, quarantined or could not verify anything."""
        c = report.counters
        if report.rows_written or c.quarantined or c.unverified:
            self.log.info(
                "%s recovery (%s): scanned %d present %d replayed %d acknowledged %d "
                "quarantined %d unverified %d superseded %d",
                self.owner_id,
                "sweep" if sweep else "pending",
                c.scanned,
                c.present,
                c.replayed,
                c.acknowledged,
                c.quarantined,
                c.unverified,
                c.superseded,
            )

    # -- drift and synthesis ----------------------------------------------------

    async def _drifted(self) -> list[str]:
        rows = await self.db.fetchall(DRIFTED_SQL, {"now": clock.now_ms(), "n": self.batch})
        return [r["session_id"] for r in rows]

    async def summarize(self, session_id: str) -> int:
        """Claim (or mark clean) one drifted session and summarize it; 1 when its state changed."""
        claim = await self._claim_or_clean(session_id)
        if claim is None:
            return 0
        if isinstance(claim, Claim):
            await self.summarize_claimed(claim)
        return 1

    async def summarize_claimed(self, claim: Claim) -> None:
        """Synthesize, stage, write and acknowledge under a lease; a lost lease stops it cold."""
        self._claim = claim
        self.leases.hold(claim.lease)  # renewed by the daemon's upkeep while the model works
        try:
            await self._synthesize_and_write(claim)
        except LeaseLost as exc:
            self.log.warning("%s lost the lease on %s: %s", self.owner_id, claim.summary_id, exc)
        finally:
            self.leases.drop(claim.lease)
            self._claim = None

    async def _claim_or_clean(self, session_id: str) -> Claim | str | None:
        """In one transaction: read the turns, decide drift by revision, then claim or mark clean."""
        async with self.db.tx() as conn:
            now = clock.now_ms()
            # PostgreSQL: the job row stays locked until this claim commits; a rival skips it
            row = await fetchone(conn, CLAIM_READ_SQL + skip_locked(conn), (session_id,))
            if row is None or row["dirty_seq"] <= row["clean_seq"] or (row["lease_expires_at"] or 0) > now:
                return None
            revision, turns = await raw_revision(conn, session_id)
            if not _needs_synthesis(row, revision, turns):
                await execute(
                    conn,
                    "UPDATE summary_job SET clean_seq = MAX(clean_seq, ?) WHERE session_id = ?",
                    (row["dirty_seq"], session_id),
                )
                self.log.info(
                    "%s: summary_%s already at %s, marked clean", self.owner_id, session_id, revision
                )
                return CLEAN
            claimed = await fencing.claim_row(
                conn,
                fencing.SUMMARY_JOB,
                session_id,
                self.owner_id,
                now=now,
                length_ms=self.lease_ms,
                when="epoch = :seen",
                sets=CLAIM_SETS,
                params={"rev": revision, "now": now, "seen": row["epoch"]},
                returning="attempts",
            )
            if claimed is None:  # the epoch moved since the read (cannot happen under the row lock): not ours
                return None
            lease, granted = claimed
            attempts = int(granted["attempts"])
            project = await fetchone(conn, "SELECT project FROM session WHERE id = ?", (session_id,))
            await append_event(
                conn,
                kind=EventKind.SUMMARY_CLAIMED,
                actor=self.owner_id,
                session_id=session_id,
                target=summary_row_id(session_id),
                data={"epoch": lease.epoch, "revision": revision, "turns": len(turns)},
                now=now,
            )
        self.log.info(
            "%s claimed summary_%s (epoch %d, %d turns)", self.owner_id, session_id, lease.epoch, len(turns)
        )
        return Claim(
            lease=lease,
            revision=revision,
            turns=turns,
            dirty_seq=int(row["dirty_seq"]),
            attempts=attempts,
            project=project[0] if project else "default",
        )

    async def _write_and_read_back(
        self, claim: Claim, receipt: receipts.Receipt, vector: list[float]
    ) -> LiveRow | None:
        """Upsert the staged receipt's row into Chroma and read it back (None: not there)."""
        try:
            faults.point("summarizer.before_chroma_write")
            store = self.ctx.store()
            await store.upsert(
                [claim.summary_id],
                [receipt.document],
                [receipts.chroma_metadata(receipt)],
                embeddings=[vector],
            )
            faults.point("summarizer.after_chroma_write")
            return (await store.rows([claim.summary_id])).get(claim.summary_id)
        except ChromaUnreachable:
            # the receipt is staged: hand the row to recovery instead of holding the lease
            await self._release(claim, "chroma unreachable; recovery replays the staged receipt")
            raise

    async def _synthesize_and_write(self, claim: Claim) -> None:
        try:
            synthesis = await self.synthesizer.synthesize(claim.session_id, claim.turns)
            # the vector is part of what the receipt attests: embedded before staging
            vector = (await self.ctx.store().embed([synthesis.document]))[0]
            receipt = receipts.issue(synthesis.document, self._metadata(claim, synthesis), embedding=vector)
        except Exception as exc:  # any model or plugin failure: counted, retried with backoff
            await self._fail(claim, exc)
            return
        faults.point("summarizer.after_synthesis")
        await self._stage(claim, receipt)
        faults.point("summarizer.after_receipt")
        row = await self._write_and_read_back(claim, receipt, vector)
        verdict = receipts.verify(receipt, row)
        faults.point("summarizer.before_acknowledge")
        if verdict.present:
            await self._acknowledge(claim, receipt)
        else:
            await self._release(claim, f"read-back {verdict.verdict}; recovery replays it", verdict)
        faults.point("summarizer.after_acknowledge")

    def _metadata(self, claim: Claim, synthesis: Synthesis) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "sessionId": claim.session_id,
            "memoryCount": len(claim.turns),
            "timestamp": clock.now_ms(),
            "title": synthesis.title,
            "category": synthesis.category,
            "dreamInputRevision": claim.revision,
            "summarizer": self.synthesizer.name,
            "project": claim.project,
        }
        if synthesis.keywords:  # Chroma refuses empty lists
            metadata["keywords"] = list(synthesis.keywords)
        # a plug-in that leaves a value out gives None: that key is missing, and issuance says so
        return {key: value for key, value in metadata.items() if value is not None}

    async def _stage(self, claim: Claim, receipt: receipts.Receipt) -> None:
        """Make the synthesis durable before anything is written to Chroma (write-ahead)."""
        envelope = receipts.encode(receipt)
        async with self.db.tx() as conn:
            now = clock.now_ms()
            await fencing.write(
                conn,
                claim.lease,
                STAGE_SETS,
                {"env": envelope, "enc": receipts.encoding_of(receipt), "now": now},
                lost=f"{claim.summary_id}: lease epoch {claim.epoch} is no longer ours; staged nothing",
            )
            await append_event(
                conn,
                kind=EventKind.SUMMARY_STAGED,
                actor=self.owner_id,
                session_id=claim.session_id,
                target=claim.summary_id,
                data={"epoch": claim.epoch, "revision": claim.revision, "bytes": len(envelope)},
                now=now,
            )

    async def _acknowledge(self, claim: Claim, receipt: receipts.Receipt) -> None:
        """Complete the job and publish the revision for Dream, in one transaction."""
        async with self.db.tx() as conn:
            now = clock.now_ms()
            await fencing.write(
                conn,
                claim.lease,
                ACKNOWLEDGE_SETS,
                {"now": now, "rev": receipt.revision, "dirty": claim.dirty_seq},
                lost=f"{claim.summary_id}: lease epoch {claim.epoch} lost before acknowledge; "
                "published nothing (recovery completes the staged receipt)",
            )
            await publish_input_revision(conn, claim.session_id, receipt.revision, now)
            await append_event(
                conn,
                kind=EventKind.SUMMARY_COMPLETED,
                actor=self.owner_id,
                session_id=claim.session_id,
                target=claim.summary_id,
                data={"epoch": claim.epoch, "revision": receipt.revision},
                now=now,
            )
        self.log.info("%s completed %s at %s", self.owner_id, claim.summary_id, receipt.revision)

    async def _release(self, claim: Claim, reason: str, verdict: receipts.Verdict | None = None) -> None:
        """Give the lease back, keeping the staged receipt for recovery."""
        async with self.db.tx() as conn:
            now = clock.now_ms()
            params = _release_params(now, reason, verdict)
            sets = RELEASE_SETS + (VERDICT_SETS if verdict else "")
            changed = await fencing.write_if_held(conn, claim.lease, sets, params)
            if changed:
                await append_event(
                    conn,
                    kind=EventKind.SUMMARY_RELEASED,
                    actor=self.owner_id,
                    session_id=claim.session_id,
                    target=claim.summary_id,
                    data={"epoch": claim.epoch, "reason": reason},
                    now=now,
                )
        self.log.warning("%s released %s: %s", self.owner_id, claim.summary_id, reason)

    async def _fail(self, claim: Claim, exc: Exception) -> None:
        """A synthesis that failed: retry with backoff, and park it after MAX_ATTEMPTS."""
        final = claim.attempts >= MAX_ATTEMPTS
        error_class = exc.error_class if isinstance(exc, ModelError) else "synthesizer"
        error = f"{exc.error_class if isinstance(exc, ModelError) else type(exc).__name__}: {exc}"[:500]
        async with self.db.tx() as conn:
            now = clock.now_ms()
            changed = await fencing.write_if_held(
                conn,
                claim.lease,
                FAIL_SETS,
                {
                    "status": JobStatus.FAILED if final else JobStatus.PENDING,
                    "error": error,
                    "now": now,
                    "final": final,
                    "retry": None if final else now + RETRY_BASE_MS * 2 ** (claim.attempts - 1),
                    "dirty": claim.dirty_seq,
                },
            )
            if changed:
                await append_event(
                    conn,
                    kind=EventKind.SUMMARY_FAILED,
                    actor=self.owner_id,
                    session_id=claim.session_id,
                    target=claim.summary_id,
                    data={"error": error, "class": error_class, "attempts": claim.attempts, "parked": final},
                    now=now,
                )
        self.log.warning(
            "%s synthesis of %s failed (attempt %d%s): %s",
            self.owner_id,
            claim.summary_id,
            claim.attempts,
            ", parked" if final else "",
            error,
        )

    # -- lease upkeep ------------------------------------------------------------
    async def hand_back(self) -> None:
        if self._claim is not None:
            await self._release(self._claim, "summarizer stopped")
        close = getattr(self.synthesizer, "aclose", None)  # a model synthesizer's connections
        if close is not None:
            await close()


def _needs_synthesis(row: Any, revision: str, turns: list[dict[str, Any]]) -> bool:
    """Drift by revision: synthesize only when no durable output covers these exact turns."""
    if not turns:
        return False
    if row["quarantined_at"] is not None:
        return True  # the receipt is unusable; only a fresh synthesis replaces it
    if row["result_acknowledged_at"] is None and row["result_envelope"] is not None:
        try:
            staged = receipts.decode(row["result_envelope"], row["result_encoding"])
        except ReceiptCorrupt:
            staged = None  # recovery quarantines it
        if staged is not None and staged.revision == revision:
            return False  # durable but unacknowledged: recovery completes it without the model
    return bool(row["summarized_revision"] != revision)


def _release_params(now: int, reason: str, verdict: receipts.Verdict | None) -> dict[str, Any]:
    """The release's parameters: why, and the verdict on the staged receipt when there is one."""
    detail = verdict.detail() if verdict is not None else None
    return {
        "now": now,
        "reason": reason,
        "verdict": verdict.verdict if verdict else None,
        "detail": json.dumps(detail) if detail else None,
    }
