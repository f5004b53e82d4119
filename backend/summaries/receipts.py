"""Summary receipts: the durable record of exactly what synthesis wrote to a Chroma row.

A receipt holds the summary document, the metadata keys synthesis owns
(`ownership.SYNTHESIS_KEYS`, declared once) and a digest of the embedding
written, nothing else: Dream's lifecycle keys are mutable after staging, so a
receipt that carried them would be stale by construction.

It owns its whole key set: every required owned key is carried (issuance
refuses a receipt without one), and every owned key it does not carry is
attested absent, so a row that carries it anyway is a mismatch that replay
removes. Keys owned by others stay tolerated and untouched.

Envelope v2 (`result_encoding = ENCODING`, "rem.receipt/2+json") is the
canonical JSON (sorted keys, no spaces, UTF-8) of `{"v": 2, "document",
"embedding", "metadata", "sha256"}` where `embedding` records the vector
written (`embedding_digest`: 16 bits per component, compared with Chroma's
float rounding tolerated) and `sha256` covers the
canonical JSON of `{"document", "embedding", "metadata"}`, which is the
envelope's own prefix (sorted keys put `sha256` and `v` last). Decoding
checks that prefix against the checksum and the tail byte for byte, so any
change to the bytes is caught without re-encoding. JSON keeps `1`, `1.0`
and `true` apart, as Chroma does.

Envelope v1 ("rem.receipt/1+json", no `embedding`, only `sessionId` and
`dreamInputRevision` required) is what rem wrote before; it still decodes
and verifies, without the vector comparison.

A row is *present* when its document is equal, every key the receipt
carries is there with a deep-equal, type-equal value, every owned key it
does not carry is absent, and (v2) its vector is the one the receipt
records; other live keys are tolerated.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from backend.chroma.collection import ChromaRow, LiveRow
from backend.chroma.ownership import SYNTHESIS_OWNED_KEYS, SYNTHESIS_REQUIRED_KEYS
from backend.core.errors import ReceiptCorrupt, ReceiptIncomplete, UndeclaredReceiptKey

VERSION = 2
ENCODING = "rem.receipt/2+json"
V1_ENCODING = "rem.receipt/1+json"
ENCODINGS = {V1_ENCODING: 1, ENCODING: 2}
FIELDS = {1: {"v", "document", "metadata", "sha256"}, 2: {"v", "document", "embedding", "metadata", "sha256"}}
# what each envelope version requires: v1 receipts named their session and revision only
REQUIRED_KEYS: dict[int, tuple[str, ...]] = {
    1: ("sessionId", "dreamInputRevision"),
    2: SYNTHESIS_REQUIRED_KEYS,
}
# the embedding record: `q16:` + base64 of a float32 scale and one int16 per component
SKETCH_PREFIX = "q16:"
SKETCH_LEVELS = 32767
# quanta a live vector may stray from the record: rounding to the record costs 0.5, Chroma's
# float32 rounding a few millionths of one
VECTOR_TOLERANCE = 1.0
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
    ATTESTED_ABSENT = "attested_absent"  # an owned key the receipt does not carry is on the row
    VECTOR_DIFFERS = "vector_differs"  # the `embedding` pseudo-key: the row's vector is not the one written


# the pseudo-key a vector difference is reported under (no metadata key of that name is owned)
EMBEDDING_KEY = "embedding"

# a row read without its vector, or with it (`ChromaStore.rows`): the vector is compared when read
Row = ChromaRow | LiveRow
_SCALARS = (str, int, float, bool)
_OWNED = frozenset(SYNTHESIS_OWNED_KEYS)


@dataclass(frozen=True)
class Receipt:
    """What synthesis wrote: the exact document, its owned metadata and its vector's digest."""

    document: str
    metadata: dict[str, Any]
    # `embedding_digest` of the vector written (None in a v1 receipt, which predates it)
    embedding: str | None = None
    version: int = VERSION

    @property
    def attested_absent(self) -> tuple[str, ...]:
        """The owned keys this receipt does not carry: the row must not carry them either."""
        return tuple(key for key in SYNTHESIS_OWNED_KEYS if key not in self.metadata)

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


def _as_floats(vector: Any) -> Any:
    # import time: numpy, chromadb's own dependency: `rem send` never pays for it
    import numpy

    return numpy.asarray(vector, dtype=numpy.float32).astype(numpy.float64)


def embedding_digest(vector: Any) -> str:
    """The receipt's record of a vector: `q16:` + base64 of its scale and its components in 16 bits.

    Not a hash, on purpose: Chroma (1.5.9, cosine collections) hands back a
    vector up to 2 float32 ulps away from the one written, so an exact hash
    would call a third of all healthy rows tampered. Each component is kept
    to 1/32767 of the largest one instead, and `vector_deviation` compares a
    live vector with that tolerance: Chroma's rounding passes, a replaced
    vector does not. Takes a list of floats or the numpy array chromadb
    returns; `rem reindex` calls this too when it re-embeds a row.
    """
    # import time: numpy, chromadb's own dependency: `rem send` never pays for it
    import numpy

    values = _as_floats(vector)
    if values.ndim != 1 or values.size == 0 or not numpy.all(numpy.isfinite(values)):
        raise ReceiptIncomplete("a receipt's embedding must be a non-empty vector of finite numbers")
    scale = float(numpy.max(numpy.abs(values)))
    levels = numpy.zeros(values.size) if scale == 0 else numpy.rint(values / scale * SKETCH_LEVELS)
    raw = struct.pack("<f", scale) + levels.astype("<i2").tobytes()
    return SKETCH_PREFIX + base64.b64encode(raw).decode("ascii")


def vector_deviation(digest: str, vector: Any) -> float:
    """How far `vector` lies from the one `digest` records, in quanta (<= 1: the same vector).

    Runs for every receipt of a verification sweep: four numpy operations, no copies of the record.
    """
    # import time: numpy, chromadb's own dependency: `rem send` never pays for it
    import numpy

    raw = base64.b64decode(digest[len(SKETCH_PREFIX) :])
    scale = float(struct.unpack_from("<f", raw)[0])
    levels = numpy.frombuffer(raw, dtype="<i2", offset=4)
    values = vector if getattr(vector, "dtype", None) == numpy.float64 else _as_floats(vector)
    if values.shape != levels.shape:
        return math.inf
    if scale == 0:
        return 0.0 if not numpy.any(values) else math.inf
    deviation = float(numpy.max(numpy.abs(values * (SKETCH_LEVELS / scale) - levels)))
    return deviation if math.isfinite(deviation) else math.inf


def embedding_matches(digest: str, vector: Any) -> bool:
    """True when `vector` is the one `digest` records, up to Chroma's float rounding."""
    return vector_deviation(digest, vector) <= VECTOR_TOLERANCE


def _metadata_problem(
    metadata: Mapping[str, Any], version: int = VERSION
) -> tuple[type[Exception], str] | None:
    undeclared = metadata.keys() - _OWNED
    if undeclared:
        return UndeclaredReceiptKey, (
            f"receipt keys {sorted(undeclared)} are not synthesis-owned; declared keys are "
            f"{list(SYNTHESIS_OWNED_KEYS)} (backend/chroma/ownership.py)"
        )
    required = REQUIRED_KEYS[version]
    missing = [k for k in required if k not in metadata]
    if missing:
        return ReceiptIncomplete, (
            f"a receipt must carry every required synthesis-owned key {list(required)}; missing {missing} "
            "(the synthesizer left them out)"
        )
    problem = _first_value_problem(metadata)
    return None if problem is None else (ReceiptIncomplete, problem)


def _first_value_problem(metadata: Mapping[str, Any]) -> str | None:
    """What is wrong with the first value Chroma cannot store (None: every value can be stored)."""
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
            return f"receipt key {key!r} is {problem}"
    return None


def issue(document: str, metadata: Mapping[str, Any], *, embedding: Sequence[float]) -> Receipt:
    """A receipt for what synthesis writes (`embedding`: the vector written with it).

    Refuses a key synthesis does not own, a missing required key and a value
    Chroma cannot store, before anything is staged.
    """
    if not isinstance(document, str):
        raise ReceiptIncomplete(f"a receipt document must be text, not {type(document).__name__}")
    problem = _metadata_problem(metadata)
    if problem is not None:
        raise problem[0](problem[1])
    if len(embedding) == 0:
        raise ReceiptIncomplete(
            "a receipt needs the embedding written with its document; got an empty vector"
        )
    return _encodable(
        Receipt(document=document, metadata=_copy(dict(metadata)), embedding=embedding_digest(embedding))
    )


def _encodable(receipt: Receipt) -> Receipt:
    """`receipt`, once it is known to encode (ReceiptIncomplete if its text is not valid Unicode)."""
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


def _body(receipt: Receipt) -> dict[str, Any]:
    body: dict[str, Any] = {"document": receipt.document, "metadata": receipt.metadata}
    if receipt.version >= 2:
        body["embedding"] = receipt.embedding
    return body


def encode(receipt: Receipt) -> bytes:
    """The envelope bytes of a receipt, in its own version (deterministic: equal receipts, equal bytes)."""
    body = _body(receipt)
    return _canonical({**body, "v": receipt.version, "sha256": hashlib.sha256(_canonical(body)).hexdigest()})


def encoding_of(receipt: Receipt) -> str:
    """The `result_encoding` that names a receipt's envelope version."""
    return ENCODING if receipt.version == 2 else V1_ENCODING


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


def _check_integrity(raw: bytes, checksum: Any, version: int) -> None:
    """The bytes are exactly `<body without "}">,"sha256":"<hex>","v":N}` and the hex covers the body.

    In the canonical form the sorted keys put `sha256` and `v` last, so the
    checksummed body is a prefix of the envelope: no re-encoding is needed,
    and any changed, added or removed byte anywhere is caught.
    """
    if not isinstance(checksum, str) or len(checksum) != 64:
        raise ReceiptCorrupt("receipt envelope checksum is malformed")
    tail = b',"sha256":"' + checksum.encode("ascii", "replace") + b'","v":%d}' % version
    if not raw.endswith(tail):
        raise ReceiptCorrupt("receipt envelope is not in canonical form (bytes were altered)")
    body = raw[: len(raw) - len(tail)] + b"}"
    if hashlib.sha256(body).hexdigest() != checksum:
        raise ReceiptCorrupt("receipt envelope checksum does not match its content")


def _sound_sketch(digest: str) -> bool:
    """A `q16:` record of a float32 scale and at least one int16 component (strict base64)."""
    if not digest.startswith(SKETCH_PREFIX):
        return False
    try:
        size = len(base64.b64decode(digest[len(SKETCH_PREFIX) :], validate=True))
    except ValueError:
        return False
    return size >= 6 and size % 2 == 0


def decode(blob: Any, encoding: str | None = None) -> Receipt:
    """The receipt in a v1 or v2 envelope; raises ReceiptCorrupt for anything else.

    `encoding` is the row's `result_encoding`; None reads the version from the envelope.
    """
    if encoding is not None and encoding not in ENCODINGS:
        raise ReceiptCorrupt(f"unknown receipt encoding {encoding!r} (this rem reads {sorted(ENCODINGS)})")
    raw = _as_bytes(blob)
    parsed = _parse(raw)
    version = parsed.get("v")
    if type(version) is not int or version not in FIELDS:
        raise ReceiptCorrupt(f"unknown receipt version {version!r} (this rem reads {sorted(FIELDS)})")
    if encoding is not None and ENCODINGS[encoding] != version:
        raise ReceiptCorrupt(f"receipt envelope says v{version} but its encoding is {encoding!r}")
    if parsed.keys() != FIELDS[version]:
        raise ReceiptCorrupt(
            f"receipt envelope has fields {sorted(parsed)}, expected {'/'.join(sorted(FIELDS[version]))}"
        )
    document, metadata, digest = parsed["document"], parsed["metadata"], parsed.get("embedding")
    if not isinstance(document, str) or not isinstance(metadata, dict):
        raise ReceiptCorrupt("receipt envelope document is not text or its metadata is not an object")
    if version >= 2 and not (isinstance(digest, str) and _sound_sketch(digest)):
        raise ReceiptCorrupt("receipt envelope embedding digest is not a q16: vector record")
    _check_integrity(raw, parsed["sha256"], version)
    problem = _metadata_problem(metadata, version)
    if problem is not None:
        raise ReceiptCorrupt(f"receipt envelope metadata is unsound: {problem[1]}")
    return Receipt(document=document, metadata=metadata, embedding=digest, version=version)


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


def _vector_of(row: Row) -> Any:
    """The row's embedding, when it was read with one (a 3-tuple); None otherwise."""
    return row[2] if len(row) > 2 else None


def is_present(receipt: Receipt, row: Row | None) -> bool:
    """True when the row carries the receipt's document and every owned key, type-equal, no
    owned key the receipt attests absent, and (when read) the vector the receipt attests."""
    if row is None:
        return False
    document, live = row[0], row[1]
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
    if any(key in live for key in receipt.attested_absent):
        return False
    vector = _vector_of(row)
    return receipt.embedding is None or vector is None or embedding_matches(receipt.embedding, vector)


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
            "expected_type": None if self.reason == KeyReason.ATTESTED_ABSENT else _type_name(self.expected),
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


def _differences(receipt: Receipt, row: Row) -> tuple[KeyDifference, ...]:
    live = row[1] or {}
    keys = [d for k, v in receipt.metadata.items() if (d := _key_difference(k, v, live))]
    keys += [
        KeyDifference(key=k, reason=KeyReason.ATTESTED_ABSENT, expected=None, actual=live[k])
        for k in receipt.attested_absent
        if k in live
    ]
    vector = _vector_of(row)
    if receipt.embedding is not None and vector is not None:
        deviation = vector_deviation(receipt.embedding, vector)
        if deviation > VECTOR_TOLERANCE:
            dim = (len(base64.b64decode(receipt.embedding[len(SKETCH_PREFIX) :])) - 4) // 2
            actual = "another vector" if math.isinf(deviation) else f"{deviation:.3g} quanta away"
            written = f"the {dim}-dim vector written"
            keys.append(
                KeyDifference(
                    key=EMBEDDING_KEY, reason=KeyReason.VECTOR_DIFFERS, expected=written, actual=actual
                )
            )
    return tuple(keys)


def verify(receipt: Receipt, row: Row | None) -> Verdict:
    """Classify a live row against a receipt, naming every owned key (and the vector) that differs, and how."""
    if row is None:
        return Verdict(verdict=ReceiptVerdict.MISSING)
    if is_present(receipt, row):
        return Verdict(verdict=ReceiptVerdict.PRESENT)
    keys = _differences(receipt, row)
    document = row[0]
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
