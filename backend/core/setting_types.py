"""How a `REM_*` setting is declared and read: its parser (type and bounds) and its `Setting`.

`backend.core.settings` declares every setting with these; a parser turns the
raw environment string into a value or says, in one `SettingsError` line, what
the value must be.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from backend.core.errors import UsageError
from backend.core.redact import has_credentials, redact_url

T = TypeVar("T")

TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off"}


class SettingsError(UsageError):
    """A `REM_*` variable with a value rem cannot use."""


@dataclass(frozen=True)
class Parser(Generic[T]):
    """Turns a raw environment string into a value, or says what it must be."""

    parse: Callable[[str], T]
    expects: str
    # how a refused value is shown in the error (a URL's password hidden)
    shown: Callable[[str], str] = str


def whole(minimum: int | None = None, unit: str = "") -> Parser[int]:
    """An integer, at least `minimum`."""
    suffix = f" of {unit}" if unit else ""
    expects = f"a whole number{suffix}" + (f", at least {minimum}" if minimum is not None else "")

    def parse(raw: str) -> int:
        value = int(raw)
        if minimum is not None and value < minimum:
            raise ValueError(raw)
        return value

    return Parser(parse, expects)


def flag() -> Parser[bool]:
    def parse(raw: str) -> bool:
        lowered = raw.lower()
        if lowered in TRUE:
            return True
        if lowered in FALSE:
            return False
        raise ValueError(raw)

    return Parser(parse, "1 or 0 (also true/false, yes/no, on/off)")


def fraction() -> Parser[float]:
    """A number from 0 to 1."""

    def parse(raw: str) -> float:
        value = float(raw)
        if not 0.0 <= value <= 1.0:
            raise ValueError(raw)
        return value

    return Parser(parse, "a number from 0 to 1")


def number(minimum: float = 0.0) -> Parser[float]:
    """A finite number, at least `minimum`."""

    def parse(raw: str) -> float:
        value = float(raw)
        if not math.isfinite(value) or value < minimum:
            raise ValueError(raw)
        return value

    return Parser(parse, f"a number, at least {minimum:g}")


def choice(*options: str) -> Parser[str]:
    """One of `options` (case-insensitive)."""

    def parse(raw: str) -> str:
        if raw.lower() not in options:
            raise ValueError(raw)
        return raw.lower()

    return Parser(parse, "one of " + ", ".join(options))


def text(expects: str = "text") -> Parser[str]:
    return Parser(str, expects)


OPERATOR_MAX_LENGTH = 64


def printable(max_length: int) -> Parser[str]:
    """Printable text of at most `max_length` characters: no newline, no terminal escape."""

    def parse(raw: str) -> str:
        if len(raw) > max_length or not raw.isprintable():
            raise ValueError(raw)
        return raw

    return Parser(parse, f"printable text of at most {max_length} characters (no control characters)")


HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62})")


def host_name() -> Parser[str]:
    """A host identity: what `hostname` prints, or any short name in its alphabet."""

    def parse(raw: str) -> str:
        if not HOST_NAME.fullmatch(raw):
            raise ValueError(raw)
        return raw

    return Parser(parse, "a host name (letters, digits, '.', '_' or '-', at most 63 characters)")


SERVED_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")


def host_names() -> Parser[tuple[str, ...]]:
    """Comma-separated host names (or addresses), each with an optional `:port`, as a Host header names them."""

    def parse(raw: str) -> tuple[str, ...]:
        names = tuple(name.strip() for name in raw.split(",") if name.strip())
        if not names or len(names) > 32 or not all(SERVED_HOST.fullmatch(name) for name in names):
            raise ValueError(raw)
        return names

    return Parser(parse, "host names, comma-separated, each with an optional :port (e.g. rem.example.com)")


def postgres_url() -> Parser[str]:
    def parse(raw: str) -> str:
        if not raw.startswith(("postgresql://", "postgres://")):
            raise ValueError(raw)
        return raw

    return Parser(parse, "a postgresql:// URL", redact_url)


def path() -> Parser[Path]:
    return Parser(lambda raw: Path(raw).expanduser(), "a path")


def url(credentials_go: str = "a key goes in REM_MODEL_API_KEY_FILE") -> Parser[str]:
    """An http(s) URL without credentials (no check that anything answers there); the refusal
    says where credentials go instead (`credentials_go`)."""

    def parse(raw: str) -> str:
        if not raw.startswith(("http://", "https://")) or len(raw) < 10 or has_credentials(raw):
            raise ValueError(raw)
        return raw.rstrip("/")

    return Parser(
        parse,
        f"an http:// or https:// URL without credentials (no user:password@: {credentials_go})",
        redact_url,
    )


PRICE_KEYS = frozenset({"input", "output", "reasoning", "cache_read", "cache_write"})
Prices = dict[str, dict[str, float]]


def _check_price_row(model: str, row: object) -> None:
    """Raise ValueError(model) unless `row` maps known price keys to non-negative numbers."""
    if not isinstance(row, dict) or not set(row) <= PRICE_KEYS:
        raise ValueError(model)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in row.values()):
        raise ValueError(model)


def prices() -> Parser[Prices]:
    """A price table: inline JSON, or the path of a JSON file, `{model: {input: $/Mtok, ...}}`."""

    def parse(raw: str) -> Prices:
        try:
            text = raw if raw.lstrip().startswith("{") else Path(raw).expanduser().read_text()
            table = json.loads(text)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(raw) from exc
        if not isinstance(table, dict):
            raise ValueError(raw)
        for model, row in table.items():
            _check_price_row(model, row)
        return {str(m): {k: float(v) for k, v in row.items()} for m, row in table.items()}

    return Parser(
        parse,
        'a JSON price table (inline, or a file holding one): {"MODEL": {"input": 0.15, "output": 0.6, '
        '"cache_read": 0.075, "cache_write": 0, "reasoning": 0.6}} in dollars per million tokens',
    )


class Setting(Generic[T]):
    """One `REM_*` variable: read through the `settings` object, declared in `Settings`."""

    def __init__(
        self, default: T, doc: str, parser: Parser[Any], *, shown_default: str | None = None
    ) -> None:
        self.default = default
        self.doc = doc
        self.parser = parser
        self.shown_default = shown_default
        self.env = ""
        self._cache: dict[str, T] = {}

    def __set_name__(self, owner: type, name: str) -> None:
        self.env = "REM_" + name.upper()

    @overload
    def __get__(self, obj: None, owner: type) -> Setting[T]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> T: ...
    def __get__(self, obj: object | None, owner: type) -> Setting[T] | T:
        if obj is None:
            return self
        return self.read(os.environ.get(self.env))

    def read(self, raw: str | None) -> T:
        """The value for a raw environment string (unset or blank: the default)."""
        if raw is None or not raw.strip():
            return self.default
        if raw in self._cache:
            return self._cache[raw]
        try:
            value: T = self.parser.parse(raw.strip())
        except ValueError:
            shown = self.parser.shown(raw)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise SettingsError(
                f"{self.env}={shown!r} is not {self.parser.expects}; fix it or unset it "
                f"(default: {self.default_text()})"
            ) from None
        self._cache[raw] = value
        return value

    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        return "off" if self.default is False else "on" if self.default is True else str(self.default)
