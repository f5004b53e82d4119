"""The `rem` command line: thin typer shells over `backend.ops` and the daemons."""
