"""`rem check`'s invariant families: each declares every finding it reports, and a new family is one
module plus one line in the registry (the batches, the phases and the listing order need nothing else)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from types import ModuleType

import pytest

from backend.ops import checks
from backend.ops.checks import registry
from backend.ops.checks.family import Family, Moment
from backend.ops.checks.report import Report, rows_sync
from backend.runtime.context import Context
from backend.store.db import Conn


def _family_modules() -> Iterator[ModuleType]:
    for info in pkgutil.iter_modules(checks.__path__):
        module = importlib.import_module(f"backend.ops.checks.{info.name}")
        if isinstance(getattr(module, "FAMILY", None), Family):
            yield module


def _reported(module: ModuleType) -> set[str]:
    """The `what` of every `report.add(bucket, invariant, what, rows)` in a module whose text is fixed."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        func = getattr(node, "func", None)
        if not (
            isinstance(func, ast.Attribute) and func.attr == "add" and ast.unparse(func.value) == "report"
        ):
            continue
        what = node.args[2]
        if isinstance(what, ast.Constant) and isinstance(what.value, str):
            found.add(what.value)
        elif isinstance(what, ast.Name):
            found.add(getattr(module, what.id))
        # an f-string names a row (a broken link): listed after every declared finding, by design
    return found


def test_every_family_module_is_registered_once() -> None:
    modules = list(_family_modules())
    assert len(modules) >= 7
    assert [m.FAMILY for m in modules if m.FAMILY not in registry.FAMILIES] == []
    names = [f.name for f in registry.FAMILIES]
    assert sorted(names) == sorted(m.FAMILY.name for m in modules) and len(set(names)) == len(names)


def test_each_family_declares_exactly_the_findings_its_checks_report() -> None:
    for module in _family_modules():
        assert set(module.FAMILY.findings) == _reported(module), module.__name__
        assert len(set(module.FAMILY.findings)) == len(module.FAMILY.findings), module.__name__
    order = registry.finding_order()
    assert len(order) == len(set(order)), "a finding declared by two families"


def _probe_family(seen: list[tuple[str, str]]) -> Family:
    """A family as a new module would declare one: a check per batch of sessions, one over the state."""

    def check_probe_sessions_sync(conn: Conn, report: Report, lo: str, hi: str) -> None:
        report.mark("probe")
        seen.append((lo, hi))
        rows = rows_sync(
            conn, "SELECT id AS session_id FROM session WHERE id > :lo AND id <= :hi", {"lo": lo, "hi": hi}
        )
        report.add(report.violations, "probe", "probe: sessions seen", rows)

    def check_probe_state_sync(conn: Conn, report: Report, moment: Moment) -> None:
        report.add(report.violations, "probe", "probe: state seen", [{"now": moment.now}])

    return Family(
        name="probe",
        findings=("probe: state seen", "probe: sessions seen"),
        sessions=(check_probe_sessions_sync,),
        state=(check_probe_state_sync,),
    )


async def test_a_registered_family_runs_in_every_batch_and_is_listed_in_its_declared_order(
    db_ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await db_ctx.db()
    async with db.tx() as conn:
        for sid in ("s1", "s2", "s3"):
            await conn.execute(
                "INSERT INTO session (id, last_seq, time_created, time_updated) VALUES (?, 0, 1, 1)", (sid,)
            )
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(registry, "FAMILIES", (*registry.FAMILIES, _probe_family(seen)))
    batched = await checks.check_database_in_batches(db, now=7, batch=2, workers=1)
    assert seen == [("", "s2"), ("s2", "s3")]  # every session once, batch by batch, in id order
    seen.clear()
    whole = await db.read_in_thread(lambda conn: checks.check_database_sync(conn, now=7))
    assert seen == [("", "s3")]
    for report in (batched, whole):
        result = checks.summarize(report, settled=False)
        # added sessions first, state second; listed in the order the family declares them
        assert [(f["what"], f["count"]) for f in result["violations"]] == [
            ("probe: state seen", 1),
            ("probe: sessions seen", 3),
        ]
        assert result["violations"][0]["rows"] == [{"now": 7}]
        # its name among the checked, after the other families' per-session checks, before the state's
        assert result["checked"] == [
            "structure", "inputs", "projection", "tool calls", "usage", "recall_index", "probe", "progress",
            "audit", "counters",
        ]  # fmt: skip
