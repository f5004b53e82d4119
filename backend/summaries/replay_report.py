"""What a receipt recovery pass reports: each receipt's outcome, the pass's counters, the rows."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, TypedDict

from backend.summaries.receipts import ReceiptVerdict, Verdict
from backend.summaries.replay_jobs import Job


class ReplayOutcome(StrEnum):
    """What a recovery pass did with one receipt (a row of its report)."""

    PRESENT = "present"  # the row matched: nothing written to Chroma
    REPLAYED = "replayed"  # re-written from the receipt and verified by read-back
    UNVERIFIED = "unverified"  # re-written, but the read-back still differs
    SKIPPED_ACTIVE = "skipped_active"  # leased by a running synthesis or replay
    SUPERSEDED = "superseded"  # re-staged (or its replay lease lost) since it was read
    QUARANTINED = "quarantined"  # a corrupt envelope, kept and shown
    WOULD_REPLAY = "would_replay"  # dry run: it differs
    WOULD_QUARANTINE = "would_quarantine"  # dry run: its envelope is corrupt


@dataclass
class Counters:
    """What one recovery pass did."""

    scanned: int = 0
    present: int = 0
    mismatched: int = 0
    replayed: int = 0
    completed: int = 0
    acknowledged: int = 0
    skipped_active: int = 0
    superseded: int = 0
    quarantined: int = 0
    unverified: int = 0

    def add(self, other: Counters) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


class ReplayRow(TypedDict):
    """One receipt in a replay report (`rem replay --json` rows)."""

    summary_id: str
    session_id: str
    outcome: ReplayOutcome
    verdict: ReceiptVerdict | None  # what the pass found (None: not checked, e.g. skipped)
    keys: list[dict[str, Any]]  # KeyDifference.as_dict() of each differing owned key
    document: dict[str, Any] | None  # how the document differs, if it does
    reason: str | None


class ReplayReport(TypedDict):
    """What `ops.replay` returns and `rem replay --json` prints."""

    counters: dict[str, int]  # Counters, by field name
    rows: list[ReplayRow]
    dry_run: bool
    ok: bool
    rows_written: int


@dataclass
class Report:
    counters: Counters = field(default_factory=Counters)
    rows: list[ReplayRow] = field(default_factory=list)
    dry_run: bool = False
    # summary_job rows this pass changed (0 on a healthy store: the pass is idempotent)
    rows_written: int = 0

    @property
    def ok(self) -> bool:
        return self.counters.unverified == 0 and self.counters.quarantined == 0

    def as_dict(self) -> ReplayReport:
        return ReplayReport(
            counters=asdict(self.counters),
            rows=self.rows,
            dry_run=self.dry_run,
            ok=self.ok,
            rows_written=self.rows_written,
        )


def row_report(
    job: Job, outcome: ReplayOutcome, verdict: Verdict | None = None, reason: str | None = None
) -> ReplayRow:
    detail = verdict.detail() if verdict is not None else None
    return ReplayRow(
        summary_id=job.summary_id,
        session_id=job.session_id,
        outcome=outcome,
        verdict=verdict.verdict if verdict is not None else None,
        keys=(detail or {}).get("keys", []),
        document=(detail or {}).get("document"),
        reason=reason,
    )
