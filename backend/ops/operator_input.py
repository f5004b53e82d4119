"""What an operator hands an action (ids, reasons, results), bounded before anything is journaled.

Every front door (the CLI, the console, `rem mcp`, the HTTP API) passes the operator's text
to `backend.ops`, and an action journals what it was asked, even a refusal
(`operator.refused`, hash-chained and kept forever). Unbounded, a refused decision on a
3 MB call id left a permanent 6 MB event. So each action checks its input here first:

* an id (a call, lease, worker, session or receipt) longer than `ID_MAX` characters, or
  holding a control or invisible character, is refused in one line (`BadInput`, which is
  never journaled: no such id exists, rem's own ids are short and plain);
* a reason (a denial's, a failure's) is at most `REASON_MAX_BYTES` of UTF-8;
* and `journal_text` cuts what a refusal journals (the target, the error) at
  `JOURNAL_TEXT_MAX` characters, whatever a caller passed.
"""

from __future__ import annotations

from backend.core.errors import BadInput
from backend.core.inert import is_inert, visible
from backend.core.storable import UNSTORABLE

ID_MAX = 200
REASON_MAX_BYTES = 4096
JOURNAL_TEXT_MAX = 1000
_SHOWN = 40  # characters of a refused id quoted back


def operator_id(kind: str, value: object) -> str:
    """`value` as an id an operator named, or BadInput (one line, nothing journaled) saying why not."""
    if not isinstance(value, str) or not value:
        raise BadInput(f"name the {kind}")
    shown = visible(value[:_SHOWN]) + ("..." if len(value) > _SHOWN else "")
    if len(value) > ID_MAX:
        raise BadInput(
            f"the {kind} {shown!r} is {len(value)} characters, over {ID_MAX}: no {kind} is that long; "
            "copy it from `rem status`"
        )
    if not is_inert(value) or UNSTORABLE.search(value):
        raise BadInput(
            f"the {kind} {shown!r} holds a control or invisible character: no {kind} does; "
            "copy it from `rem status`"
        )
    return value


def operator_reason(value: str | None, limit: int = REASON_MAX_BYTES) -> str | None:
    """An operator's reason as given (None: none), or BadInput past `limit` bytes of UTF-8."""
    if value is None:
        return None
    size = len(value.encode("utf-8", "replace"))
    if size > limit:
        raise BadInput(f"the reason is {size} bytes, over {limit}; say it in a few sentences")
    return value


def journal_text(value: str | None) -> str | None:
    """Text a refusal journals (a target, an error), cut at JOURNAL_TEXT_MAX characters."""
    if value is None or len(value) <= JOURNAL_TEXT_MAX:
        return value
    return value[: JOURNAL_TEXT_MAX - 1] + "…"
