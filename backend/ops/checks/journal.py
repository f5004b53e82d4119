"""The journal family (invariant 8): operator events are hash-chained, and the chain still extends
the head `rem up` recorded for this store."""

from __future__ import annotations

from typing import Any

from backend.ops.checks.family import Family, Moment
from backend.ops.checks.report import Report
from backend.store.db import Conn
from backend.store.events import journal_key, verify_operator_chain_sync
from backend.store.journal_head import Head, extends


def check_audit_sync(conn: Conn, report: Report, recorded: Head | None = None) -> None:
    """Walk the operator events' hash chain; name the first broken link, and a journal that does
    not extend the head `rem up` recorded (`backend.store.journal_head`)."""
    report.mark("audit")
    result = verify_operator_chain_sync(conn, journal_key(), at=recorded.count if recorded else None)
    broken = result["broken"]
    if broken is not None:
        report.add(
            report.violations,
            "8",
            f"operator event chain broken at event {broken['event_id']} ({broken['kind']}): "
            f"it {broken['why']}",
            [broken],
        )
        return
    if recorded is not None:
        _check_extends_recorded(report, result, recorded)


def _check_extends_recorded(report: Report, result: dict[str, Any], recorded: Head) -> None:
    """A journal shorter than, or not extending, the head `rem up` recorded is a violation."""
    problem = extends(result, recorded)
    if problem is not None:
        report.add(
            report.violations,
            "8",
            f"operator journal {problem}",
            [{"recorded_count": recorded.count, "recorded_head": recorded.head, "count": result["count"]}],
        )


def check_journal_sync(conn: Conn, report: Report, moment: Moment) -> None:
    """The operator events' chain walked in order (they are few: operator actions only)."""
    check_audit_sync(conn, report, moment.recorded)


# its findings name the broken link in their text: listed after every declared finding
FAMILY = Family(name="journal", state=(check_journal_sync,))
