"""Where recall looks (a project, a session in it, or everywhere) and the turns it leaves out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Scope:
    """Where recall looks: a project, a session in it, or everywhere (project None)."""

    project: str | None
    session_id: str | None = None
    # leave out this session's turns from this position on (the agent's own recent turns)
    exclude_session: str | None = None
    exclude_from_ord: int = 0


def excluded(scope: Scope, session_id: str, ord_: int) -> bool:
    return scope.exclude_session == session_id and ord_ >= scope.exclude_from_ord


def in_list(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values))
