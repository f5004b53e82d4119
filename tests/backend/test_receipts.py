"""Receipt envelopes and the ownership-aware match (pure functions, no I/O)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.chroma.ownership import DREAM_OWNED_KEYS, SYNTHESIS_OWNED_KEYS, SYNTHESIS_REQUIRED_KEYS
from backend.core.errors import ReceiptCorrupt, ReceiptIncomplete, UndeclaredReceiptKey
from backend.summaries import receipts
from tests.summaries import base_metadata

DOC = "Restarting the payments service.\nuser: how do I restart it?"
VECTOR = [0.1, -0.25, 0.5, 1 / 3]
# an envelope exactly as rem wrote it before v2 (no embedding digest, only session and revision required)
V1_ENVELOPE = (
    b'{"document":"Restarting the payments service.","metadata":{"dreamInputRevision":"sha256:'
    + b"ab" * 32
    + b'","memoryCount":6,"sessionId":"s1","title":"Restart plan"},"sha256":'
    b'"cc2cdd93d04518bd69b6f364af065af0f2c5eeb4f2fb7f97ac60aaa6d83da923","v":1}'
)


def _receipt(**extra: Any) -> receipts.Receipt:
    return receipts.issue(DOC, base_metadata("s1", **extra), embedding=VECTOR)


def test_envelope_round_trips_exactly_and_deterministically() -> None:
    receipt = _receipt()
    envelope = receipts.encode(receipt)
    decoded = receipts.decode(envelope, receipts.ENCODING)
    assert decoded == receipt
    assert receipts.encode(decoded) == envelope
    assert json.loads(envelope)["v"] == receipts.VERSION


def test_types_survive_the_envelope() -> None:
    receipt = _receipt(memoryCount=6, timestamp=1.5, title="t", keywords=["a", "b"])
    decoded = receipts.decode(receipts.encode(receipt))
    assert type(decoded.metadata["memoryCount"]) is int
    assert type(decoded.metadata["timestamp"]) is float


@pytest.mark.parametrize("key", DREAM_OWNED_KEYS + ("somethingElse",))
def test_issuance_refuses_keys_synthesis_does_not_own(key: str) -> None:
    with pytest.raises(UndeclaredReceiptKey, match=key):
        receipts.issue(DOC, {**base_metadata("s1"), key: True}, embedding=VECTOR)


@pytest.mark.parametrize(
    "value", [None, [], [1, "a"], [[1]], float("nan"), float("inf"), 2**64, {"a": 1}, b"x"]
)
def test_issuance_refuses_values_chroma_cannot_store(value: Any) -> None:
    with pytest.raises(ReceiptIncomplete, match="title"):
        receipts.issue(DOC, {**base_metadata("s1"), "title": value}, embedding=VECTOR)


@pytest.mark.parametrize("key", SYNTHESIS_REQUIRED_KEYS)
def test_issuance_refuses_a_receipt_missing_any_required_owned_key(key: str) -> None:
    metadata = base_metadata("s1")
    del metadata[key]
    with pytest.raises(ReceiptIncomplete, match=f"missing \\['{key}'\\]"):
        receipts.issue(DOC, metadata, embedding=VECTOR)


def test_the_declared_key_set_requires_all_but_keywords() -> None:
    assert set(SYNTHESIS_OWNED_KEYS) - set(SYNTHESIS_REQUIRED_KEYS) == {"keywords"}
    metadata = base_metadata("s1")
    del metadata["keywords"]
    assert receipts.issue(DOC, metadata, embedding=VECTOR).attested_absent == ("keywords",)


def test_issuance_needs_the_vector_written() -> None:
    with pytest.raises(ReceiptIncomplete, match="embedding"):
        receipts.issue(DOC, base_metadata("s1"), embedding=[])


def _body(**changes: Any) -> bytes:
    envelope = json.loads(receipts.encode(_receipt()))
    envelope.update(changes)
    return json.dumps(envelope, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _rechecksummed(document: str, metadata: dict[str, Any], version: Any = 2) -> bytes:
    body = {"document": document, "metadata": metadata, "embedding": receipts.embedding_digest(VECTOR)}
    checksum = hashlib.sha256(receipts._canonical(body)).hexdigest()
    return receipts._canonical({**body, "v": version, "sha256": checksum})


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"", "empty"),
        (None, "not bytes"),
        ("", "empty"),
        (b"\xff\xfe\x00", "UTF-8 JSON"),
        (b"{not json", "UTF-8 JSON"),
        (b"[1,2]", "not an object"),
        (b'{"v":1,"v":1}', "fields"),
        (b'{"v":NaN}', "unknown receipt version nan"),
        (_body(v=3), "unknown receipt version 3"),
        (_body(v=1), "fields"),
        (_body(embedding="md5:abc"), "embedding digest"),
        (_body(embedding=None), "embedding digest"),
        (_body(v=True), "unknown receipt version True"),
        (_body(v="1"), "unknown receipt version"),
        (_body(sha256="0" * 64), "checksum"),
        (_body(extra=1), "fields"),
        (_body(document=7), "not text"),
        (_rechecksummed(DOC, {**base_metadata("s1"), "graphDigested": True}), "not synthesis-owned"),
        (_rechecksummed(DOC, base_metadata("s1"), version=9), "unknown receipt version 9"),
        (receipts.encode(_receipt()) + b" ", "canonical"),
        (b" " + receipts.encode(_receipt()), "checksum does not match"),
        (receipts.encode(_receipt()).replace(b'"v":2}', b'"v": 2}'), "canonical"),
        (
            _rechecksummed(DOC, {**base_metadata("s1"), "title": 1}).replace(b'"title":1', b'"title":2'),
            "checksum",
        ),
        (_rechecksummed(DOC, {k: v for k, v in base_metadata("s1").items() if k != "title"}), "missing"),
        (_body(sha256="abc"), "checksum is malformed"),
    ],
)
def test_decoding_rejects_bad_envelopes(blob: Any, message: str) -> None:
    with pytest.raises(ReceiptCorrupt, match=message):
        receipts.decode(blob)


def test_decoding_rejects_an_unknown_encoding_label() -> None:
    with pytest.raises(ReceiptCorrupt, match="encoding"):
        receipts.decode(receipts.encode(_receipt()), "rem.receipt/9+cbor")
    with pytest.raises(ReceiptCorrupt, match="says v2 but its encoding"):
        receipts.decode(receipts.encode(_receipt()), receipts.V1_ENCODING)


def test_new_envelopes_carry_the_version_and_the_vector_digest() -> None:
    receipt = _receipt()
    envelope = json.loads(receipts.encode(receipt))
    assert envelope["v"] == 2 and receipts.encoding_of(receipt) == "rem.receipt/2+json"
    assert envelope["embedding"] == receipts.embedding_digest(VECTOR) == receipt.embedding


def test_a_v1_envelope_still_decodes_and_verifies() -> None:
    receipt = receipts.decode(V1_ENVELOPE, receipts.V1_ENCODING)
    assert (receipt.version, receipt.embedding) == (1, None)
    assert receipts.decode(V1_ENVELOPE, None) == receipt
    assert receipts.encode(receipt) == V1_ENVELOPE  # a v1 receipt stays v1, byte for byte
    row = (receipt.document, {**receipt.metadata, "graphDigested": True}, [9.0, 9.0])
    assert receipts.verify(receipt, row).present  # no digest to compare the vector with
    # a v1 receipt attests the absence of the owned keys it does not carry, too
    late = receipts.verify(receipt, (receipt.document, {**receipt.metadata, "keywords": ["x"]}))
    assert [(k.key, k.reason) for k in late.keys] == [("keywords", "attested_absent")]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_decode_into_a_receipt(blob: bytes) -> None:
    with pytest.raises(ReceiptCorrupt):
        receipts.decode(blob)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_change_to_a_sound_envelope_is_caught(data: st.DataObject) -> None:
    envelope = bytearray(receipts.encode(_receipt()))
    change = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
    at = data.draw(st.integers(0, len(envelope) - 1))
    if change == "flip":
        envelope[at] ^= data.draw(st.integers(1, 255))
    elif change == "truncate":
        del envelope[at:]
    elif change == "insert":
        envelope.insert(at, data.draw(st.integers(0, 255)))
    else:
        del envelope[at]
    with pytest.raises(ReceiptCorrupt):
        receipts.decode(bytes(envelope))


scalars = st.one_of(
    st.text(max_size=20),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)
lists = st.one_of(
    *(
        st.lists(s, min_size=1, max_size=4)
        for s in (
            st.text(max_size=5),
            st.integers(-100, 100),
            st.floats(allow_nan=False, allow_infinity=False),
            st.booleans(),
        )
    )
)
metadata_strategy = st.fixed_dictionaries(
    {k: st.one_of(scalars, lists) for k in SYNTHESIS_REQUIRED_KEYS},
    optional={k: st.one_of(scalars, lists) for k in SYNTHESIS_OWNED_KEYS if k not in SYNTHESIS_REQUIRED_KEYS},
)
vectors = st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), metadata_strategy, vectors)
def test_every_issuable_receipt_round_trips_type_exactly(
    document: str, metadata: dict[str, Any], vector: list[float]
) -> None:
    receipt = receipts.issue(document, metadata, embedding=vector)
    decoded = receipts.decode(receipts.encode(receipt))
    assert decoded.document == document
    assert receipts.strict_equal(metadata, decoded.metadata)
    assert receipts.is_present(receipt, (decoded.document, decoded.metadata))


# -- the ownership-aware predicate -------------------------------------------------


def _row(receipt: receipts.Receipt, **changes: Any) -> tuple[str, dict[str, Any]]:
    metadata = {**receipt.metadata, **changes}
    return receipt.document, {k: v for k, v in metadata.items() if v is not _DELETE}


_DELETE = object()


def test_foreign_keys_on_the_live_row_are_tolerated() -> None:
    receipt = _receipt()
    row = _row(receipt, graphDigested=True, digestState="digested", digestAttempts=2, somethingNew="x")
    assert receipts.is_present(receipt, row)
    assert receipts.verify(receipt, row) == receipts.Verdict(verdict=receipts.ReceiptVerdict.PRESENT)


@pytest.mark.parametrize(
    ("expected", "actual"),
    [
        (1, 1.0),
        (1, True),
        (1.0, True),
        (0, False),
        ("1", 1),
        ([1, 2], [1.0, 2]),
        ([True], [1]),
        (["a"], "a"),
    ],
)
def test_equal_values_of_another_type_do_not_match(expected: Any, actual: Any) -> None:
    receipt = _receipt(memoryCount=expected)
    verdict = receipts.verify(receipt, _row(receipt, memoryCount=actual))
    assert verdict.verdict == receipts.ReceiptVerdict.KEYS_DIFFER
    difference = verdict.keys[0]
    assert (difference.key, difference.expected, difference.actual) == ("memoryCount", expected, actual)
    assert difference.reason in ("type_differs", "value_differs")
    assert verdict.detail()["keys"][0]["expected_type"] != verdict.detail()["keys"][0]["actual_type"]


def test_verdicts_name_what_differs() -> None:
    receipt = _receipt()
    assert receipts.verify(receipt, None).verdict == receipts.ReceiptVerdict.MISSING
    missing_key = receipts.verify(receipt, _row(receipt, title=_DELETE))
    assert missing_key.verdict == receipts.ReceiptVerdict.KEYS_DIFFER
    assert missing_key.detail()["keys"] == [
        {
            "key": "title",
            "reason": "missing",
            "expected": "About s1",
            "actual": None,
            "expected_type": "str",
            "actual_type": None,
        }
    ]
    changed = receipts.verify(receipt, _row(receipt, title="Other", memoryCount=7))
    assert {(k.key, k.reason) for k in changed.keys} == {
        ("title", "value_differs"),
        ("memoryCount", "value_differs"),
    }
    doc = receipts.verify(receipt, (DOC + "!", dict(receipt.metadata)))
    assert doc.verdict == receipts.ReceiptVerdict.DOCUMENT_DIFFERS
    assert doc.document["first_difference_at"] == len(DOC)
    assert doc.keys == ()


def test_a_write_deletes_stale_owned_keys_but_names_no_foreign_key() -> None:
    metadata = base_metadata("s1")
    del metadata["keywords"]
    written = receipts.chroma_metadata(receipts.issue(DOC, metadata, embedding=VECTOR))
    assert written["keywords"] is None
    assert set(written) == set(SYNTHESIS_OWNED_KEYS)


def test_an_owned_key_the_receipt_attests_absent_is_a_mismatch_on_the_row() -> None:
    metadata = base_metadata("s1")
    del metadata["keywords"]  # synthesis found none
    receipt = receipts.issue(DOC, metadata, embedding=VECTOR)
    assert receipts.verify(receipt, (DOC, dict(metadata))).present
    planted = (DOC, {**metadata, "keywords": ["planted"], "graphDigested": True})
    verdict = receipts.verify(receipt, planted)
    assert (
        not receipts.is_present(receipt, planted) and verdict.verdict == receipts.ReceiptVerdict.KEYS_DIFFER
    )
    assert verdict.detail()["keys"] == [
        {
            "key": "keywords",
            "reason": "attested_absent",
            "expected": None,
            "actual": ["planted"],
            "expected_type": None,
            "actual_type": "list[str]",
        }
    ]


def test_a_replaced_vector_is_a_mismatch_and_the_same_vector_is_not() -> None:
    import numpy

    receipt = _receipt()
    stored = numpy.asarray(VECTOR, dtype=numpy.float32)  # what chromadb hands back
    assert receipts.embedding_digest(stored) == receipt.embedding
    assert receipts.verify(receipt, (DOC, dict(receipt.metadata), stored)).present
    replaced = numpy.asarray([v + 1e-3 for v in VECTOR], dtype=numpy.float32)
    verdict = receipts.verify(receipt, (DOC, dict(receipt.metadata), replaced))
    assert verdict.verdict == receipts.ReceiptVerdict.KEYS_DIFFER
    (difference,) = verdict.keys
    assert (difference.key, difference.reason, difference.expected) == (
        "embedding",
        "vector_differs",
        "the 4-dim vector written",
    )
    assert difference.actual.endswith("quanta away")
    assert (
        receipts.verify(receipt, (DOC, dict(receipt.metadata), stored[:3])).keys[0].actual == "another vector"
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(-1, 1, width=32, allow_subnormal=False), min_size=1, max_size=64),
    st.data(),
)
def test_chromas_float_rounding_passes_and_any_real_change_does_not(
    vector: list[float], data: st.DataObject
) -> None:
    import numpy

    digest = receipts.embedding_digest(vector)
    written = numpy.asarray(vector, dtype=numpy.float32)
    # Chroma (cosine) hands back each component up to 2 float32 ulps away
    ulps = numpy.asarray(data.draw(st.lists(st.integers(-2, 2), min_size=len(vector), max_size=len(vector))))
    ulps[written == 0] = 0  # a zero component stays zero (it is scaled, not re-parsed)
    rounded = (written.view(numpy.int32) + ulps.astype(numpy.int32)).view(numpy.float32)
    assert receipts.embedding_matches(digest, rounded.astype(numpy.float64))
    scale = float(numpy.max(numpy.abs(written)))
    if scale > 1e-30:
        at = data.draw(st.integers(0, len(vector) - 1))
        changed = written.astype(numpy.float64)
        changed[at] += scale * data.draw(st.sampled_from([1e-3, -1e-3, 0.5, -2.0]))
        assert not receipts.embedding_matches(digest, changed)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=16))
def test_the_record_is_of_the_float32_vector_whatever_form_it_comes_in(vector: list[float]) -> None:
    import numpy

    with numpy.errstate(over="ignore"):
        as_stored = numpy.asarray(vector, dtype=numpy.float32)
    if not numpy.all(numpy.isfinite(as_stored)):
        return  # a float64 beyond float32's range: no embedder produces it, Chroma could not store it
    assert receipts.embedding_digest(vector) == receipts.embedding_digest(as_stored)
    assert receipts.embedding_digest([float(v) for v in as_stored]) == receipts.embedding_digest(as_stored)
