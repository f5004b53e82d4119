"""How a command prints its result: one JSON document with `--json`, else its human view."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from backend.cli import common

Result = TypeVar("Result")


def show(result: Result, as_json: bool, human: Callable[[Result], None]) -> None:
    """`result` as JSON on stdout when `as_json`, else through `human` (a renderer of cli/render*)."""
    if as_json:
        common.emit_json(result)
    else:
        human(result)
