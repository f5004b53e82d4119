"""Operator actions and reports: one function per `rem` command, shared by CLI, console and daemons.

`backend.ops.<command>` is the library call behind `rem <command>`: the
functions live in `actions`; `snapshot` builds the status snapshot,
`checks` verifies the invariants and `lease_release` releases summary-job
and Dream leases.
"""

from __future__ import annotations

from backend.ops.actions import (
    LEASE_KINDS,
    check,
    chroma_health,
    drain,
    init,
    release,
    replay,
    resume,
    send,
    show,
    status,
)

__all__ = [
    "LEASE_KINDS",
    "check",
    "chroma_health",
    "drain",
    "init",
    "release",
    "replay",
    "resume",
    "send",
    "show",
    "status",
]
