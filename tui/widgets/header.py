"""The one-line header: data dir, Chroma, model and tool-source health, schema, counts, read-only, paused
and timeline badges, then the snapshot's time and the refresh interval in use (`08:00:00 ↻40ms`;
`↻0.4s budget` while the CPU budget holds refreshes back), the way Dolphie shows its refresh interval."""

from __future__ import annotations

from collections.abc import Mapping

from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from backend.ops.records import ChromaHealth, ModelHealth, ModelState, Status, ToolServerRecord
from tui.format import DEFAULT_PALETTE, clock_time, visible


def chroma_label(chroma: ChromaHealth | None) -> tuple[str, bool | None]:
    """A short Chroma description and whether it is healthy (None: not known yet)."""
    if chroma is None:
        return "Chroma ?", None
    url = visible(chroma["url"] or "").removeprefix("http://")
    where = f" {url}" if url else ""
    if chroma["external"]:
        where += " (ext)"
    return (f"Chroma up{where}", True) if chroma["healthy"] else (f"Chroma DOWN{where}", False)


MODEL_TONE = {
    ModelState.OK: "success",
    ModelState.DEGRADED: "warning",
    ModelState.DOWN: "error",
    ModelState.IDLE: "muted",
}


def model_label(model: ModelHealth | None) -> tuple[str, str] | None:
    """The model endpoint's health in a few words, and its tone (None: no model used, ever)."""
    if model is None or model["state"] == ModelState.UNUSED:
        return None
    state = model["state"]
    if state == ModelState.IDLE:
        return "model idle", "muted"
    label = f"model {state}"
    if state == ModelState.DOWN:
        last = model["last_error"]
        label = f"model DOWN ({visible(last['error_class'])})" if last else "model DOWN"
    parts = [label]
    if model["requests"]:
        parts.append(f"{100 * model['error_rate']:.0f}% err")
    if model["retries"]:
        parts.append(f"{model['retries']} retries")
    if model["ttft_ms_p95"] is not None:
        p95 = model["ttft_ms_p95"]
        parts.append(f"p95 {p95:.0f} ms" if p95 < 1000 else f"p95 {p95 / 1000:.1f} s")
    return " ".join(parts), MODEL_TONE.get(state, "muted")


TOOLS_NAMED = 3  # sources named in the header; the rest counted


def tools_label(servers: list[ToolServerRecord] | None) -> str | None:
    """The tool sources down in live executors, in a few words (None: all up, or none used)."""
    down: dict[str, str] = {}
    for record in servers or []:
        if not record["up"]:
            down.setdefault(visible(record["server"]), visible((record["error"] or "down").split(":")[0]))
    if not down:
        return None
    if len(down) == 1:
        ((name, why),) = down.items()
        return f"tools DOWN: {name} ({why})"
    names = sorted(down)
    more = f" +{len(names) - TOOLS_NAMED}" if len(names) > TOOLS_NAMED else ""
    return f"tools DOWN: {', '.join(names[:TOOLS_NAMED])}{more}"


class ConsoleHeader(Static, can_focus=True):
    """Where this console looks and what state it is in, in one line.

    Focused (`0`, a click, or Shift+Tab from the first panel) it marks its Chroma indicator:
    `k` there kills the data dir's Chroma server (`tui/kill.py`).
    """

    DEFAULT_CSS = """
    ConsoleHeader {
        dock: top;
        height: 1;
        background: $panel;
        color: $text;
        padding: 0 1;
    }
    ConsoleHeader.-paused {
        background: $warning-muted;
    }
    ConsoleHeader.-timeline {
        background: $accent-muted;
    }
    """

    def __init__(self, data_label: str, *, read_only: bool, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.data_label = data_label
        self.read_only = read_only
        self.snapshot: Status | None = None
        self.paused = False
        # the recorded moment shown instead of live state (None: live)
        self.timeline_at: int | None = None
        self.waiting = ""
        self.refresh_rate = ""  # `RefreshScheduler.describe()`
        self.now = 0
        self.palette: Mapping[str, str] = DEFAULT_PALETTE
        self._shown = Text()
        self._inputs_shown: tuple[object, ...] | None = None  # what `_shown` was built from

    def set_state(
        self,
        *,
        snapshot: Status | None = None,
        paused: bool | None = None,
        waiting: str | None = None,
        now: int | None = None,
        palette: Mapping[str, str] | None = None,
        refresh: str | None = None,
    ) -> None:
        if snapshot is not None:
            self.snapshot = snapshot
        if paused is not None:
            self.paused = paused
        if waiting is not None:
            self.waiting = waiting
        if now is not None:
            self.now = now
        if palette is not None:
            self.palette = palette
        if refresh is not None:
            self.refresh_rate = refresh
        self.set_class(self.paused, "-paused")
        self.set_class(self.timeline_at is not None, "-timeline")
        # building the line is ~0.3 ms, and a busy fleet's refreshes (10 a second) mostly change
        # nothing it shows (its clock moves once a second): built only when what it shows moved
        inputs = self._inputs()
        if inputs == self._inputs_shown:
            return
        self._inputs_shown = inputs
        text = self.header_text()
        if text != self._shown:
            self._shown = text
            self.update(text, layout=False)  # one line, always: no relayout of the screen

    def _inputs(self) -> tuple[object, ...]:
        """Everything `header_text` reads (the snapshot's time to the second it shows)."""
        snap, seen = self.snapshot, None
        if snap is not None:
            at = snap["generated_at"]
            servers = (snap.get("tools") or {}).get("servers")
            counts = (snap["schema_version"], snap["counts"]["sessions"], None if at is None else at // 1000)
            seen = (snap["chroma"], snap["model"], servers, *counts)
        own = (self.paused, self.waiting, self.timeline_at, self.read_only, self.data_label)
        return (seen, *own, self.palette, self.refresh_rate, self.has_focus)

    def on_focus(self) -> None:
        self.set_state()

    def on_blur(self) -> None:
        self.set_state()

    def show_timeline(self, at: int | None) -> None:
        """Badge the header with the recorded moment shown (None: live again)."""
        self.timeline_at = at
        self.set_state()

    def _badge(self, text: str, tone: str) -> Text:
        return Text(f" {text} ", style=Style(color="#000000", bgcolor=self.palette[tone], bold=True))

    def _append_health(self, line: Text, snap: Status | None) -> None:
        """Chroma's health, then the model's (once used), then the tool sources down (if any)."""
        label, healthy = chroma_label(snap["chroma"] if snap is not None else None)
        tone = {True: "success", False: "error", None: "muted"}[healthy]
        line.append("  ● ", style=Style(color=self.palette[tone]))
        look = Style(color=self.palette["error"]) if healthy is False else Style()
        line.append(label, style=look + Style(reverse=True) if self.has_focus else look)
        if self.has_focus:
            line.append(" k kills it", style=Style(color=self.palette["muted"]))
        model = model_label(snap["model"] if snap is not None else None)
        if model is not None:
            text, tone = model
            line.append("  ● ", style=Style(color=self.palette[tone]))
            line.append(text, style=Style(color=self.palette[tone]) if tone in ("error", "warning") else "")
        # (a moment recorded before the tool sources' health was has none)
        tools = tools_label((snap.get("tools") or {}).get("servers") if snap is not None else None)
        if tools is not None:
            line.append("  ● ", style=Style(color=self.palette["error"]))
            line.append(tools, style=Style(color=self.palette["error"]))

    def header_text(self) -> Text:
        snap = self.snapshot
        line = Text()
        if self.timeline_at is not None:  # first: whatever the width, the past is never clipped away
            line.append_text(self._badge(f"◀ PAST {clock_time(self.timeline_at)}, NOT LIVE", "error"))
            line.append(" ")
            # READ-ONLY beside it: after the long past badge its usual place is off a 120-column header
            if self.read_only:
                line.append_text(self._badge("READ-ONLY", "warning"))
                line.append(" ")
        line.append("rem ", style="bold")
        line.append(visible(self.data_label))
        self._append_health(line, snap)
        if snap is not None:
            line.append(f"  schema v{snap['schema_version']}")
            line.append(f"  {snap['counts']['sessions']} sessions")
        line.append("  ")
        if self.read_only and self.timeline_at is None:
            line.append_text(self._badge("READ-ONLY", "warning"))
            line.append(" ")
        if self.paused:
            line.append_text(self._badge(f"PAUSED {self.waiting}".strip(), "warning"))
            line.append(" ")
        if snap is not None and self.timeline_at is None:  # as of when, and how often it refreshes
            line.append(f" {clock_time(snap['generated_at'])}", style=Style(color=self.palette["muted"]))
            if self.refresh_rate:
                throttled = self.refresh_rate.endswith("budget")
                tone = self.palette["warning" if throttled else "muted"]
                line.append(f" {self.refresh_rate}", style=Style(color=tone))
        return line
