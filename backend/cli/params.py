"""Parameter values without pydantic where typer would build a pydantic validator for nothing.

typer 0.29 coerces every parameter it processes, an absent option included,
through a pydantic `TypeAdapter` it builds on first use, and importing pydantic
for that costs more than everything else `rem status --json` imports of rem
itself (`python -X importtime`: pydantic and typer's adapters ~0.15 s of the
~0.7 s a loaded machine takes). Most values rem's commands receive need no
coercion at all:

* an option left out (None), answered as typer answers it (`()` for a list);
* a string for a `str` parameter: typer's own coercion returns it unchanged;
* a value for a parameter with rem's own `parser=` (`--data`): typer only calls it;
* a default of its declared type: a number within its bounds (`--last 0`), an
  enum's member (`--delivery`'s `queue`).

`install()` (called once by `backend.cli.app`) gives every typer parameter,
the help options typer adds included, a coercion that answers those itself
and hands anything else to typer's own, built only then: an `int` typed on
the command line, a choice or a list is checked and reported exactly as typer
does. It replaces one method of typer's parameter class (typer is pinned in
pyproject.toml); the rest of typer is untouched. tests/cli/test_start_imports.py keeps pydantic
out of `rem status --json`; the CLI tests check the values and errors.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from typer._click import Context
from typer._coercion import build_runtime_param  # typer's own coercion (pydantic)
from typer.core import _TyperParameter


class PlainValues:
    """A parameter's coercion: the plain cases here, the rest by typer's (pydantic) one."""

    def __init__(self, param: _TyperParameter) -> None:
        self.descriptor = param.type_descriptor
        self.info = param.type_descriptor.parameter_info
        self._typer: Any = None

    def coerce(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
        multi = param.multiple or param.nargs == -1
        if value is None:
            return () if multi else None
        if not multi:
            plain = self._plain(value)
            if plain is not _NOT_PLAIN:
                return plain
        if self._typer is None:
            self._typer = build_runtime_param(self.descriptor)
        return self._typer.coerce(value, param=param, ctx=ctx)

    def _plain(self, value: Any) -> Any:
        annotation = self.descriptor.annotation
        if self.info.parser is not None:
            try:
                return self.info.parser(value)
            except (ValueError, AssertionError):  # typer reports these as a bad value: let it say so
                return _NOT_PLAIN
        if annotation is str and type(value) is str:
            return value
        if isinstance(annotation, type) and issubclass(annotation, Enum) and isinstance(value, annotation):
            return value  # typer's choice check returns a member as it is
        if annotation in (int, float) and type(value) is annotation and not self.info.clamp:
            low, high = self.info.min, self.info.max
            if (low is None or value >= low) and (high is None or value <= high):
                return value
        return _NOT_PLAIN


_NOT_PLAIN = object()


def _plain_values_first(self: _TyperParameter) -> Any:
    if self._runtime_param is None:
        self._runtime_param = PlainValues(self)  # type: ignore[assignment]
    return self._runtime_param


def install() -> None:
    """Coerce every typer parameter's plain values without pydantic from now on (idempotent)."""
    _TyperParameter.get_runtime_param = _plain_values_first  # type: ignore[method-assign]
