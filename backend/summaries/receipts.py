"""Summary receipts: the durable record of exactly what synthesis wrote to a Chroma row.

A receipt holds the summary document and the metadata keys synthesis owns
(`ownership.SYNTHESIS_OWNED_KEYS`), nothing else: Dream's lifecycle keys are
mutable after staging, so a receipt that carried them would be stale by
construction (seed 001).

Envelope v1 (`result_encoding = ENCODING`) is the canonical JSON (sorted keys,
no spaces, UTF-8) of `{"v": 1, "document", "metadata", "sha256"}` where
`sha256` covers the canonical JSON of `{"document", "metadata"}`, which is
the envelope's own prefix (sorted keys put `sha256` and `v` last). Decoding
checks that prefix against the checksum and the tail byte for byte, so any
change to the bytes is caught without re-encoding. JSON keeps `1`, `1.0` and
`true` apart, as Chroma does.

A row is *present* when its document is equal and every receipt-owned key is
there with a deep-equal, type-equal value; other live keys are tolerated.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from backend.chroma.collection import ChromaRow
from backend.chroma.ownership import SYNTHESIS_OWNED_KEYS
from backend.core.errors import ReceiptCorrupt, ReceiptIncomplete, UndeclaredReceiptKey

VERSION = 1
ENCODING = "rem.receipt/1+json"
# every receipt names its session and the revision it was made from
REQUIRED_KEYS = ("sessionId", "dreamInputRevision")
INT64 = (-(2**63), 2**63 - 1)


class ReceiptVerdict(StrEnum):
    """A receipt checked against its live Chroma row (`summary_job.verdict`)."""

    PRESENT = "present"  # document equal, every owned key present and type-equal
    MISSING = "missing"  # no row
    DOCUMENT_DIFFERS = "document_differs"
    KEYS_DIFFER = "keys_differ"  # the document is equal; owned keys are missing or differ
    QUARANTINED = "quarantined"  # the envelope itself is corrupt: kept for the operator


# every verdict that is not ReceiptVerdict.PRESENT: the receipt panel's rows
MISMATCHES = tuple(v for v in ReceiptVerdict if v is not ReceiptVerdict.PRESENT)


class KeyReason(StrEnum):
    """How one receipt-owned key differs on the live row."""

    MISSING = "missing"
    TYPE_DIFFERS = "type_differs"  # equal value, other type (`1` vs `1.0` vs `True`)
    VALUE_DIFFERS = "value_differs"


Row = ChromaRow
_SCALARS = (str, int, float, bool)
_OWNED = frozenset(SYNTHESIS_OWNED_KEYS)


@dataclass(frozen=True)
class Receipt:
    """What synthesis wrote: the exact document and its owned metadata."""

    document: str
    metadata: dict[str, Any]

    @property
    def session_id(self) -> str:
        return str(self.metadata["sessionId"])

    @property
    def revision(self) -> str:
        return str(self.metadata["dreamInputRevision"])


def _value_problem(value: Any) -> str | None:
    """Why a value cannot be stored as Chroma metadata, or None when it can."""
    if isinstance(value, list):
        if not value:
            return "an empty list (Chroma refuses them)"
        kinds = {type(v) for v in value}
        if len(kinds) != 1 or isinstance(value[0], list):
            return "a list whose items are not all of one scalar type"
        return next(filter(None, map(_value_problem, value)), None)
    if type(value) not in _SCALARS:
        return f"of type {type(value).__name__} (allowed: str, int, float, bool, or a list of one of them)"
    if type(value) is float and not math.isfinite(value):
        return "not a finite number"
    if type(value) is int and not INT64[0] <= value <= INT64[1]:
        return "an integer outside the 64-bit range"
    return None


def _metadata_problem(metadata: Mapping[str, Any]) -> tuple[type[Exception], str] | None:
    undeclared = metadata.keys() - _OWNED
    if undeclared:
        return UndeclaredReceiptKey, (
            f"receipt keys {sorted(undeclared)} are not synthesis-owned; declared keys are "
            f"{list(SYNTHESIS_OWNED_KEYS)} (backend/ownership.py)"
        )
    missing = [k for k in REQUIRED_KEYS if k not in metadata]
    if missing:
        return ReceiptIncomplete, f"a receipt must carry {list(REQUIRED_KEYS)}; missing {missing}"
    for key, value in metadata.items():
        # scalars are settled inline: decoding runs this for every receipt of a sweep
        kind = type(value)
        if (
            kind is str
            or kind is bool
            or (kind is int and INT64[0] <= value <= INT64[1])
            or (kind is float and math.isfinite(value))
        ):
            continue
        problem = _value_problem(value)
        if problem:
            return ReceiptIncomplete, f"receipt key {key!r} is {problem}"
    return None


def issue(document: str, metadata: Mapping[str, Any]) -> Receipt:
    """A receipt for what synthesis writes; refuses undeclared keys and unstorable values."""
    if not isinstance(document, str):
        raise ReceiptIncomplete(f"a receipt document must be text, not {type(document).__name__}")
    problem = _metadata_problem(metadata)
    if problem is not None:
        raise problem[0](problem[1])
    receipt = Receipt(document, _copy(dict(metadata)))
    try:
        encode(receipt)
    except UnicodeEncodeError as exc:  # e.g. a lone surrogate: not storable as UTF-8
        raise ReceiptIncomplete(f"receipt text is not valid Unicode ({exc.reason})") from None
    return receipt


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return list(value) if isinstance(value, list) else value


def _canonical(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _checksum(document: str, metadata: Mapping[str, Any]) -> str:
    return hashlib.sha256(_canonical({"document": document, "metadata": metadata})).hexdigest()


def encode(receipt: Receipt) -> bytes:
    """The v1 envelope bytes of a receipt (deterministic: equal receipts, equal bytes)."""
    return _canonical(
        {
            "v": VERSION,
            "document": receipt.document,
            "metadata": receipt.metadata,
            "sha256": _checksum(receipt.document, receipt.metadata),
        }
    )


def _parse(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise ReceiptCorrupt("receipt envelope is empty")
    try:
        parsed = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ReceiptCorrupt(f"receipt envelope is not valid UTF-8 JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise ReceiptCorrupt(f"receipt envelope is a JSON {type(parsed).__name__}, not an object")
    return parsed


def _as_bytes(blob: Any) -> bytes:
    if isinstance(blob, str):  # a TEXT value in the BLOB column: judge its UTF-8 bytes
        return blob.encode("utf-8", "surrogatepass")
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ReceiptCorrupt(f"receipt envelope is {type(blob).__name__}, not bytes")
    return bytes(blob)


def _check_integrity(raw: bytes, checksum: Any) -> None:
    """The bytes are exactly `<body without "}">,"sha256":"<hex>","v":1}` and the hex covers the body.

    In the canonical form the sorted keys put `sha256` and `v` last, so the
    checksummed body is a prefix of the envelope: no re-encoding is needed,
    and any changed, added or removed byte anywhere is caught.
    """
    if not isinstance(checksum, str) or len(checksum) != 64:
        raise ReceiptCorrupt("receipt envelope checksum is malformed")
    tail = b',"sha256":"' + checksum.encode("ascii", "replace") + b'","v":1}'
    if not raw.endswith(tail):
        raise ReceiptCorrupt("receipt envelope is not in canonical form (bytes were altered)")
    body = raw[: len(raw) - len(tail)] + b"}"
    if hashlib.sha256(body).hexdigest() != checksum:
        raise ReceiptCorrupt("receipt envelope checksum does not match its content")


def decode(blob: Any, encoding: str | None = ENCODING) -> Receipt:
    """The receipt in an envelope; raises ReceiptCorrupt for anything but a sound v1 envelope."""
    if encoding is not None and encoding != ENCODING:
        raise ReceiptCorrupt(f"unknown receipt encoding {encoding!r} (this rem reads {ENCODING!r})")
    raw = _as_bytes(blob)
    parsed = _parse(raw)
    version = parsed.get("v")
    if type(version) is not int or version != VERSION:
        raise ReceiptCorrupt(f"unknown receipt version {version!r} (this rem reads {VERSION})")
    if parsed.keys() != {"v", "document", "metadata", "sha256"}:
        raise ReceiptCorrupt(
            f"receipt envelope has fields {sorted(parsed)}, expected v/document/metadata/sha256"
        )
    document, metadata = parsed["document"], parsed["metadata"]
    if not isinstance(document, str) or not isinstance(metadata, dict):
        raise ReceiptCorrupt("receipt envelope document is not text or its metadata is not an object")
    _check_integrity(raw, parsed["sha256"])
    problem = _metadata_problem(metadata)
    if problem is not None:
        raise ReceiptCorrupt(f"receipt envelope metadata is unsound: {problem[1]}")
    return Receipt(document, metadata)


# -- the ownership-aware match ---------------------------------------------------


def strict_equal(expected: Any, actual: Any) -> bool:
    """Deep equality that also demands equal types (`1`, `1.0` and `True` all differ)."""
    if type(expected) is not type(actual):
        return False
    if isinstance(expected, list):
        return len(expected) == len(actual) and all(map(strict_equal, expected, actual))
    if isinstance(expected, dict):
        return expected.keys() == actual.keys() and all(
            strict_equal(v, actual[k]) for k, v in expected.items()
        )
    return bool(expected == actual)


def is_present(receipt: Receipt, row: Row | None) -> bool:
    """True when the row carries the receipt's document and every owned key, type-equal."""
    if row is None:
        return False
    document, live = row
    if type(document) is not str or document != receipt.document:
        return False
    for key, expected in receipt.metadata.items():
        if key not in live:
            return False
        actual = live[key]
        if type(actual) is not type(expected):
            return False
        if not (strict_equal(expected, actual) if type(expected) is list else expected == actual):
            return False
    return True


@dataclass(frozen=True, kw_only=True)
class KeyDifference:
    """How one receipt-owned key differs on the live row."""

    key: str
    reason: KeyReason
    expected: Any
    actual: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "reason": self.reason,
            "expected": self.expected,
            "actual": self.actual,
            "expected_type": _type_name(self.expected),
            "actual_type": None if self.reason == KeyReason.MISSING else _type_name(self.actual),
        }


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The outcome of checking one receipt against its live row."""

    verdict: ReceiptVerdict
    keys: tuple[KeyDifference, ...] = ()
    document: dict[str, Any] | None = field(default=None)

    @property
    def present(self) -> bool:
        return self.verdict == ReceiptVerdict.PRESENT

    def detail(self) -> dict[str, Any] | None:
        """The JSON stored in `summary_job.verdict_detail` (None when present)."""
        if self.present:
            return None
        detail: dict[str, Any] = {"verdict": self.verdict, "keys": [k.as_dict() for k in self.keys]}
        if self.document is not None:
            detail["document"] = self.document
        return detail


def _type_name(value: Any) -> str:
    if isinstance(value, list):
        inner = sorted({_type_name(v) for v in value})
        return f"list[{'|'.join(inner)}]"
    return type(value).__name__


def _key_difference(key: str, expected: Any, live: Mapping[str, Any]) -> KeyDifference | None:
    if key not in live:
        return KeyDifference(key=key, reason=KeyReason.MISSING, expected=expected)
    actual = live[key]
    if strict_equal(expected, actual):
        return None
    reason = KeyReason.TYPE_DIFFERS if expected == actual else KeyReason.VALUE_DIFFERS
    return KeyDifference(key=key, reason=reason, expected=expected, actual=actual)


def _document_difference(expected: str, actual: Any) -> dict[str, Any]:
    if not isinstance(actual, str):
        return {"expected_chars": len(expected), "actual_chars": None, "first_difference_at": 0}
    at = next(
        (i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b),
        min(len(expected), len(actual)),
    )
    return {
        "expected_chars": len(expected),
        "actual_chars": len(actual),
        "first_difference_at": at,
        "expected_excerpt": expected[at : at + 60],
        "actual_excerpt": actual[at : at + 60],
    }


def verify(receipt: Receipt, row: Row | None) -> Verdict:
    """Classify a live row against a receipt, naming every owned key that differs and how."""
    if row is None:
        return Verdict(verdict=ReceiptVerdict.MISSING)
    if is_present(receipt, row):
        return Verdict(verdict=ReceiptVerdict.PRESENT)
    document, metadata = row
    live = metadata or {}
    keys = tuple(d for k, v in receipt.metadata.items() if (d := _key_difference(k, v, live)))
    if document != receipt.document:
        return Verdict(
            verdict=ReceiptVerdict.DOCUMENT_DIFFERS,
            keys=keys,
            document=_document_difference(receipt.document, document),
        )
    return Verdict(verdict=ReceiptVerdict.KEYS_DIFFER, keys=keys)


def chroma_metadata(receipt: Receipt) -> dict[str, Any]:
    """The metadata a write of this receipt sends: its owned keys, and None (delete) for owned keys it lacks.

    Chroma merges metadata, so keys owned by others survive; an owned key from
    an older synthesis that this receipt no longer carries is removed.
    """
    metadata: dict[str, Any] = {key: None for key in SYNTHESIS_OWNED_KEYS}
    metadata.update(_copy(receipt.metadata))
    return metadata
