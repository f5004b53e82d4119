"""The command palette provider: one entry per console action (Ctrl+P)."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

# (action name on the app, palette title, help text)
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("replay_selected", "Replay selected receipt", "Dry run first, then replay the receipt under the cursor"),
    ("replay_all", "Replay all mismatched receipts", "Dry run first, then replay every mismatched receipt"),
    ("drain", "Drain selected worker", "The worker stops claiming, hands back work and exits"),
    ("release", "Release selected lease", "Expire the lease now, fenced on the epoch shown"),
    ("kill", "Kill selected worker (SIGKILL drill)", "A worker, a lease's or a running call's owner"),
    (
        "kill_chroma",
        "Kill the local Chroma server (SIGKILL drill)",
        "The data dir's own server; rem up restarts it",
    ),
    ("approve", "Approve selected tool call", "Run the tool call selected in Backlog (an `approve` row)"),
    ("deny", "Deny selected tool call", "The model is told the operator denied it; it never runs"),
    ("resolve", "Resolve selected unknown outcome", "An `unknown` row in Backlog: done, retry or fail"),
    ("toggle_pause", "Pause / resume live updates", "Freeze the tables; the header counts what waits"),
    ("filter", "Filter focused panel", "Narrow the focused panel to rows containing some text"),
    ("sort", "Sort focused panel", "Cycle the sort column of the focused panel"),
    ("reverse_sort", "Reverse sort of focused panel", "Flip the sort direction"),
    ("detail", "Show detail of selected row", "Full row, receipt diff and journal history"),
    ("export_csv", "Export focused panel as CSV", "Write the rows shown to a CSV file"),
    ("copy_csv", "Copy focused panel as CSV", "Put the rows shown on the clipboard"),
    ("refresh_now", "Refresh now", "Reload the snapshot even if nothing was committed"),
    ("toggle_maximize", "Maximize / restore focused panel", "Give the focused panel the whole screen"),
    ("recall", "Recall memory", "Type a query; see the turns, summaries and facts an agent would be given"),
    ("help", "Help: all keys", "List every key of the console"),
)


class ConsoleCommands(Provider):
    """Console actions for the command palette; disabled ones (read-only) are left out."""

    def _enabled(self) -> list[tuple[str, str, str]]:
        app = self.app
        return [c for c in COMMANDS if app.check_action(c[0], ()) is True]

    def _run(self, action: str) -> None:
        self.app.call_later(self.app.run_action, action)

    async def discover(self) -> Hits:
        for action, title, help_text in self._enabled():
            yield DiscoveryHit(title, partial(self._run, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for action, title, help_text in self._enabled():
            score = matcher.match(title)
            if score > 0:
                yield Hit(
                    score, matcher.highlight(title), partial(self._run, action), text=title, help=help_text
                )
