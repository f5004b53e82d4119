"""The status records describe what `ops.status` returns: every key, every value's type.

Parts of the snapshot are built in place for speed and cast to their record
type; this walks a real snapshot (every panel populated) against the
TypedDicts in `backend.ops.records`, so a record and its builder cannot drift
apart silently.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any, NotRequired, Union, get_args, get_origin, get_type_hints, is_typeddict

import pytest

from backend import ops
from backend.core import clock
from backend.ops.records import Status
from backend.runtime.context import Context
from tests.cli.test_status_golden import every_kind_of_row
from tests.tui import scenes


def problems(value: Any, tp: Any, path: str) -> list[str]:
    """Where `value` is not a `tp` (empty when it is)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return []
    if origin in (Union, types.UnionType):
        found = [problems(value, option, path) for option in args]
        return [] if any(not p for p in found) else [f"{path}: {value!r} is none of {tp}"]
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not a {tp.__name__}"]
        # NotRequired read from the hints: with postponed annotations Python 3.11's
        # __required_keys__ counts a NotRequired key as required
        marked = get_type_hints(tp, include_extras=True)
        optional = {k for k, hint in marked.items() if get_origin(hint) is NotRequired}
        hints = get_type_hints(tp)
        out = [f"{path}: missing {k}" for k in tp.__required_keys__ - optional - value.keys()]
        out += [f"{path}: undeclared {k}" for k in value.keys() - hints.keys()]
        for key in value.keys() & hints.keys():
            out += problems(value[key], hints[key], f"{path}.{key}")
        return out
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        return [p for i, item in enumerate(value) for p in problems(item, args[0], f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: not a dict"]
        return [
            p
            for k, v in value.items()
            for p in problems(k, args[0], f"{path} key {k!r}") + problems(v, args[1], f"{path}[{k!r}]")
        ]
    if tp is None or tp is type(None):
        return [] if value is None else [f"{path}: {value!r} is not None"]
    if isinstance(tp, type) and issubclass(tp, Enum):
        return [] if isinstance(value, tp) else [f"{path}: {value!r} is not a {tp.__name__} member"]
    if tp in (int, bool):
        return [] if type(value) is tp else [f"{path}: {value!r} is not {tp.__name__}"]
    return [] if isinstance(value, tp) else [f"{path}: {value!r} is not {tp.__name__}"]


@pytest.fixture
def incident_ctx(tmp_path: Path) -> Iterator[Context]:
    clock.set_clock(clock.FrozenClock(scenes.NOW))
    data = scenes.build(tmp_path / "data", scenes.incident, every_kind_of_row)
    yield Context(data, read_only=True, start_chroma=False)
    clock.set_clock(None)


async def test_the_status_snapshot_is_exactly_its_records(incident_ctx: Context) -> None:
    status = await ops.status(incident_ctx)
    try:
        assert all(status[k] for k in ("leases", "dream_drift", "workers", "recent_actions", "events"))
        assert problems(status, Status, "status") == []
    finally:
        await incident_ctx.close()


def test_the_checker_finds_a_wrong_shape() -> None:
    # the walk above proves something only if it can fail
    from backend.ops.records import Counts, LeaseRecord
    from backend.store.workers import LeaseKind

    assert problems({"backlog": 1}, Counts, "c")  # keys missing
    lease = {
        "kind": "execution",
        "id": "e",
        "session_id": "s",
        "owner_id": None,
        "epoch": 1,
        "phase": None,
        "expires_at": 1,
        "owner_state": None,
        "time_left_ms": 0,
        "expired": True,
        "owner_alive": False,
        "parked": None,
    }
    assert problems(lease, LeaseRecord, "l") == ["l.kind: 'execution' is not a LeaseKind member"]
    assert problems({**lease, "kind": LeaseKind.EXECUTION}, LeaseRecord, "l") == []
    assert problems({**lease, "kind": LeaseKind.EXECUTION, "extra": 1}, LeaseRecord, "l") == [
        "l: undeclared extra"
    ]
