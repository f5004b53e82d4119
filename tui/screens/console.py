"""The console's main screen: the panels. Coming back to it shows what was held while a modal was open."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from textual.screen import Screen

from tui.compositor import ChangedLinesCompositor


@runtime_checkable
class HoldsSnapshots(Protocol):
    """An app that holds snapshots back while a modal is open (`ConsoleApp`)."""

    def apply_pending(self) -> None: ...


class ConsoleScreen(Screen[None]):
    """The main screen; coming back to it applies any snapshot held while a modal was open. Its
    updates paint only the lines a refresh changed (`tui/compositor.py`)."""

    def __init__(self, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._compositor = ChangedLinesCompositor()

    def on_screen_resume(self) -> None:
        if isinstance(self.app, HoldsSnapshots):
            self.app.apply_pending()
