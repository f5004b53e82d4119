"""What `rem check` found: findings (rows capped, counts whole), merged across batches and processes."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from backend.store.db import Conn

ROW_CAP = 20  # rows listed per finding; counts are always complete
# progress(phase, done, total), called as the checks go
Progress = Callable[[str, int, int], None]


@dataclass(kw_only=True)
class Finding:
    invariant: str
    what: str
    rows: list[Mapping[str, Any]] = field(default_factory=list)
    count: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "what": self.what,
            "count": self.count,
            "rows": [_plain_row(row) for row in self.rows[:ROW_CAP]],
        }


def _plain_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A finding's row with enum members as their values (`would_replay`, not `<ReplayOutcome...>`)."""
    return {key: value.value if isinstance(value, Enum) else value for key, value in row.items()}


@dataclass
class Report:
    violations: list[Finding] = field(default_factory=list)
    unsettled: list[Finding] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    # parts that could not be checked at all (Chroma unreachable): what, invariants, error
    not_checked: list[dict[str, Any]] = field(default_factory=list)

    def mark(self, name: str) -> None:
        """List `name` as checked (once, in the order the checks first ran)."""
        if name not in self.checked:
            self.checked.append(name)

    def add(
        self, bucket: list[Finding], invariant: str, what: str, rows: Sequence[Mapping[str, Any]]
    ) -> None:
        """Add rows to a finding, merging with the same finding from an earlier batch."""
        self._add(bucket, invariant, what, rows, len(rows))

    @staticmethod
    def _add(
        bucket: list[Finding], invariant: str, what: str, rows: Sequence[Mapping[str, Any]], count: int
    ) -> None:
        if not count:
            return
        for finding in bucket:
            if (finding.invariant, finding.what) == (invariant, what):
                finding.rows.extend(rows[: max(0, ROW_CAP - len(finding.rows))])
                finding.count += count
                return
        bucket.append(Finding(invariant=invariant, what=what, rows=list(rows[:ROW_CAP]), count=count))

    def merge(self, other: Report) -> None:
        """`other`'s findings after this one's, as if its batches had come next (rows capped, counts whole)."""
        for mine, theirs in ((self.violations, other.violations), (self.unsettled, other.unsettled)):
            for finding in theirs:
                self._add(mine, finding.invariant, finding.what, finding.rows, finding.count)
        self.checked += [name for name in other.checked if name not in self.checked]

    def ordered(self, order: Sequence[str]) -> None:
        """Findings in the order the families declare them (batches find them in any order); a
        finding not declared (one whose text names a row, like a broken link) goes last."""
        for bucket in (self.violations, self.unsettled):
            bucket.sort(key=lambda f: order.index(f.what) if f.what in order else len(order))


def rows_sync(conn: Conn, sql: str, params: Any = ()) -> list[dict[str, Any]]:
    """A query's rows as plain dicts (picklable: a worker process sends its report back)."""
    cursor = conn.execute(sql, params)
    cursor.row_factory = None
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def summarize(report: Report, *, settled: bool) -> dict[str, Any]:
    """The report as `rem check --json` prints it; `settled`: work in flight counts as a violation too."""
    violations = [f.as_dict() for f in report.violations]
    unsettled = [f.as_dict() for f in report.unsettled]
    if settled:
        violations += [
            {**f, "invariant": f["invariant"], "what": "not settled: " + f["what"]} for f in unsettled
        ]
    return {
        # ok: verified whole and clean; a part not checked (Chroma down) is no pass
        "ok": not violations and not report.not_checked,
        "settled_mode": settled,
        "checked": report.checked,
        "not_checked": report.not_checked,
        "violations": violations,
        "unsettled": unsettled,
        "counts": {
            "violations": sum(f["count"] for f in violations),
            "unsettled": sum(f["count"] for f in unsettled),
        },
    }


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True, default=str)
