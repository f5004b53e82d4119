"""The status history store: recording, seeking, incidents, retention, thinning and the size bound."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from backend import ops
from backend.core import clock
from backend.core.errors import NotFound, UsageError
from backend.ops import timeline
from backend.runtime.context import Context
from backend.store.history import DAY_MS, HistoryStore
from tests.tui import scenes

T0 = 1_800_000_000_000


def _record(
    history: HistoryStore, time: int, alerts: list[str] = (), reason: str = "interval", **extra: Any
) -> Any:  # type: ignore[assignment]
    return history.record(
        time=time,
        reason=reason,
        last_event_id=time // 1000,
        alerts=list(alerts),
        snapshot={"n": time, **extra},
    )


@pytest.fixture
def history(tmp_path: Path) -> HistoryStore:
    store = HistoryStore.open(tmp_path)
    yield store  # type: ignore[misc]
    store.close()


def test_the_file_is_private_and_a_reader_never_creates_it(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="`rem up` records it"):
        HistoryStore.open(tmp_path, read_only=True)
    assert not (tmp_path / "history.db").exists()
    HistoryStore.open(tmp_path).close()
    assert stat.S_IMODE(os.stat(tmp_path / "history.db").st_mode) == 0o600


def test_seek_at_step_and_position(history: HistoryStore) -> None:
    for i in range(5):
        _record(history, T0 + i * 5_000)
    entry = history.at(T0 + 12_000)
    assert entry is not None and entry.time == T0 + 10_000 and entry.snapshot == {"n": T0 + 10_000}
    assert history.position(entry.time, entry.id) == (3, 5)
    forward = history.step(entry.time, entry.id, 1)
    back = history.step(entry.time, entry.id, -1)
    assert forward is not None and forward.time == T0 + 15_000
    assert back is not None and back.time == T0 + 5_000
    last = history.at(T0 + 10 * DAY_MS)
    assert last is not None and history.step(last.time, last.id, 1) is None
    first = history.at(T0 - 1)  # before the history: the first snapshot
    assert first is not None and first.time == T0


def test_an_incident_starts_when_an_alert_appears_or_an_operator_acts(history: HistoryStore) -> None:
    assert not _record(history, T0)["incident"]
    assert _record(history, T0 + 1_000, ["RemLeaseDeadOwner"])["incident"]
    assert not _record(history, T0 + 2_000, ["RemLeaseDeadOwner"])["incident"]  # still the same one
    assert _record(history, T0 + 3_000, ["RemLeaseDeadOwner", "RemChromaDown"])["incident"]
    assert _record(history, T0 + 4_000, [], reason="operator.release")["incident"]
    assert not _record(history, T0 + 5_000)["incident"]
    start = history.at(T0 + 5_000)
    assert start is not None
    found = []
    entry = history.incident(start.time, -1)
    while entry is not None:
        found.append(entry.time)
        entry = history.incident(entry.time, -1)
    assert found == [T0 + 4_000, T0 + 3_000, T0 + 1_000]
    assert history.bounds()["incidents"] == 3


def test_retention_thinning_and_the_size_bound(history: HistoryStore) -> None:
    now = T0 + 10 * DAY_MS
    # one snapshot every 10 s for the last 3 minutes of day -8 .. and the last two days
    for day in (8, 2):
        for i in range(18):
            _record(
                history, now - day * DAY_MS + i * 10_000, reason="operator.drain" if i == 5 else "interval"
            )
    for i in range(12):
        _record(history, now - 60_000 + i * 5_000)
    result = history.prune(now=now, retention_ms=7 * DAY_MS, max_bytes=10**9)
    assert result["expired"] == 18  # day -8 is past the 7-day retention
    # day -2 is older than a day: one per minute is kept, and the operator action too
    kept_old = [
        t
        for (t,) in history._query("SELECT time FROM snapshot WHERE time < ? ORDER BY time", (now - DAY_MS,))
    ]
    assert len(kept_old) == 3 + 1 and result["thinned"] == 18 - 4
    assert history.bounds()["count"] == 4 + 12  # the last day untouched
    # the size bound drops the oldest first until the live pages fit
    big = os.urandom(200_000).hex()
    for i in range(10):
        _record(history, now + i, blob=big)
    history.prune(now=now + 100, retention_ms=7 * DAY_MS, max_bytes=1_000_000)
    assert history.used_bytes() <= 1_000_000
    newest = history.at(now + 100)
    assert newest is not None and newest.time == now + 9


async def test_a_recorded_moment_is_the_compact_snapshot_plus_the_journal_around_it(
    tmp_path: Path,
) -> None:
    clock.set_clock(clock.FrozenClock(scenes.NOW))
    try:
        data = scenes.build(tmp_path / "data", scenes.incident)
        ctx = Context(data, read_only=True, start_chroma=False)
        history = HistoryStore.open(tmp_path / "data")
        result = await timeline.record(ctx, history, "interval")
        entry = history.at(scenes.NOW)
        assert entry is not None and result["id"] == entry.id
        assert "RemLeaseDeadOwner" in entry.alerts and "RemRecoveryParked" in entry.alerts
        assert (
            "events" not in entry.snapshot and entry.snapshot["totals"] == (await ops.status(ctx))["totals"]
        )
        moment = await timeline.seek(ctx, history, "at", scenes.NOW)
        assert moment is not None and moment["recorded"]["index"] == 1
        ids = [e["id"] for e in moment["events"]]
        assert ids == sorted(ids, reverse=True) and max(ids) <= moment["recorded"]["last_event_id"]
        history.close()
        await ctx.close()
    finally:
        clock.set_clock(None)


def test_compact_caps_every_list_and_drops_receipt_details() -> None:
    snapshot = {
        "leases": [{"id": i} for i in range(1000)],
        "receipts": {"mismatched": [{"id": 1, "detail": {"x": "y" * 1000}, "keys": []}]},
        "events": [{"id": 1}],
        "counts": {"sessions": 5},
    }
    out = timeline.compact(snapshot, rows=10)
    assert len(out["leases"]) == 10 and "events" not in out
    assert out["receipts"]["mismatched"] == [{"id": 1, "keys": []}]
    assert out["counts"] == {"sessions": 5}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("-15m", T0 - 15 * 60_000),
        ("-90s", T0 - 90_000),
        ("1799999000000", 1_799_999_000_000),
        ("2027-01-15T07:00:00+00:00", T0 - 3_600_000),
        ("2027-01-15T07:00:00Z", T0 - 3_600_000),
    ],
)
def test_parse_time(text: str, expected: int) -> None:
    assert timeline.parse_time(text, now=T0) == expected


def test_parse_time_refuses_what_is_not_a_time() -> None:
    with pytest.raises(UsageError, match="is not a time"):
        timeline.parse_time("teatime", now=T0)


def test_a_clock_time_means_today_or_yesterday(monkeypatch: pytest.MonkeyPatch) -> None:
    import time as _time

    monkeypatch.setenv("TZ", "UTC")
    _time.tzset()
    try:
        now = 1_800_000_000_000  # 2027-01-15 08:00:00 UTC
        assert timeline.parse_time("07:30", now=now) == now - 30 * 60_000
        assert timeline.parse_time("09:00:05", now=now) == now + 3_605_000 - DAY_MS
    finally:
        monkeypatch.delenv("TZ")
        _time.tzset()
