"""Dream's states and drift, as the digester and its readers name them.

The vocabulary lives with the other stored values in `backend.store.states`
(no database code), so the status snapshot and the console read it without
loading the digester; this module names it for Dream's side.
"""

from __future__ import annotations

from backend.store.states import DRIFT_CLASSES, DigestState, DriftClass, classify_drift

__all__ = ["DRIFT_CLASSES", "DigestState", "DriftClass", "classify_drift"]
