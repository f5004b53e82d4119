"""rem: a durable runtime for agent sessions and their long-term memory.

The one library; daemons, the CLI and the console all call it. Its folders
are layers, and imports only flow down (import-linter enforces it):

    cli        `rem` commands, one file each, thin shells over ops (and the console launch)
    tools      rem up (supervisor), load, drill, bench, demo
    ops        operator actions (`ops.release`, `ops.replay`, ...), the status snapshot, checks
    execution | summaries | dream
               turns and leases | synthesis, receipts, replay | Dream's graph
    runtime    a process's Context on a data dir, the daemon loop
    chroma | store
               the Chroma server, collection, embedder | state.db, schema, journal, workers
    core       errors, settings (every REM_* variable), plugins, clock, datadir, faults

Nothing here imports the UI (`tui`), and only `backend.cli` imports typer and rich.
"""

from __future__ import annotations

__version__ = "0.1.0"
