"""Dream: digest sessions' raw turns into the memory graph, fenced by input revision.

The contract (docs/architecture.md#dreams-revisions):

* Synthesis publishes `dream_state.input_revision` (`backend.store.handoffs`). A
  session is pending while `completed_revision IS NOT input_revision`; a
  surviving `graphDigested: true` on its Chroma row never hides it.
* Selection reads the partial index `dream_state_pending_idx` in *ready-time*
  order: a never-tried row is ready at `time_published`, a retried row at
  `next_attempt_at` (failure backoff or stale recheck). Every
  pass starts again from the head of that order, so no window of rows is
  skipped and a fresh session never overtakes one that was ready earlier.
  `next_attempt_at = NEVER` parks an undigestible revision until synthesis
  publishes another one (which resets it).
* A claim is a lease with a fencing epoch (`owner_id`, `epoch`,
  `lease_expires_at`); every later write names the epoch and 0 rows changed
  is `LeaseLost`: stop, publish nothing. A held row keeps its place in the
  order (other workers' claims fail on the live lease), so a lease that
  expires, or that an operator releases (`rem release`), is taken over at
  once from where the row stood.
* Dream reads the raw turns (`backend.store.revision`) and recomputes the revision.
  A mismatch writes nothing and leaves the row pending (`dream.stale`).
* The graph is built from the raw turns, never the summary prose
  (`backend.dream.graph`, idempotent), then completion of exactly the captured
  revision is attested by compare-and-swap on the claim epoch. Completing A
  after synthesis published B records `completed_revision = A` and leaves
  the row pending for B.
* Failures count `digest_attempts` per revision with backoff; the third
  failure makes that revision `undigestible` (journaled, shown to operators).
  A crash is not a failure: the lease expires and another worker takes over.
* The Chroma overlay (`backend.chroma.ownership.DREAM_OWNED_KEYS`) follows the
  state.db attestation, which stays the system of record; see
  `backend.dream.overlay` for how it is made eventually consistent when
  Chroma is down or the row is missing.

Legacy compatibility: `import_legacy` marks sessions whose Chroma row carries
only the old `graphDigested`/`digestState` flags (no revision) as
`digest_state = 'legacy'`; they are honoured as digested until synthesis
publishes a revision for them, which makes them pending like any other.
Retirement condition (`legacy_retirement`): zero legacy-only rows and no
legacy event for one full `LEGACY_RETIREMENT_WINDOW_MS` (the journal's
retention window); then `import_legacy` and the `legacy` state can be deleted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiosqlite

from backend.chroma.ownership import session_id_of
from backend.core import clock, faults
from backend.core.errors import (
    ChromaUnreachable,
    DatabaseCorrupt,
    DatabaseFull,
    DatabaseLocked,
    LeaseLost,
)
from backend.core.settings import Settings, settings
from backend.dream import graph
from backend.dream.extractor import Extractor, KeywordExtractor
from backend.dream.overlay import OVERLAY_BATCH, OVERLAY_SQL, OverlayOutcome, settle_overlays, write_overlays
from backend.memory import index as memory_index
from backend.memory import turn_vectors
from backend.runtime.context import Context
from backend.runtime.daemon import Daemon
from backend.store.db import Database, execute, fetchall, fetchone
from backend.store.events import EventKind, append_event
from backend.store.revision import raw_revision
from backend.store.workers import WorkerRole

DREAM_LEASE_MS = Settings.dream_lease_ms.default
MAX_DIGEST_ATTEMPTS = 3
RETRY_BASE_MS = 2_000
RETRY_MAX_MS = 300_000
STALE_RECHECK_MS = 10_000
CHROMA_RETRY_MAX_MS = 30_000
BATCH = Settings.dream_batch.default
# "not before never": parks a revision that failed MAX_DIGEST_ATTEMPTS times
NEVER = 2**62
# the journal's retention window; legacy retires after one full window with zero legacy rows
LEGACY_RETIREMENT_WINDOW_MS = 30 * 24 * 3600 * 1000
# the literal kinds match event_legacy_idx's WHERE, so this reads that small index
LAST_LEGACY_EVENT_SQL = (
    f"SELECT max(time) FROM event WHERE kind IN ('{EventKind.DREAM_LEGACY_IMPORTED}', "
    f"'{EventKind.DREAM_LEGACY_SUPERSEDED}')"
)
INFRASTRUCTURE_ERRORS = (DatabaseLocked, DatabaseFull, DatabaseCorrupt, ChromaUnreachable)

# Ready-time order over the partial index: each lane is an index range scan
# in key order, so the merge sorts at most 2 * limit rows whatever the backlog.
SELECT_PENDING_SQL = """
SELECT session_id, input_revision, ready_at FROM (
    SELECT session_id, input_revision, time_published AS ready_at
    FROM dream_state INDEXED BY dream_state_pending_idx
    WHERE input_revision IS NOT NULL AND completed_revision IS NOT input_revision
      AND next_attempt_at = 0
    ORDER BY time_published, session_id LIMIT :limit)
UNION ALL
SELECT session_id, input_revision, ready_at FROM (
    SELECT session_id, input_revision, next_attempt_at AS ready_at
    FROM dream_state INDEXED BY dream_state_pending_idx
    WHERE input_revision IS NOT NULL AND completed_revision IS NOT input_revision
      AND next_attempt_at > 0 AND next_attempt_at <= :now
    ORDER BY next_attempt_at, time_published, session_id LIMIT :limit)
ORDER BY ready_at, session_id LIMIT :limit
"""

CLAIM_SQL = """
UPDATE dream_state SET digest_state = 'in_progress', owner_id = :owner, epoch = epoch + 1,
    lease_expires_at = :expires, time_updated = :now
WHERE session_id = :sid AND input_revision IS NOT NULL AND completed_revision IS NOT input_revision
  AND next_attempt_at <= :now AND (lease_expires_at IS NULL OR lease_expires_at <= :now)
RETURNING input_revision, epoch
"""
FENCE_SQL = """
UPDATE dream_state SET lease_expires_at = :expires
WHERE session_id = :sid AND owner_id = :owner AND epoch = :epoch
"""
ATTEST_SQL = """
UPDATE dream_state SET completed_revision = :rev,
    digest_state = CASE WHEN input_revision IS :rev THEN 'digested' ELSE 'pending' END,
    defer_reason = NULL, legacy_digested = 0, owner_id = NULL, lease_expires_at = NULL,
    next_attempt_at = 0, state_revision = state_revision + 1, overlay_pending = 1,
    overlay_retry_at = 0, time_completed = :now, time_updated = :now
WHERE session_id = :sid AND owner_id = :owner AND epoch = :epoch
"""
RELEASE_SQL = """
UPDATE dream_state SET digest_state = 'pending', owner_id = NULL, lease_expires_at = NULL,
    next_attempt_at = COALESCE(:next, next_attempt_at), defer_reason = :reason, time_updated = :now
WHERE session_id = :sid AND owner_id = :owner AND epoch = :epoch
"""
FAIL_SQL = """
UPDATE dream_state SET digest_state = :state, digest_attempts = :attempts, attempts_revision = :rev,
    defer_reason = :reason, owner_id = NULL, lease_expires_at = NULL, next_attempt_at = :next,
    state_revision = state_revision + 1, overlay_pending = 1, overlay_retry_at = 0,
    time_updated = :now
WHERE session_id = :sid AND owner_id = :owner AND epoch = :epoch
"""


class DigestState(StrEnum):
    """`dream_state.digest_state`."""

    PENDING = "pending"  # a published revision waits for Dream
    IN_PROGRESS = "in_progress"  # a Dream daemon holds the claim lease
    DIGESTED = "digested"  # the published revision is in the graph
    DEFERRED = "deferred"  # the last digestion failed; retried after a backoff
    UNDIGESTIBLE = "undigestible"  # failed MAX_DIGEST_ATTEMPTS times: parked until a new revision
    LEGACY = "legacy"  # honoured as digested by the legacy `graphDigested` flag alone


class DigestOutcome(StrEnum):
    """What one digestion of a claimed session came to."""

    COMPLETED = "completed"  # the captured revision is attested, and still the published one
    COMPLETED_SUPERSEDED = "completed_superseded"  # attested, but synthesis published another meanwhile
    STALE = "stale"  # the raw turns no longer match the published revision: nothing written
    LOST = "lost"  # the claim lease was lost: nothing published
    SUPERSEDED = "superseded"  # failed, but a newer revision was published meanwhile
    DEFERRED = "deferred"  # failed: retried after a backoff
    UNDIGESTIBLE = "undigestible"  # failed too often: parked


class DriftClass(StrEnum):
    """Why a session's Dream state disagrees with what synthesis published (the Drift panel)."""

    SUMMARY_STALE = "summary_stale"  # raw turns changed since the last summary
    DREAM_PENDING = "dream_pending"  # never digested at the published revision
    STALE_COMPLETION = "stale_completion"  # digested an older revision
    DEFERRED = "deferred"
    UNDIGESTIBLE = "undigestible"
    LEGACY_ONLY = "legacy_only"  # only the legacy `graphDigested` flag says it is digested
    CURRENT = "current"  # no drift (never listed)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    session_id: str
    revision: str
    ready_at: int


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A held Dream lease on one session, for exactly one captured revision."""

    session_id: str
    revision: str
    epoch: int
    owner_id: str


@dataclass(kw_only=True)
class Prepared:
    claim: Claim
    turns: list[dict[str, Any]]
    title: str


def retry_delay_ms(attempts: int, base_ms: int = RETRY_BASE_MS) -> int:
    """Backoff after the `attempts`-th failure of a revision."""
    return int(min(base_ms * 2 ** max(0, attempts - 1), RETRY_MAX_MS))


async def select_pending(db: Database, now: int, limit: int = BATCH) -> list[Candidate]:
    """The first `limit` sessions ready for Dream, oldest ready time first."""
    rows = await db.fetchall(SELECT_PENDING_SQL, {"now": now, "limit": limit})
    return [
        Candidate(session_id=r["session_id"], revision=r["input_revision"], ready_at=int(r["ready_at"]))
        for r in rows
    ]


async def claim_session(
    db: Database, session_id: str, owner_id: str, now: int, lease_ms: int = DREAM_LEASE_MS
) -> Claim | None:
    """Claim a pending session and capture its published revision (None: not claimable now)."""
    async with db.tx() as conn:
        before = await fetchone(conn, "SELECT owner_id FROM dream_state WHERE session_id = ?", (session_id,))
        rows = await fetchall(
            conn, CLAIM_SQL, {"owner": owner_id, "expires": now + lease_ms, "now": now, "sid": session_id}
        )
        if not rows:
            return None
        claim = Claim(
            session_id=session_id,
            revision=rows[0]["input_revision"],
            epoch=int(rows[0]["epoch"]),
            owner_id=owner_id,
        )
        if before is not None and before["owner_id"] not in (None, owner_id):
            # the previous holder died or stalled past its lease: journal the takeover
            await append_event(
                conn,
                kind=EventKind.DREAM_TAKEN_OVER,
                actor=owner_id,
                session_id=session_id,
                data={"from": before["owner_id"], "epoch": claim.epoch, "revision": claim.revision},
                now=now,
            )
    return claim


async def fence(conn: aiosqlite.Connection, claim: Claim, now: int, lease_ms: int) -> None:
    """Prove the claim is still ours (and extend it) inside the caller's transaction."""
    changed = await execute(
        conn,
        FENCE_SQL,
        {"expires": now + lease_ms, "sid": claim.session_id, "owner": claim.owner_id, "epoch": claim.epoch},
    )
    if changed == 0:
        raise LeaseLost(f"Dream lease on {claim.session_id} (epoch {claim.epoch}) was lost")


async def release_claim(
    db: Database, claim: Claim, *, next_attempt_at: int | None = None, reason: str | None = None
) -> bool:
    """Hand a claim back without attesting anything (keeping its place); False when already lost."""
    now = clock.now_ms()
    async with db.tx() as conn:
        changed = await execute(
            conn,
            RELEASE_SQL,
            {
                "next": next_attempt_at,
                "reason": reason,
                "now": now,
                "sid": claim.session_id,
                "owner": claim.owner_id,
                "epoch": claim.epoch,
            },
        )
    return changed > 0


class Dreamer(Daemon):
    """The `dream` daemon: select, claim, re-check, build the graph, attest, overlay."""

    role = WorkerRole.DREAM

    def __init__(
        self,
        ctx: Context,
        *,
        once: bool = False,
        owner_id: str | None = None,
        extractor: Extractor | None = None,
        lease_ms: int | None = None,
        batch: int | None = None,
        chunk_rows: int | None = None,
        retry_base_ms: int = RETRY_BASE_MS,
        legacy_scan: bool | None = None,
    ) -> None:
        super().__init__(ctx, once=once, owner_id=owner_id)
        self.extractor: Extractor = extractor or KeywordExtractor()
        self.lease_ms = lease_ms or settings.dream_lease_ms
        self.batch = batch or settings.dream_batch
        self.chunk_rows = chunk_rows or settings.dream_chunk_rows
        self.retry_base_ms = retry_base_ms
        self.legacy_scan = settings.dream_legacy_scan if legacy_scan is None else legacy_scan
        self._current: Claim | None = None
        self._chroma_retry_at = 0
        self._chroma_backoff_ms = 500
        self._vector_retry_at = 0
        self._vector_backoff_ms = 500
        self._sweep = turn_vectors.VectorSweep(settings.turn_vector_sweep_ms)

    def info(self) -> dict[str, Any]:
        return {"lease_ms": self.lease_ms, "batch": self.batch, "chunk_rows": self.chunk_rows}

    async def open(self) -> Database:
        """state.db for callers that drive passes and steps directly (tests, benchmarks)."""
        if not hasattr(self, "db"):
            self.db = await self.ctx.db()
        return self.db

    async def run(self) -> int:
        if self.legacy_scan:
            await self.open()
            try:
                await import_legacy(self.ctx, actor=self.owner_id)
            except ChromaUnreachable as exc:
                self.log.warning("legacy scan skipped: %s", exc)
        return await super().run()

    # -- one pass ------------------------------------------------------------
    async def run_pass(self) -> int:
        """Digest up to `batch` ready sessions, then flush pending Chroma overlays and turn vectors."""
        await self.open()
        handled = 0
        for candidate in await select_pending(self.db, clock.now_ms(), self.batch):
            if self.draining.is_set():
                break
            if await self.digest_candidate(candidate) is not None:
                handled += 1
        handled += await self.flush_overlays()
        # turn vectors count only in a pass that did nothing else (a pass reports its
        # digestions and overlays as before); a pass that flushed some is not idle
        flushed = await self.flush_vectors()
        repaired = await self.sweep_vectors()
        return handled or flushed or repaired

    async def digest_candidate(self, candidate: Candidate) -> DigestOutcome | None:
        """Claim and digest one selected session; None when it is not claimable any more."""
        claim = await claim_session(
            self.db, candidate.session_id, self.owner_id, clock.now_ms(), self.lease_ms
        )
        if claim is None:
            return None  # another worker holds it, or it was completed meanwhile
        return await self.digest(claim)

    async def digest(self, claim: Claim) -> DigestOutcome:
        """Digest one claimed session; returns the outcome (completed, stale, deferred, ...)."""
        self._current = claim
        try:
            prepared = await self.prepare(claim)
            if prepared is None:
                return DigestOutcome.STALE
            return await self.complete(prepared)
        finally:
            self._current = None

    async def prepare(self, claim: Claim) -> Prepared | None:
        """Read the raw turns and re-check the revision; None (and released) on mismatch."""
        await self.open()
        async with self.db.snapshot() as conn:
            revision, turns = await raw_revision(conn, claim.session_id)
            row = await fetchone(conn, "SELECT title FROM session WHERE id = ?", (claim.session_id,))
        if revision == claim.revision:
            return Prepared(claim=claim, turns=turns, title=row["title"] if row else "")
        await self._release_stale(claim, revision)
        return None

    async def _release_stale(self, claim: Claim, raw: str) -> None:
        """Write nothing for a revision the raw turns no longer match; stay pending."""
        now = clock.now_ms()
        reason = f"stale: raw turns are at {raw}, published {claim.revision}; waiting for synthesis"
        async with self.db.tx() as conn:
            row = await fetchone(
                conn,
                "SELECT input_revision, defer_reason FROM dream_state "
                "WHERE session_id = ? AND owner_id = ? AND epoch = ?",
                (claim.session_id, claim.owner_id, claim.epoch),
            )
            if row is None:
                return
            # published already moved on: ready at once; else recheck after synthesis had its turn
            moved = row["input_revision"] != claim.revision
            await execute(
                conn,
                RELEASE_SQL,
                {
                    "next": 0 if moved else now + STALE_RECHECK_MS,
                    "reason": None if moved else reason,
                    "now": now,
                    "sid": claim.session_id,
                    "owner": claim.owner_id,
                    "epoch": claim.epoch,
                },
            )
            if row["defer_reason"] != reason:
                await append_event(
                    conn,
                    kind=EventKind.DREAM_STALE,
                    actor=claim.owner_id,
                    session_id=claim.session_id,
                    data={"published": claim.revision, "raw": raw},
                    now=now,
                )
        self.log.info("dream %s stale: published %s, raw %s", claim.session_id, claim.revision, raw)

    async def complete(self, prepared: Prepared) -> DigestOutcome:
        """Build the graph from the prepared raw turns and attest the captured revision."""
        claim = prepared.claim
        try:
            await self._index_turns(prepared)
            extraction = await asyncio.to_thread(self.extractor.extract, prepared.turns)
            chunks = graph.plan_chunks(
                claim.session_id, prepared.title, prepared.turns, extraction, self.chunk_rows
            )
            await self._write_graph(claim, chunks)
            faults.point("dream.before_attest")
            return await self._attest(claim, graph.plan_keys(chunks))
        except LeaseLost as exc:
            self.log.warning("dream %s: %s; published nothing", claim.session_id, exc)
            return DigestOutcome.LOST
        except INFRASTRUCTURE_ERRORS:
            await self._release_quietly(claim)
            raise
        except Exception as exc:  # the extractor or the graph refused this input: count it
            return await self._record_failure(claim, exc)

    async def _index_turns(self, prepared: Prepared) -> None:
        """Bring the recall index to the captured revision, before the graph (so an
        undigestible revision is still recallable); its vectors follow in `flush_vectors`."""
        claim = prepared.claim

        async def fenced(conn: aiosqlite.Connection) -> None:
            await fence(conn, claim, clock.now_ms(), self.lease_ms)

        counts = await memory_index.index_session(
            self.db,
            self.ctx.turn_store,
            claim.session_id,
            claim.revision,
            prepared.turns,
            fenced,
            self.chunk_rows,
        )
        if counts["written"] or counts["removed"]:
            self.log.info("dream %s indexed %s: %s", claim.session_id, claim.revision, counts)

    async def _write_graph(self, claim: Claim, chunks: Sequence[graph.Chunk]) -> None:
        for index, chunk in enumerate(chunks):
            now = clock.now_ms()
            async with self.db.tx() as conn:
                await fence(conn, claim, now, self.lease_ms)
                await graph.write_chunk(conn, claim.session_id, claim.revision, chunk, now)
            if index == 0:
                faults.point("dream.mid_graph")

    async def _attest(self, claim: Claim, plan: graph.Plan) -> DigestOutcome:
        """Sweep the previous revision's rows and record completion, by CAS on the claim epoch."""
        now = clock.now_ms()
        async with self.db.tx() as conn:
            row = await fetchone(
                conn,
                "SELECT input_revision, legacy_digested FROM dream_state "
                "WHERE session_id = ? AND owner_id = ? AND epoch = ?",
                (claim.session_id, claim.owner_id, claim.epoch),
            )
            if row is None:
                raise LeaseLost(f"Dream lease on {claim.session_id} (epoch {claim.epoch}) was lost")
            swept = await graph.sweep_session(conn, claim.session_id, plan)
            await execute(
                conn,
                ATTEST_SQL,
                {
                    "rev": claim.revision,
                    "now": now,
                    "sid": claim.session_id,
                    "owner": claim.owner_id,
                    "epoch": claim.epoch,
                },
            )
            counts = await graph.session_graph_counts(conn, claim.session_id)
            current = row["input_revision"] == claim.revision
            await append_event(
                conn,
                kind=EventKind.DREAM_COMPLETED,
                actor=claim.owner_id,
                session_id=claim.session_id,
                data={
                    "revision": claim.revision,
                    "current": current,
                    "published": row["input_revision"],
                    "epoch": claim.epoch,
                    **counts,
                    **swept,
                },
                now=now,
            )
            if row["legacy_digested"]:
                await append_event(
                    conn,
                    kind=EventKind.DREAM_LEGACY_SUPERSEDED,
                    actor=claim.owner_id,
                    session_id=claim.session_id,
                    data={"revision": claim.revision},
                    now=now,
                )
        self.log.info(
            "dream %s completed %s (%s)",
            claim.session_id,
            claim.revision,
            "current" if current else f"published moved on to {row['input_revision']}",
        )
        return DigestOutcome.COMPLETED if current else DigestOutcome.COMPLETED_SUPERSEDED

    async def _record_failure(self, claim: Claim, exc: BaseException) -> DigestOutcome:
        """Count a failed digestion of the captured revision; the third makes it undigestible."""
        now = clock.now_ms()
        reason = f"{type(exc).__name__}: {exc}"[:500]
        async with self.db.tx() as conn:
            row = await fetchone(
                conn,
                "SELECT input_revision, attempts_revision, digest_attempts "
                "FROM dream_state WHERE session_id = ? AND owner_id = ? AND epoch = ?",
                (claim.session_id, claim.owner_id, claim.epoch),
            )
            if row is None:
                return DigestOutcome.LOST
            if row["input_revision"] != claim.revision:
                # a failure of A must not block B, published meanwhile
                await execute(
                    conn,
                    RELEASE_SQL,
                    {
                        "next": 0,
                        "reason": None,
                        "now": now,
                        "sid": claim.session_id,
                        "owner": claim.owner_id,
                        "epoch": claim.epoch,
                    },
                )
                return DigestOutcome.SUPERSEDED
            same = row["attempts_revision"] == claim.revision
            attempts = (int(row["digest_attempts"]) if same else 0) + 1
            undigestible = attempts >= MAX_DIGEST_ATTEMPTS
            await execute(
                conn,
                FAIL_SQL,
                {
                    "state": DigestState.UNDIGESTIBLE if undigestible else DigestState.DEFERRED,
                    "attempts": attempts,
                    "rev": claim.revision,
                    "reason": reason,
                    "now": now,
                    "sid": claim.session_id,
                    "next": NEVER if undigestible else now + retry_delay_ms(attempts, self.retry_base_ms),
                    "owner": claim.owner_id,
                    "epoch": claim.epoch,
                },
            )
            kind = EventKind.DREAM_UNDIGESTIBLE if undigestible else EventKind.DREAM_DEFERRED
            await append_event(
                conn,
                kind=kind,
                actor=claim.owner_id,
                session_id=claim.session_id,
                data={"revision": claim.revision, "attempts": attempts, "reason": reason},
                now=now,
            )
        self.log.warning(
            "dream %s %s after attempt %d: %s",
            claim.session_id,
            "undigestible" if undigestible else "deferred",
            attempts,
            reason,
        )
        return DigestOutcome.UNDIGESTIBLE if undigestible else DigestOutcome.DEFERRED

    async def _release_quietly(self, claim: Claim) -> None:
        try:
            await release_claim(self.db, claim)
        except Exception:  # the database itself is failing; the lease will expire instead
            self.log.warning("could not release %s; its lease will expire", claim.session_id, exc_info=True)

    # -- lease upkeep --------------------------------------------------------
    async def on_heartbeat(self) -> None:
        claim = self._current
        if claim is None:
            return
        try:
            async with self.db.tx() as conn:
                await fence(conn, claim, clock.now_ms(), self.lease_ms)
        except LeaseLost as exc:
            self.log.warning("%s", exc)

    async def hand_back(self) -> None:
        claim = self._current
        if claim is not None and await release_claim(self.db, claim):
            self.log.info("dream %s handed back (epoch %d)", claim.session_id, claim.epoch)

    # -- the Chroma overlay --------------------------------------------------
    async def flush_overlays(self, limit: int = OVERLAY_BATCH) -> int:
        """Write pending overlays to Chroma; returns how many were confirmed by read-back."""
        now = clock.now_ms()
        if now < self._chroma_retry_at:
            return 0
        rows = [dict(r) for r in await self.db.fetchall(OVERLAY_SQL, {"now": now, "limit": limit})]
        if not rows:
            return 0
        try:
            outcome = await write_overlays(self.ctx, rows)
        except ChromaUnreachable as exc:
            self._chroma_retry_at = now + self._chroma_backoff_ms
            self._chroma_backoff_ms = min(self._chroma_backoff_ms * 2, CHROMA_RETRY_MAX_MS)
            self.log.warning("overlay of %d session(s) deferred: %s", len(rows), exc)
            return 0
        self._chroma_backoff_ms = 500
        await settle_overlays(self.db, rows, outcome, self.owner_id)
        return sum(1 for v in outcome.values() if v == OverlayOutcome.CONFIRMED)

    async def flush_vectors(self) -> int:
        """Write pending turn vectors (the recall index's dense side); backs off while Chroma is down."""
        now = clock.now_ms()
        if now < self._vector_retry_at:
            return 0
        try:
            written = await memory_index.flush_vectors(self.db, self.ctx.turn_store)
        except ChromaUnreachable as exc:
            self._vector_retry_at = now + self._vector_backoff_ms
            self._vector_backoff_ms = min(self._vector_backoff_ms * 2, CHROMA_RETRY_MAX_MS)
            self.log.warning("turn vectors deferred: %s", exc)
            return 0
        self._vector_backoff_ms = 500
        return written

    async def sweep_vectors(self) -> int:
        """One batch of the turn vector sweep (`backend.memory.turn_vectors`); rows un-marked for repair."""
        try:
            return await self._sweep.step(
                self.db, self.ctx.turn_store, self.owner_id, self.ctx.chroma_generation
            )
        except ChromaUnreachable as exc:
            self.log.warning("turn vector sweep deferred: %s", exc)
            return 0


# -- status helpers for the lead's ops.status / check --------------------------
# the classes the Drift panel lists, in its order
DRIFT_CLASSES = tuple(c for c in DriftClass if c is not DriftClass.CURRENT)
# classify_drift runs per row of the status snapshot, and an Enum member attribute costs
# ~0.5 us on Python 3.11: plain module names for the members it compares and returns
_LEGACY, _UNDIGESTIBLE, _DEFERRED = DigestState.LEGACY, DigestState.UNDIGESTIBLE, DigestState.DEFERRED
_D_LEGACY, _D_UNDIGESTIBLE, _D_DEFERRED = DriftClass.LEGACY_ONLY, DriftClass.UNDIGESTIBLE, DriftClass.DEFERRED
_D_STALE, _D_CURRENT = DriftClass.SUMMARY_STALE, DriftClass.CURRENT
_D_STALE_COMPLETION, _D_PENDING = DriftClass.STALE_COMPLETION, DriftClass.DREAM_PENDING


def classify_drift(row: Mapping[str, Any]) -> DriftClass:
    """The drift class of one dream_state row (optionally joined with summary_job's seqs).

    CURRENT when the row needs nothing. Order is most actionable first: a
    parked revision before a stale summary before plain pending work.
    """
    state = row.get("digest_state")
    published, completed = row.get("input_revision"), row.get("completed_revision")
    if state == _LEGACY or (published is None and row.get("legacy_digested")):
        return _D_LEGACY
    if state == _UNDIGESTIBLE:
        return _D_UNDIGESTIBLE
    if state == _DEFERRED:
        return _D_DEFERRED
    dirty, clean = row.get("dirty_seq"), row.get("clean_seq")
    if dirty is not None and clean is not None and dirty > clean:
        return _D_STALE
    if published is None or completed == published:
        return _D_CURRENT
    return _D_STALE_COMPLETION if completed is not None else _D_PENDING


async def legacy_only_count(db: Database) -> int:
    """Sessions honoured as digested only by the legacy `graphDigested` flag."""
    return int(await db.scalar("SELECT count(*) FROM dream_state WHERE digest_state = 'legacy'"))


async def legacy_retirement(db: Database, now: int | None = None) -> dict[str, Any]:
    """Whether the legacy path may be deleted: zero legacy rows for one full retention window."""
    now = clock.now_ms() if now is None else now
    count = await legacy_only_count(db)
    last = await db.scalar(LAST_LEGACY_EVENT_SQL)
    quiet_since = None if count else last
    retired = count == 0 and (last is None or now - int(last) >= LEGACY_RETIREMENT_WINDOW_MS)
    return {
        "legacy_only": count,
        "last_legacy_event_at": last,
        "quiet_since": quiet_since,
        "window_ms": LEGACY_RETIREMENT_WINDOW_MS,
        "retired": retired,
        "condition": "zero legacy-only rows and no legacy event for one full retention window",
    }


def is_legacy_only(metadata: Mapping[str, Any]) -> bool:
    """A Chroma row Dream digested before revisions existed: a digested flag, no revision."""
    flagged = metadata.get("graphDigested") is True or metadata.get("digestState") == DigestState.DIGESTED
    return flagged and metadata.get("dreamCompletedRevision") is None


async def import_legacy(ctx: Context, *, actor: str = "dream", page: int = 500) -> dict[str, int]:
    """Mark sessions whose Chroma row is legacy-only as `legacy` (honoured until a revision is published)."""
    db = await ctx.db()
    store = ctx.store()
    ids = [i for i in await store.all_ids() if session_id_of(i)]
    marked = scanned = 0
    for start in range(0, len(ids), page):
        rows = await store.get(ids[start : start + page])
        legacy = [session_id_of(i) for i, row in rows.items() if is_legacy_only(row.metadata)]
        scanned += len(rows)
        marked += await _mark_legacy(db, [s for s in legacy if s])
    if marked:
        async with db.tx() as conn:
            await append_event(
                conn,
                kind=EventKind.DREAM_LEGACY_IMPORTED,
                actor=actor,
                data={"scanned": scanned, "marked": marked},
            )
    return {"scanned": scanned, "marked": marked}


async def _mark_legacy(db: Database, session_ids: Sequence[str]) -> int:
    now = clock.now_ms()
    marked = 0
    async with db.tx() as conn:
        for sid in session_ids:
            if await fetchone(conn, "SELECT 1 FROM session WHERE id = ?", (sid,)) is None:
                continue  # a summary row for a session state.db does not know: nothing to honour
            await execute(
                conn,
                "INSERT INTO dream_state (session_id, time_updated) VALUES (?, ?) "
                "ON CONFLICT (session_id) DO NOTHING",
                (sid, now),
            )
            # only rows synthesis never published a revision for: a revision always wins
            marked += await execute(
                conn,
                "UPDATE dream_state SET digest_state = 'legacy', legacy_digested = 1, "
                "time_updated = ? WHERE session_id = ? AND input_revision IS NULL "
                "AND completed_revision IS NULL AND digest_state != 'legacy'",
                (now, sid),
            )
    return marked
