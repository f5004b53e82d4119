"""Fixtures for the console tests: deterministic data dirs, UTC, a console factory."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.core import clock
from backend.core.datadir import DataDir
from tests.tui import scenes


@pytest.fixture(autouse=True)
def _utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Wall-clock columns render in UTC so snapshots match on every machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.delenv("TZ", raising=False)
    time.tzset()


@pytest.fixture
def clock_at_scene() -> Iterator[clock.FrozenClock]:
    frozen = clock.FrozenClock(scenes.NOW)
    clock.set_clock(frozen)
    yield frozen
    clock.set_clock(None)


@pytest.fixture
def incident_dir(tmp_path: Path, clock_at_scene: clock.FrozenClock) -> DataDir:
    """Every panel populated: a killed executor, mismatched receipts, Dream drift."""
    return scenes.build(tmp_path / "data", scenes.incident)


@pytest.fixture
def healthy_dir(tmp_path: Path, clock_at_scene: clock.FrozenClock) -> DataDir:
    return scenes.build(tmp_path / "data", scenes.healthy)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Pilot tests share two cores with other suites: give each a generous timeout (unless it names its own).
    for item in items:
        if (
            "tests/tui" in str(item.fspath).replace(os.sep, "/")
            and item.get_closest_marker("timeout") is None
        ):
            item.add_marker(pytest.mark.timeout(120))
