"""Effect classes and permissions: what a tool's call may do, and who must agree before it runs.

A tool's **effect class** decides what recovery may do with a call cut off by a crash:

* `read`: it changes nothing; run it again freely;
* `idempotent`: it changes something, but a repeat with the same idempotency
  key changes nothing more; run it again with the same key;
* `effect`: anything else; never run it again without an operator.

It comes from the MCP tool annotations unless the configuration says otherwise
(`"rem": {"tools": {"NAME.TOOL": {"effect": ...}}}`): `readOnlyHint` gives
`read`; else `idempotentHint` gives `idempotent`; anything else (destructive,
open-world, or no hints at all) gives `effect`, the safe default. A Python
tool's own declared class counts as its annotation. Annotations are the
server's claims, not proofs: an operator who does not trust a server sets its
tools' class in the configuration (`"NAME.*"` covers all of them).

Annotations that contradict each other are a lie somewhere, and rem believes
the worse half: `effect` (`annotation_conflict` says which pair; `rem tools`
and the log warn). The MCP spec's `ToolAnnotations` says a read-only tool
"does not modify its environment", so it can be neither destructive
(`readOnlyHint` with `destructiveHint: true`) nor have an additional effect
when repeated (`readOnlyHint` with `idempotentHint: false`).
`destructiveHint: false` beside `readOnlyHint` is no contradiction (many
servers send it), nor is an idempotent destructive tool (a delete).

The **permission** says whether a call runs: `allow`; `ask` (an operator
approves each call first); `deny` (the model is told the tool is denied).
Default: `allow` for read and idempotent tools, `ask` for effect tools.

Each resolved value records its **source** (`annotation`, `config`, `default`),
which `rem tools` shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class EffectClass(StrEnum):
    READ = "read"
    IDEMPOTENT = "idempotent"
    EFFECT = "effect"


class Permission(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


class Source(StrEnum):
    """Where a tool's effect class, permission or timeout came from."""

    ANNOTATION = "annotation"  # the MCP tool annotations, or a Python tool's own declaration
    CONFIG = "config"  # the `"rem"` section of REM_MCP_CONFIG
    DEFAULT = "default"  # rem's default


DEFAULT_PERMISSION = {
    EffectClass.READ: Permission.ALLOW,
    EffectClass.IDEMPOTENT: Permission.ALLOW,
    EffectClass.EFFECT: Permission.ASK,
}


@dataclass(frozen=True)
class ToolSettings:
    """The operator's settings for one tool (or a whole server): None where not set."""

    effect: EffectClass | None = None
    permission: Permission | None = None
    timeout_ms: int | None = None

    def over(self, fallback: ToolSettings) -> ToolSettings:
        """These settings, with `fallback`'s values where these are not set."""
        return ToolSettings(
            effect=self.effect if self.effect is not None else fallback.effect,
            permission=self.permission if self.permission is not None else fallback.permission,
            timeout_ms=self.timeout_ms if self.timeout_ms is not None else fallback.timeout_ms,
        )


@dataclass(frozen=True)
class Resolved:
    """A tool's effect class, permission and timeout, each with its source."""

    effect: EffectClass
    effect_source: Source
    permission: Permission
    permission_source: Source
    timeout_ms: int
    timeout_source: Source


def _hint(annotations: Mapping[str, Any] | None, *names: str) -> bool:
    """True when the annotation is set to true (under its camelCase or snake_case name)."""
    if not annotations:
        return False
    return any(annotations.get(name) is True for name in names)


CLASS_HINTS = (
    "readOnlyHint",
    "read_only_hint",
    "idempotentHint",
    "idempotent_hint",
    "destructiveHint",
    "destructive_hint",
)


def _false(annotations: Mapping[str, Any], *names: str) -> bool:
    return any(annotations.get(name) is False for name in names)


def annotation_conflict(annotations: Mapping[str, Any] | None) -> str | None:
    """Which hints contradict each other (a read-only tool that destroys, or is not idempotent), or None."""
    if not annotations or not _hint(annotations, "readOnlyHint", "read_only_hint"):
        return None
    if _hint(annotations, "destructiveHint", "destructive_hint"):
        return "claim readOnlyHint and destructiveHint together"
    if _false(annotations, "idempotentHint", "idempotent_hint"):
        return "claim readOnlyHint with idempotentHint false (a read-only call changes nothing, however repeated)"
    return None


def effect_from_annotations(annotations: Mapping[str, Any] | None) -> EffectClass | None:
    """The effect class the MCP annotations claim; None when they say nothing about it (no hints)."""
    if annotation_conflict(annotations) is not None:
        return EffectClass.EFFECT  # contradicting hints: believe the worse of them
    if _hint(annotations, "readOnlyHint", "read_only_hint"):
        return EffectClass.READ
    if _hint(annotations, "idempotentHint", "idempotent_hint"):
        return EffectClass.IDEMPOTENT
    if annotations and any(annotations.get(name) is not None for name in CLASS_HINTS):
        return EffectClass.EFFECT  # the server says it writes and may not be repeated
    return None


def resolve(
    annotations: Mapping[str, Any] | None,
    settings: ToolSettings,
    *,
    declared: EffectClass | None = None,
    default_timeout_ms: int,
) -> Resolved:
    """Resolve one tool: the configuration first, then its annotations (or `declared` class), then defaults."""
    claimed = declared if declared is not None else effect_from_annotations(annotations)
    if settings.effect is not None:
        effect, effect_source = settings.effect, Source.CONFIG
    elif claimed is not None:
        effect, effect_source = claimed, Source.ANNOTATION
    else:
        effect, effect_source = EffectClass.EFFECT, Source.DEFAULT
    if settings.permission is not None:
        permission, permission_source = settings.permission, Source.CONFIG
    else:
        permission, permission_source = DEFAULT_PERMISSION[effect], Source.DEFAULT
    if settings.timeout_ms is not None:
        timeout_ms, timeout_source = settings.timeout_ms, Source.CONFIG
    else:
        timeout_ms, timeout_source = default_timeout_ms, Source.DEFAULT
    return Resolved(effect, effect_source, permission, permission_source, timeout_ms, timeout_source)
