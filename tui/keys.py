"""The console's keys: the key bar's order is what an incident needs first."""

from __future__ import annotations

from textual.binding import Binding

from tui.panels import PANELS

# the order is the key bar's: what an incident needs first
BINDINGS: list[Binding | tuple[str, str] | tuple[str, str, str]] = [
    Binding("question_mark", "help", "Help", key_display="?"),
    Binding("p", "toggle_pause", "Pause"),
    Binding("slash", "filter", "Filter", key_display="/"),
    Binding("t", "timeline", "Timeline"),
    Binding("l", "release", "Release"),
    Binding("d", "drain", "Drain"),
    Binding("k", "kill", "Kill"),
    Binding("r", "replay_selected", "Replay"),
    Binding("R", "replay_all", "Replay all"),
    Binding("u", "resume", "Resume"),
    Binding("a", "approve", "Approve"),
    Binding("n", "deny", "Deny"),
    Binding("o", "resolve", "Resolve"),
    Binding("s", "sort", "Sort"),
    Binding("S", "reverse_sort", "Reverse sort", show=False),
    Binding("e", "export_csv", "Export CSV"),
    Binding("c", "copy_csv", "Copy CSV", show=False),
    Binding("z", "toggle_maximize", "Zoom"),
    Binding("left_square_bracket", "timeline_seek('back')", "Timeline: step back", show=False),
    Binding("right_square_bracket", "timeline_seek('forward')", "Timeline: step forward", show=False),
    Binding(
        "left_curly_bracket", "timeline_seek('incident_back')", "Timeline: previous incident", show=False
    ),
    Binding(
        "right_curly_bracket", "timeline_seek('incident_forward')", "Timeline: next incident", show=False
    ),
    Binding("ctrl+r", "refresh_now", "Refresh now", show=False),
    Binding("0", "focus_header", "Focus the header's Chroma (k kills it)", show=False),
    *(
        Binding(str(i), f"focus_panel('{name}')", f"Focus {name}", show=False)
        for i, (name, _) in enumerate(PANELS, start=1)
    ),
    Binding("q", "quit", "Quit"),
]
