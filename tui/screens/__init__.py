"""Modal screens of the console: confirmation, row detail, help."""
