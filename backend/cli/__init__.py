"""The `rem` command line: thin typer shells over `backend.ops` and the daemons.

Importing it makes the process non-dumpable before anything else of rem runs
(`backend.core.private.make_undumpable`): every `rem` process (a command, `rem up`,
the daemons it starts) may hold the model key or a database password in its
environment or memory, and a tool server runs as the same user. Here, not in
`main`, so that the moments a secret is readable are only the interpreter's start.
"""

from __future__ import annotations

from backend.core import private

private.make_undumpable()
