"""Operator actions and reports: one function per `rem` command, shared by CLI, console and daemons.

`backend.ops.<command>` is the library call behind `rem <command>`: the
functions live in `actions`; `snapshot` builds the status snapshot,
`checks` verifies the invariants, `lease_release` and `draining` are the
release and drain actions' bodies, `results` types what every action
returns, `totals` and `throughput` are the snapshot's uncapped
figures, `prometheus` and `alert_rules` turn it into Prometheus metrics and
alerts. `kills` holds the operator's SIGKILL (`rem kill`). `tool_list` reports the agent's tools (`rem tools`), `tool_decisions` holds the
operator's decisions on their calls (`rem approve|deny|resolve`) and the calls waiting for one.
`session_views` gives sessions as an application sees them (`rem serve`: pages of sessions and
of a transcript, one session's state), kept to a caller's projects.
`console` is the console's door: the only way `tui/` reaches rem besides
these functions (an import-linter contract holds it to that).

The names below are loaded on first use (PEP 562 `__getattr__`): `rem status`
imports the status snapshot, not the importer, reindexing or Dream's overlay
that other commands need. The `TYPE_CHECKING` block names every edge, so the
type checker and the import contracts see them as plain imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backend.ops.actions import (
        LEASE_KINDS,
        check,
        chroma_health,
        drain,
        init,
        metrics,
        release,
        replay,
        resume,
        send,
        show,
        status,
    )
    from backend.ops.alert_rules import metric_rules
    from backend.ops.kills import kill
    from backend.ops.memory import graph_neighbors, import_file, list_projects, recall, show_session
    from backend.ops.reindexing import reindex
    from backend.ops.session_views import messages_page, session_state, sessions_page
    from backend.ops.tokens import authenticate, send_as, token_create, token_list, token_revoke
    from backend.ops.tool_decisions import approve, deny, resolve, tool_calls_waiting
    from backend.ops.tool_list import tools

__all__ = [
    "LEASE_KINDS",
    "approve",
    "authenticate",
    "check",
    "chroma_health",
    "deny",
    "drain",
    "graph_neighbors",
    "import_file",
    "init",
    "kill",
    "list_projects",
    "metric_rules",
    "messages_page",
    "metrics",
    "recall",
    "reindex",
    "release",
    "replay",
    "resolve",
    "resume",
    "send",
    "send_as",
    "session_state",
    "sessions_page",
    "show",
    "show_session",
    "status",
    "token_create",
    "token_list",
    "token_revoke",
    "tool_calls_waiting",
    "tools",
]

# the module each name lives in
_HOMES = {
    "LEASE_KINDS": "backend.ops.actions",
    "check": "backend.ops.actions",
    "chroma_health": "backend.ops.actions",
    "drain": "backend.ops.actions",
    "init": "backend.ops.actions",
    "kill": "backend.ops.kills",
    "metric_rules": "backend.ops.alert_rules",
    "metrics": "backend.ops.actions",
    "release": "backend.ops.actions",
    "replay": "backend.ops.actions",
    "resume": "backend.ops.actions",
    "send": "backend.ops.actions",
    "show": "backend.ops.actions",
    "status": "backend.ops.actions",
    "graph_neighbors": "backend.ops.memory",
    "import_file": "backend.ops.memory",
    "list_projects": "backend.ops.memory",
    "recall": "backend.ops.memory",
    "show_session": "backend.ops.memory",
    "reindex": "backend.ops.reindexing",
    "messages_page": "backend.ops.session_views",
    "session_state": "backend.ops.session_views",
    "sessions_page": "backend.ops.session_views",
    "tools": "backend.ops.tool_list",
    "approve": "backend.ops.tool_decisions",
    "deny": "backend.ops.tool_decisions",
    "resolve": "backend.ops.tool_decisions",
    "tool_calls_waiting": "backend.ops.tool_decisions",
    "authenticate": "backend.ops.tokens",
    "send_as": "backend.ops.tokens",
    "token_create": "backend.ops.tokens",
    "token_list": "backend.ops.tokens",
    "token_revoke": "backend.ops.tokens",
}


def __getattr__(name: str) -> Any:
    """`backend.ops.<name>`, imported from its module on first use (import time: a command loads only
    the operations it runs), then kept in this module like an ordinary import."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'backend.ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
