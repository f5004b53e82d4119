"""The rem on-call console (Textual). Imports `backend`; nothing imports `tui`."""
