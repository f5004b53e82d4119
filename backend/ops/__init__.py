"""Operator actions and reports: one function per `rem` command, shared by CLI, console and daemons.

`backend.ops.<command>` is the library call behind `rem <command>`: the
functions live in `actions`; `snapshot` builds the status snapshot,
`checks` verifies the invariants, `lease_release` and `drain` are the
release and drain actions' bodies, `results` types what every action
returns, `totals` and `throughput` are the snapshot's uncapped
figures, `prometheus` and `alert_rules` turn it into Prometheus metrics and
alerts. `tool_list` reports the agent's tools (`rem tools`). `console` is the console's
door: the only way `tui/` reaches rem besides these functions (an import-linter
contract holds it to that).
"""

from __future__ import annotations

from backend.ops.actions import (
    LEASE_KINDS,
    check,
    chroma_health,
    drain,
    init,
    metric_rules,
    metrics,
    release,
    replay,
    resume,
    send,
    show,
    status,
)
from backend.ops.memory import graph_neighbors, import_file, list_projects, recall, show_session
from backend.ops.reindex import reindex
from backend.ops.tool_list import tools

__all__ = [
    "LEASE_KINDS",
    "check",
    "chroma_health",
    "drain",
    "graph_neighbors",
    "import_file",
    "init",
    "list_projects",
    "metric_rules",
    "metrics",
    "recall",
    "reindex",
    "release",
    "replay",
    "resume",
    "send",
    "show",
    "show_session",
    "status",
    "tools",
]
