"""rem: a durable runtime for agent sessions and their long-term memory.

The one library. Daemons, the CLI and the console all call it; it never
imports the UI (`tui`), and only `backend.cli` imports typer and rich.
"""

from __future__ import annotations

__version__ = "0.1.0"
