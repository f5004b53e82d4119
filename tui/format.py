"""Small text helpers shared by the console widgets: durations, ids, theme-coloured cells."""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.style import Style
from rich.text import Text

from backend.core.errors import RemError

# Fallbacks when no app (and so no theme) is around, e.g. in unit tests.
DEFAULT_PALETTE = {
    "error": "#B93C5B",
    "warning": "#FEA62B",
    "success": "#4EBF71",
    "accent": "#FEA62B",
    "primary": "#0178D4",
    "muted": "#B6B6B6",
    "foreground": "#E0E0E0",
}


def palette_from(variables: Mapping[str, str]) -> dict[str, str]:
    """The colours cells use, resolved from the app's theme variables."""
    palette = dict(DEFAULT_PALETTE)
    for name in ("error", "warning", "success", "accent", "primary", "foreground"):
        if name in variables:
            palette[name] = variables[name]
    palette["muted"] = variables.get("foreground-darken-2", palette["muted"])
    return palette


def cell(
    value: Any, tone: str | None = None, palette: Mapping[str, str] | None = None, *, bold: bool = False
) -> Text:
    """A table cell as plain Rich text (never markup: ids may contain brackets)."""
    text = "" if value is None else str(value)
    color = (palette or DEFAULT_PALETTE).get(tone) if tone else None
    if color is None and not bold:
        return Text(text, no_wrap=True, overflow="ellipsis")
    return Text(text, style=Style(color=color, bold=bold), no_wrap=True, overflow="ellipsis")


def duration(ms: int | float | None) -> str:
    """A compact human duration: 850ms, 12s, 4m05s, 3h12m, 2d04h."""
    if ms is None:
        return "-"
    ms = int(ms)
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    if ms < 1_000:
        return f"{sign}{ms}ms"
    s = ms // 1_000
    if s < 60:
        return f"{sign}{s}s"
    if s < 3_600:
        return f"{sign}{s // 60}m{s % 60:02d}s"
    if s < 86_400:
        return f"{sign}{s // 3_600}h{s % 3_600 // 60:02d}m"
    return f"{sign}{s // 86_400}d{s % 86_400 // 3_600:02d}h"


def fitted(ms: int, width: int = 5) -> str:
    """A non-negative duration in whole seconds, as precise as fits in `width` characters."""
    s = max(0, int(ms)) // 1000
    full = duration(s * 1000) if s else "0s"
    if len(full) <= width:
        return full
    if s < 3_600:
        return f"{s // 60}m"
    if s < 86_400:
        return f"{s // 3_600}h"
    return f"{s // 86_400}d"


def age(at_ms: int | None, now_ms: int) -> str:
    """How long ago a time was (`0s`, `12s`, `4m05s`, `52m`, `3h05m`), or `-` when unknown."""
    return "-" if at_ms is None else fitted(now_ms - int(at_ms))


def time_left(ms: int) -> str:
    """A lease countdown in five characters: `12s` (rounded up), `-3s` once run out, `-47m` later."""
    if ms > 0:
        return fitted(-(-ms // 1000) * 1000, 4)
    return f"-{fitted(-ms, 4)}"


def clock_time(at_ms: int | None) -> str:
    """Wall-clock HH:MM:SS (local time) of a ms timestamp."""
    if at_ms is None:
        return "-"
    return _dt.datetime.fromtimestamp(int(at_ms) / 1000).strftime("%H:%M:%S")


def full_time(at_ms: int | None) -> str:
    if at_ms is None:
        return "-"
    stamp = _dt.datetime.fromtimestamp(int(at_ms) / 1000).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp}.{int(at_ms) % 1000:03d}"


def short(value: Any, width: int = 14) -> str:
    """An id cut to `width` characters with an ellipsis (the detail screen shows it whole)."""
    text = "" if value is None else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def short_id(value: Any, width: int = 10) -> str:
    """An id cut from the front (`…deploys-1`): ids share prefixes and differ at the end."""
    text = "" if value is None else str(value)
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1) :]


def owner_short(owner_id: Any) -> str:
    """`executor-host-4102-d4e5f6` -> `exec:4102` (role and pid say which process it is)."""
    text = "" if owner_id is None else str(owner_id)
    parts = text.split("-")
    if len(parts) >= 4 and parts[-2].isdigit():
        return f"{parts[0][:4]}:{parts[-2]}"
    return short_id(text, 9)


def short_revision(revision: str | None) -> str:
    """`sha256:ab12cd…` -> `ab12cd` (enough to tell revisions apart on screen)."""
    if not revision:
        return "-"
    return revision.split(":", 1)[-1][:8]


def compact_json(value: Any, limit: int = 80) -> str:
    """Event data as `k=v k=v`, cut to `limit` characters."""
    if isinstance(value, dict):
        text = " ".join(f"{k}={_scalar(v)}" for k, v in value.items())
    else:
        text = _scalar(value)
    return short(text, limit)


def _scalar(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(_scalar(v) for v in value)
    if isinstance(value, dict):
        return "{" + " ".join(f"{k}={_scalar(v)}" for k, v in value.items()) + "}"
    return str(value)


def one_line_error(error: BaseException | None) -> str:
    """An error as one line: rem's own errors as they are, others with their type."""
    if error is None:
        return "unknown error"
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text if isinstance(error, RemError) else f"{type(error).__name__}: {text}"


def home_short(path: Path) -> str:
    """`/home/me/rem-data` -> `~/rem-data`."""
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home) :] if text.startswith(home + os.sep) else text
