"""The invariant families `rem check` runs, in the order it runs them and lists their findings.

Adding a family is one module (see the package docstring) and one line in `FAMILIES`.
"""

from __future__ import annotations

from backend.ops.checks import counters, dream, execution, journal, receipts, structure, tools, turn_index
from backend.ops.checks.family import ChromaCheck, Family, SessionsCheck, StateCheck, Sweep

FAMILIES: tuple[Family, ...] = (
    structure.FAMILY,
    execution.FAMILY,
    tools.FAMILY,
    counters.FAMILY,
    receipts.FAMILY,
    dream.FAMILY,
    turn_index.FAMILY,
    journal.FAMILY,
)


def finding_order() -> tuple[str, ...]:
    """The order a report lists its state.db findings in: family by family, each in its declared order."""
    return tuple(what for family in FAMILIES for what in family.findings)


FINDING_ORDER = finding_order()


def sessions_checks() -> list[SessionsCheck]:
    return [check for family in FAMILIES for check in family.sessions]


def state_checks() -> list[StateCheck]:
    return [check for family in FAMILIES for check in family.state]


def sweeps(*, first: bool) -> list[Sweep]:
    return [sweep for family in FAMILIES for sweep in family.sweeps if sweep.first == first]


def chroma_checks() -> list[ChromaCheck]:
    return [check for family in FAMILIES for check in family.chroma]
