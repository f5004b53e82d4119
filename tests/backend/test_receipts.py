"""Receipt envelopes and the ownership-aware match (pure functions, no I/O)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.chroma.ownership import DREAM_OWNED_KEYS, SYNTHESIS_OWNED_KEYS
from backend.core.errors import ReceiptCorrupt, ReceiptIncomplete, UndeclaredReceiptKey
from backend.summaries import receipts
from tests.summaries import base_metadata

DOC = "Restarting the payments service.\nuser: how do I restart it?"


def _receipt(**extra: Any) -> receipts.Receipt:
    return receipts.issue(DOC, base_metadata("s1", **extra))


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
        receipts.issue(DOC, {**base_metadata("s1"), key: True})


@pytest.mark.parametrize(
    "value", [None, [], [1, "a"], [[1]], float("nan"), float("inf"), 2**64, {"a": 1}, b"x"]
)
def test_issuance_refuses_values_chroma_cannot_store(value: Any) -> None:
    with pytest.raises(ReceiptIncomplete, match="title"):
        receipts.issue(DOC, {**base_metadata("s1"), "title": value})


def test_issuance_requires_the_session_and_revision() -> None:
    metadata = base_metadata("s1")
    del metadata["dreamInputRevision"]
    with pytest.raises(ReceiptIncomplete, match="dreamInputRevision"):
        receipts.issue(DOC, metadata)


def _body(**changes: Any) -> bytes:
    envelope = json.loads(receipts.encode(_receipt()))
    envelope.update(changes)
    return json.dumps(envelope, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _rechecksummed(document: str, metadata: dict[str, Any], version: Any = 1) -> bytes:
    checksum = receipts._checksum(document, metadata)
    return receipts._canonical({"v": version, "document": document, "metadata": metadata, "sha256": checksum})


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
        (_body(v=2), "unknown receipt version 2"),
        (_body(v=True), "unknown receipt version True"),
        (_body(v="1"), "unknown receipt version"),
        (_body(sha256="0" * 64), "checksum"),
        (_body(extra=1), "fields"),
        (_body(document=7), "not text"),
        (_rechecksummed(DOC, {**base_metadata("s1"), "graphDigested": True}), "not synthesis-owned"),
        (_rechecksummed(DOC, base_metadata("s1"), version=9), "unknown receipt version 9"),
        (receipts.encode(_receipt()) + b" ", "canonical"),
        (b" " + receipts.encode(_receipt()), "checksum does not match"),
        (receipts.encode(_receipt()).replace(b'"v":1}', b'"v": 1}'), "canonical"),
        (_body(sha256="abc"), "checksum is malformed"),
    ],
)
def test_decoding_rejects_bad_envelopes(blob: Any, message: str) -> None:
    with pytest.raises(ReceiptCorrupt, match=message):
        receipts.decode(blob)


def test_decoding_rejects_an_unknown_encoding_label() -> None:
    with pytest.raises(ReceiptCorrupt, match="encoding"):
        receipts.decode(receipts.encode(_receipt()), "rem.receipt/9+cbor")


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
    {"sessionId": st.text(min_size=1, max_size=20), "dreamInputRevision": st.text(min_size=1, max_size=80)},
    optional={
        k: st.one_of(scalars, lists)
        for k in SYNTHESIS_OWNED_KEYS
        if k not in ("sessionId", "dreamInputRevision")
    },
)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), metadata_strategy)
def test_every_issuable_receipt_round_trips_type_exactly(document: str, metadata: dict[str, Any]) -> None:
    receipt = receipts.issue(document, metadata)
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
    written = receipts.chroma_metadata(receipts.issue(DOC, metadata))
    assert written["keywords"] is None
    assert set(written) == set(SYNTHESIS_OWNED_KEYS)
