"""The structure family (invariant 0): state.db itself reads back whole, and every foreign key points
at a row. Checked table by table (`PRAGMA quick_check(table)`), each in a short read of its own;
PostgreSQL enforces its keys on every write and checks its own pages."""

from __future__ import annotations

import json

from backend.ops.checks.family import Family, Sweep
from backend.ops.checks.report import Report, rows_sync
from backend.store.db import Conn, engine_of

STRUCTURE_TABLES_SQL = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
)


def structure_tables_sync(conn: Conn) -> list[str]:
    if engine_of(conn) == "postgresql":
        return []
    return [r["name"] for r in conn.execute(STRUCTURE_TABLES_SQL).fetchall()]


def check_structure_sync(conn: Conn, report: Report, table: str | None = None) -> None:
    """`quick_check` and the foreign keys, of one table (and its indexes) or of the whole file."""
    report.mark("structure")
    if engine_of(conn) == "postgresql":
        return  # PostgreSQL enforces every foreign key on every write and checks its own pages
    target = f"({json.dumps(table)})" if table else ""
    problems = [
        r["quick_check"]
        for r in conn.execute(f"PRAGMA quick_check{target}").fetchall()
        if r["quick_check"] != "ok"
    ]
    report.add(
        report.violations,
        "structure",
        "state.db fails PRAGMA quick_check",
        [{"problem": p} for p in problems],
    )
    orphans = rows_sync(conn, f"PRAGMA foreign_key_check{target}")
    report.add(report.violations, "structure", "rows whose foreign key points at nothing", orphans)


FAMILY = Family(
    name="structure",
    findings=("state.db fails PRAGMA quick_check", "rows whose foreign key points at nothing"),
    # first: state.db's pages were just read ahead in file order (`warm_page_cache`); on
    # PostgreSQL no tables are listed, and the whole check lists the structure as checked
    sweeps=(
        Sweep(
            "structure", structure_tables_sync, check_structure_sync, whole=check_structure_sync, first=True
        ),
    ),
)
