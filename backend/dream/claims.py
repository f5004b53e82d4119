"""Dream's claims: which sessions are ready, the claim lease on one, and every state change under it.

* Selection reads the partial index `dream_state_pending_idx` in *ready-time*
  order: a never-tried row is ready at `time_published`, a retried row at
  `next_attempt_at` (failure backoff or stale recheck). Every pass starts
  again from the head of that order, so no window of rows is skipped and a
  fresh session never overtakes one that was ready earlier.
  `next_attempt_at = NEVER` parks an undigestible revision until synthesis
  publishes another one (which resets it).
* A claim is a `dream_state` lease (`backend.store.fencing`): `owner_id`,
  `epoch`, `lease_expires_at`, for exactly one captured revision. Every later
  write names the epoch and 0 rows changed is `LeaseLost`: stop, publish
  nothing. A held row keeps its place in the order (other workers' claims
  fail on the live lease), so a lease that expires, or that an operator
  releases (`rem release`), is taken over at once from where the row stood.
* Completion of exactly the captured revision is attested by compare-and-swap
  on the claim epoch (`attest`). Completing A after synthesis published B
  records `completed_revision = A` and leaves the row pending for B.
* Failures count `digest_attempts` per revision with backoff; the third makes
  that revision `undigestible` (journaled, shown to operators). A crash is not
  a failure: the lease expires and another worker takes over.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiosqlite

from backend.core import clock
from backend.core.errors import LeaseLost
from backend.core.settings import Settings
from backend.dream import graph
from backend.dream.drift import DigestState
from backend.store import fencing
from backend.store.db import Database, fetchone
from backend.store.events import EventKind, append_event
from backend.store.fencing import Lease

log = logging.getLogger("rem.dream")

DREAM_LEASE_MS = Settings.dream_lease_ms.default
MAX_DIGEST_ATTEMPTS = 3
RETRY_BASE_MS = 2_000
RETRY_MAX_MS = 300_000
STALE_RECHECK_MS = 10_000
BATCH = Settings.dream_batch.default
# "not before never": parks a revision that failed MAX_DIGEST_ATTEMPTS times
NEVER = 2**62

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

# a row is claimable while its published revision is not completed, it is not backing
# off, and no live lease holds it
CLAIMABLE = (
    "input_revision IS NOT NULL AND completed_revision IS NOT input_revision "
    "AND next_attempt_at <= :now AND (lease_expires_at IS NULL OR lease_expires_at <= :now)"
)
ATTEST_SETS = (
    "completed_revision = :rev, digest_state = CASE WHEN input_revision IS :rev THEN 'digested' ELSE 'pending' END, "
    "defer_reason = NULL, legacy_digested = 0, owner_id = NULL, lease_expires_at = NULL, next_attempt_at = 0, "
    "state_revision = state_revision + 1, overlay_pending = 1, overlay_retry_at = 0, time_completed = :now, "
    "time_updated = :now"
)
RELEASE_SETS = (
    "digest_state = 'pending', owner_id = NULL, lease_expires_at = NULL, "
    "next_attempt_at = COALESCE(:next, next_attempt_at), defer_reason = :reason, time_updated = :now"
)
FAIL_SETS = (
    "digest_state = :state, digest_attempts = :attempts, attempts_revision = :rev, defer_reason = :reason, "
    "owner_id = NULL, lease_expires_at = NULL, next_attempt_at = :next, state_revision = state_revision + 1, "
    "overlay_pending = 1, overlay_retry_at = 0, time_updated = :now"
)


class DigestOutcome(StrEnum):
    """What one digestion of a claimed session came to."""

    COMPLETED = "completed"  # the captured revision is attested, and still the published one
    COMPLETED_SUPERSEDED = "completed_superseded"  # attested, but synthesis published another meanwhile
    STALE = "stale"  # the raw turns no longer match the published revision: nothing written
    LOST = "lost"  # the claim lease was lost: nothing published
    SUPERSEDED = "superseded"  # failed, but a newer revision was published meanwhile
    DEFERRED = "deferred"  # failed: retried after a backoff
    UNDIGESTIBLE = "undigestible"  # failed too often: parked


@dataclass(frozen=True, kw_only=True)
class Candidate:
    session_id: str
    revision: str
    ready_at: int


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A held Dream lease on one session, for exactly one captured revision."""

    lease: Lease
    revision: str

    @property
    def session_id(self) -> str:
        return self.lease.key

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    @property
    def owner_id(self) -> str:
        return self.lease.owner_id


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
        claimed = await fencing.claim_row(
            conn,
            fencing.DREAM,
            session_id,
            owner_id,
            now=now,
            length_ms=lease_ms,
            when=CLAIMABLE,
            sets="digest_state = 'in_progress', time_updated = :now",
            params={"now": now},
            returning="input_revision",
        )
        if claimed is None:
            return None
        lease, row = claimed
        claim = Claim(lease=lease, revision=row["input_revision"])
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


async def release_claim(
    db: Database, claim: Claim, *, next_attempt_at: int | None = None, reason: str | None = None
) -> bool:
    """Hand a claim back without attesting anything (keeping its place); False when already lost."""
    params = {"next": next_attempt_at, "reason": reason, "now": clock.now_ms()}
    async with db.tx() as conn:
        return await fencing.write_if_held(conn, claim.lease, RELEASE_SETS, params)


async def _journal_stale(conn: aiosqlite.Connection, claim: Claim, raw: str, now: int) -> None:
    await append_event(
        conn,
        kind=EventKind.DREAM_STALE,
        actor=claim.owner_id,
        session_id=claim.session_id,
        data={"published": claim.revision, "raw": raw},
        now=now,
    )


async def release_stale(db: Database, claim: Claim, raw: str) -> None:
    """Write nothing for a revision the raw turns no longer match; stay pending."""
    now = clock.now_ms()
    reason = f"stale: raw turns are at {raw}, published {claim.revision}; waiting for synthesis"
    async with db.tx() as conn:
        row = await fencing.read_held(conn, claim.lease, "input_revision, defer_reason")
        if row is None:
            return
        # published already moved on: ready at once; else recheck after synthesis had its turn
        moved = row["input_revision"] != claim.revision
        params = {
            "next": 0 if moved else now + STALE_RECHECK_MS,
            "reason": None if moved else reason,
            "now": now,
        }
        await fencing.write(conn, claim.lease, RELEASE_SETS, params)
        if row["defer_reason"] != reason:  # journaled once a stale revision, not at each recheck
            await _journal_stale(conn, claim, raw, now)
    log.info("dream %s stale: published %s, raw %s", claim.session_id, claim.revision, raw)


async def attest(db: Database, claim: Claim, plan: graph.Plan) -> DigestOutcome:
    """Sweep the previous revision's rows and record completion, by CAS on the claim epoch."""
    now = clock.now_ms()
    async with db.tx() as conn:
        row = await fencing.read_held(conn, claim.lease, "input_revision, legacy_digested")
        if row is None:
            raise LeaseLost(claim.lease.lost_message())
        swept = await graph.sweep_session(conn, claim.session_id, plan)
        await fencing.write(conn, claim.lease, ATTEST_SETS, {"rev": claim.revision, "now": now})
        counts = await graph.session_graph_counts(conn, claim.session_id)
        current = row["input_revision"] == claim.revision
        data = {"revision": claim.revision, "current": current, "published": row["input_revision"]}
        await append_event(
            conn,
            kind=EventKind.DREAM_COMPLETED,
            actor=claim.owner_id,
            session_id=claim.session_id,
            data={**data, "epoch": claim.epoch, **counts, **swept},
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
    moved = "current" if current else f"published moved on to {row['input_revision']}"
    log.info("dream %s completed %s (%s)", claim.session_id, claim.revision, moved)
    return DigestOutcome.COMPLETED if current else DigestOutcome.COMPLETED_SUPERSEDED


async def record_failure(db: Database, claim: Claim, exc: BaseException, retry_base_ms: int) -> DigestOutcome:
    """Count a failed digestion of the captured revision; the third makes it undigestible."""
    now = clock.now_ms()
    reason = f"{type(exc).__name__}: {exc}"[:500]
    async with db.tx() as conn:
        row = await fencing.read_held(conn, claim.lease, "input_revision, attempts_revision, digest_attempts")
        if row is None:
            return DigestOutcome.LOST
        if row["input_revision"] != claim.revision:
            # a failure of A must not block B, published meanwhile
            await fencing.write(conn, claim.lease, RELEASE_SETS, {"next": 0, "reason": None, "now": now})
            return DigestOutcome.SUPERSEDED
        same = row["attempts_revision"] == claim.revision
        attempts = (int(row["digest_attempts"]) if same else 0) + 1
        undigestible = attempts >= MAX_DIGEST_ATTEMPTS
        await fencing.write(
            conn, claim.lease, FAIL_SETS, _failure_params(claim, attempts, reason, now, retry_base_ms)
        )
        await append_event(
            conn,
            kind=EventKind.DREAM_UNDIGESTIBLE if undigestible else EventKind.DREAM_DEFERRED,
            actor=claim.owner_id,
            session_id=claim.session_id,
            data={"revision": claim.revision, "attempts": attempts, "reason": reason},
            now=now,
        )
    verdict = "undigestible" if undigestible else "deferred"
    log.warning("dream %s %s after attempt %d: %s", claim.session_id, verdict, attempts, reason)
    return DigestOutcome.UNDIGESTIBLE if undigestible else DigestOutcome.DEFERRED


def _failure_params(claim: Claim, attempts: int, reason: str, now: int, retry_base_ms: int) -> dict[str, Any]:
    undigestible = attempts >= MAX_DIGEST_ATTEMPTS
    return {
        "state": DigestState.UNDIGESTIBLE if undigestible else DigestState.DEFERRED,
        "attempts": attempts,
        "rev": claim.revision,
        "reason": reason,
        "now": now,
        "next": NEVER if undigestible else now + retry_delay_ms(attempts, retry_base_ms),
    }
