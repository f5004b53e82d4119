"""A banner for what is unreachable right now (the database, Chroma), instead of a crash."""

from __future__ import annotations

from textual.widgets import Static

from tui.format import visible


class Banner(Static):
    """Shown only while something is wrong; each problem is one line naming the fix."""

    DEFAULT_CSS = """
    Banner {
        display: none;
        height: auto;
        max-height: 4;
        background: $error;
        color: $text;
        text-style: bold;
        padding: 0 1;
    }
    Banner.-shown {
        display: block;
    }
    Banner.-warning {
        background: $warning;
        color: $background;
    }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.problems: dict[str, str] = {}
        self._text = ""

    def set_problem(self, source: str, message: str | None) -> None:
        """Set (or clear, with None) the problem reported by `source`.

        Sources: "database", "chroma", "feed", and "chroma-refused" (a listener rem
        refused where its Chroma server was: an error, not a warning).
        """
        shown = visible(message) if message else None  # errors quote the data: never a terminal escape
        if self.problems.get(source) == shown:
            return  # as it was (each refresh reports every source): no class or text to touch
        if shown:
            self.problems[source] = shown
        else:
            self.problems.pop(source, None)
        self.set_class(bool(self.problems), "-shown")
        # Chroma or the change feed alone is a warning: leases, backlog and drift are still live
        self.set_class(bool(self.problems) and set(self.problems) <= {"chroma", "feed"}, "-warning")
        text = "\n".join(f"⚠ {text}" for text in self.problems.values())
        if text != self._text:
            self._text = text
            self.update(text)
