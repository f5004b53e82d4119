"""Opaque page cursors: where a list resumes, handed to a client that hands it back unread.

A cursor is base64url (no padding) of a compact JSON object: the list it belongs to, a digest of
the filter it was made under, and the sort key of the last row given. A client must not build
or edit one (the shape may change); one that was not made by this list, under this filter,
is refused in one line that says to start again without it. It names a position, never a
permission: every page is read again under the caller's projects, so a forged cursor only
moves where a scan starts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any

from backend.core.errors import BadInput

# a cursor rem makes is under 200 characters; anything longer is refused before it is decoded
MAX_CURSOR_CHARS = 512


def filter_digest(*parts: Any) -> str:
    """A short digest of a list's filter: a cursor made under another filter is refused."""
    raw = json.dumps(parts, separators=(",", ":"), sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


def encode_cursor(kind: str, digest: str, key: list[Any]) -> str:
    """The cursor after a row whose sort key is `key`, in list `kind` under filter `digest`."""
    raw = json.dumps({"l": kind, "f": digest, "k": key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str, kind: str, digest: str, types: tuple[type, ...]) -> list[Any]:
    """The sort key a cursor of list `kind` holds (one value of each of `types`), or BadInput."""
    bad = BadInput(
        f"cursor {cursor[:40]!r} is not one this list gave; drop it to start again from the first page"
    )
    if not isinstance(cursor, str) or not cursor or len(cursor) > MAX_CURSOR_CHARS:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        decoded = json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError):
        raise bad from None
    if not isinstance(decoded, dict) or set(decoded) != {"l", "f", "k"} or decoded["l"] != kind:
        raise bad
    key = decoded["k"]
    if not isinstance(key, list) or len(key) != len(types):
        raise bad
    # bool is an int in Python: a key of `true` is not a time
    if any(isinstance(v, bool) or not isinstance(v, t) for v, t in zip(key, types, strict=True)):
        raise bad
    if decoded["f"] != digest:
        raise BadInput(
            f"cursor {cursor[:40]!r} was given for another filter; repeat the query it came from, "
            "or drop it to start again"
        )
    return key
