"""Dream: digest sessions' raw turns into the memory graph, fenced by input revision.

The contract (docs/architecture.md#dreams-revisions):

* Synthesis publishes `dream_state.input_revision` (`backend.store.handoffs`). A
  session is pending while `completed_revision IS NOT input_revision`; a
  surviving `graphDigested: true` on its Chroma row never hides it.
* Selection, the claim lease and every state change under it (attest,
  release, failure) are `backend.dream.claims`; the lease itself is
  `backend.store.fencing`'s, renewed by the daemon's upkeep while held.
* Dream reads the raw turns (`backend.store.revision`) and recomputes the revision.
  A mismatch writes nothing and leaves the row pending (`dream.stale`).
* The graph is built from the raw turns, never the summary prose
  (`backend.dream.graph`, idempotent), then completion of exactly the captured
  revision is attested by compare-and-swap on the claim epoch.
* The Chroma overlay (`backend.chroma.ownership.DREAM_OWNED_KEYS`) follows the
  state.db attestation, which stays the system of record; see
  `backend.dream.overlay` for how it is made eventually consistent when
  Chroma is down or the row is missing.
* Sessions digested before revisions existed: `backend.dream.legacy`; the
  states and the Drift panel's classes: `backend.dream.drift`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiosqlite

from backend.core import clock, faults
from backend.core.errors import (
    ChromaUnreachable,
    DatabaseCorrupt,
    DatabaseFull,
    DatabaseLocked,
    LeaseLost,
)
from backend.core.settings import settings
from backend.dream import graph
from backend.dream.claims import (
    BATCH,
    DREAM_LEASE_MS,
    MAX_DIGEST_ATTEMPTS,
    NEVER,
    RETRY_BASE_MS,
    RETRY_MAX_MS,
    SELECT_PENDING_SQL,
    STALE_RECHECK_MS,
    Candidate,
    Claim,
    DigestOutcome,
    attest,
    claim_session,
    record_failure,
    release_claim,
    release_stale,
    retry_delay_ms,
    select_pending,
)
from backend.dream.drift import DRIFT_CLASSES, DigestState, DriftClass, classify_drift
from backend.dream.extractor import Extractor, KeywordExtractor
from backend.dream.legacy import (
    LAST_LEGACY_EVENT_SQL,
    LEGACY_RETIREMENT_WINDOW_MS,
    import_legacy,
    is_legacy_only,
    legacy_only_count,
    legacy_retirement,
)
from backend.dream.overlay import OVERLAY_BATCH, OVERLAY_SQL, OverlayOutcome, settle_overlays, write_overlays
from backend.memory import index as memory_index
from backend.memory import turn_vectors
from backend.runtime.context import Context
from backend.runtime.daemon import Daemon
from backend.store import fencing
from backend.store.db import Database, fetchone
from backend.store.revision import raw_revision
from backend.store.workers import WorkerRole

# the digester's names from before its split, for the callers that import them from here
__all__ = [
    "BATCH",
    "DREAM_LEASE_MS",
    "DRIFT_CLASSES",
    "LAST_LEGACY_EVENT_SQL",
    "LEGACY_RETIREMENT_WINDOW_MS",
    "MAX_DIGEST_ATTEMPTS",
    "NEVER",
    "RETRY_BASE_MS",
    "RETRY_MAX_MS",
    "SELECT_PENDING_SQL",
    "STALE_RECHECK_MS",
    "Candidate",
    "Claim",
    "DigestOutcome",
    "DigestState",
    "Dreamer",
    "DriftClass",
    "Prepared",
    "claim_session",
    "classify_drift",
    "import_legacy",
    "is_legacy_only",
    "legacy_only_count",
    "legacy_retirement",
    "release_claim",
    "retry_delay_ms",
    "select_pending",
]

CHROMA_RETRY_MAX_MS = 30_000
INFRASTRUCTURE_ERRORS = (DatabaseLocked, DatabaseFull, DatabaseCorrupt, ChromaUnreachable)


@dataclass(kw_only=True)
class Prepared:
    claim: Claim
    turns: list[dict[str, Any]]
    title: str


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
        self.leases.hold(claim.lease)  # renewed by the daemon's upkeep while the graph is built
        try:
            prepared = await self.prepare(claim)
            if prepared is None:
                return DigestOutcome.STALE
            return await self.complete(prepared)
        finally:
            self.leases.drop(claim.lease)
            self._current = None

    async def prepare(self, claim: Claim) -> Prepared | None:
        """Read the raw turns and re-check the revision; None (and released) on mismatch."""
        await self.open()
        async with self.db.snapshot() as conn:
            revision, turns = await raw_revision(conn, claim.session_id)
            row = await fetchone(conn, "SELECT title FROM session WHERE id = ?", (claim.session_id,))
        if revision == claim.revision:
            return Prepared(claim=claim, turns=turns, title=row["title"] if row else "")
        await release_stale(self.db, claim, revision)
        return None

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
            return await attest(self.db, claim, graph.plan_keys(chunks))
        except LeaseLost as exc:
            self.log.warning("dream %s: %s; published nothing", claim.session_id, exc)
            return DigestOutcome.LOST
        except INFRASTRUCTURE_ERRORS:
            await self._release_quietly(claim)
            raise
        except Exception as exc:  # the extractor or the graph refused this input: count it
            return await record_failure(self.db, claim, exc, self.retry_base_ms)

    async def _index_turns(self, prepared: Prepared) -> None:
        """Bring the recall index to the captured revision, before the graph (so an
        undigestible revision is still recallable); its vectors follow in `flush_vectors`."""
        claim = prepared.claim

        async def fenced(conn: aiosqlite.Connection) -> None:
            await fencing.guard(conn, claim.lease, now=clock.now_ms())

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
                await fencing.guard(conn, claim.lease, now=now)
                await graph.write_chunk(conn, claim.session_id, claim.revision, chunk, now)
            if index == 0:
                faults.point("dream.mid_graph")

    async def _release_quietly(self, claim: Claim) -> None:
        try:
            await release_claim(self.db, claim)
        except Exception:  # the database itself is failing; the lease will expire instead
            self.log.warning("could not release %s; its lease will expire", claim.session_id, exc_info=True)

    # -- lease upkeep --------------------------------------------------------
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
