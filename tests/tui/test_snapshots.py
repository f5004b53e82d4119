"""Snapshot tests (pytest-textual-snapshot): the main states, frozen clock, fixed size, UTC.

Update after an intended change with `pytest tests/tui/test_snapshots.py --snapshot-update`
and review the SVGs in tests/tui/__snapshots__/.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from backend import ops
from backend.core.datadir import DataDir
from backend.runtime.context import Context
from tests.tui import scenes
from tui.app import ConsoleApp

SnapCompare = Callable[..., bool]


def fixed_chroma_label(loader: Callable[..., Awaitable[dict[str, Any]]] = ops.status):
    """The real status, with the real Chroma server's random port shown as a fixed one."""

    async def status(ctx: Context, **options: Any) -> dict[str, Any]:
        snap = await loader(ctx, **options)
        if snap.get("chroma", {}).get("url"):
            snap["chroma"]["url"] = "http://127.0.0.1:8000"
        return snap

    return status


def app_for(data: DataDir, **kwargs: Any) -> ConsoleApp:
    # no file watch and no poll: the picture is of one snapshot, taken once
    return ConsoleApp(
        data,
        data_label="demo-data",
        watch=False,
        poll_s=3600,
        health_s=3600,
        cpu_share=None,  # the header's refresh interval: the floor, not what this machine's CPU made it
        status_loader=fixed_chroma_label(),
        **kwargs,
    )


def after(*keys: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    """Wait for the first snapshot (and anything it loads), then press `keys`."""

    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, ConsoleApp)
        for _ in range(400):
            await pilot.pause()
            if app.applied is not None:
                break
            await asyncio.sleep(0.025)
        assert app.applied is not None, "no snapshot within 10 s"
        if keys:
            await pilot.press(*keys)
        for _ in range(40):  # screens that load their own rows (detail) settle
            await pilot.pause(0.025)

    return run_before


@pytest.fixture
def scene_dir(tmp_path: Path, clock_at_scene: Any) -> Callable[..., DataDir]:
    def build(*steps: Callable[[scenes.Scene], None]) -> DataDir:
        return scenes.build(tmp_path / "data", *steps)

    return build


def test_healthy(snap_compare: SnapCompare, scene_dir: Callable[..., DataDir], chroma_url: str) -> None:
    app = app_for(scene_dir(scenes.healthy), chroma_url=chroma_url)
    assert snap_compare(app, terminal_size=(120, 40), run_before=after())


def test_killed_executor_with_expired_lease(
    snap_compare: SnapCompare, scene_dir: Callable[..., DataDir], chroma_url: str
) -> None:
    app = app_for(scene_dir(scenes.healthy, scenes.killed_executor), chroma_url=chroma_url)
    assert snap_compare(app, terminal_size=(120, 40), run_before=after())


def test_receipt_mismatch_detail(snap_compare: SnapCompare, scene_dir: Callable[..., DataDir]) -> None:
    app = app_for(scene_dir(scenes.healthy, scenes.receipt_mismatches))
    assert snap_compare(app, terminal_size=(120, 40), run_before=after("3", "enter"))


def test_dream_drift(snap_compare: SnapCompare, scene_dir: Callable[..., DataDir], chroma_url: str) -> None:
    app = app_for(scene_dir(scenes.healthy, scenes.dream_drift), chroma_url=chroma_url)
    assert snap_compare(app, terminal_size=(120, 40), run_before=after("4"))


def test_release_confirmation(
    snap_compare: SnapCompare, scene_dir: Callable[..., DataDir], chroma_url: str
) -> None:
    app = app_for(scene_dir(scenes.incident), chroma_url=chroma_url)
    assert snap_compare(app, terminal_size=(120, 40), run_before=after("2", "l"))


def test_incident_at_80x24_read_only_paused(
    snap_compare: SnapCompare, scene_dir: Callable[..., DataDir]
) -> None:
    app = app_for(scene_dir(scenes.incident), read_only=True)
    assert snap_compare(app, terminal_size=(80, 24), run_before=after("p"))


def test_timeline_at_the_kill(
    snap_compare: SnapCompare, scene_dir: Callable[..., DataDir], clock_at_scene: Any
) -> None:
    """`rem console --at`: the incident as recorded 5 s after the kill, badged as the past."""
    from backend.ops import timeline
    from backend.store.history import HistoryStore

    data = scene_dir(scenes.healthy)
    history = HistoryStore.open(data.root)

    async def record(reason: str) -> None:
        ctx = Context(data, read_only=True, start_chroma=False)
        try:
            await timeline.record(ctx, history, reason)
        finally:
            await ctx.close()

    scenes._run(record("start"))
    with scenes.Scene(data.root) as scene:
        scenes.killed_executor(scene)
    clock_at_scene.advance(5_000)
    scenes._run(record("interval"))
    history.close()
    app = app_for(data, read_only=True, at=scenes.NOW + 5_000)
    assert snap_compare(app, terminal_size=(120, 40), run_before=after())


def test_held_session_detail_with_usage_and_model_error(
    snap_compare: SnapCompare, scene_dir: Callable[..., DataDir]
) -> None:
    app = app_for(scene_dir(scenes.healthy, scenes.model_trouble))
    assert snap_compare(app, terminal_size=(120, 40), run_before=after("8", "end", "enter"))


def test_kill_confirmation(
    snap_compare: SnapCompare,
    scene_dir: Callable[..., DataDir],
    chroma_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`k` on Backlog's `running` row: its executor (A), its two leases, the send it has running,
    the signal; the effect in flight is the warning. The scene's workers run on ops-1: here, too."""
    monkeypatch.setenv("REM_HOST", "ops-1")
    app = app_for(scene_dir(scenes.incident, scenes.send_in_flight), chroma_url=chroma_url)
    assert snap_compare(app, terminal_size=(120, 40), run_before=after("1", "down", "down", "k"))
