"""What a refresh cycle asks of the UI loop besides reading and painting: counted, never timed."""

from __future__ import annotations

from typing import Any

import pytest
from textual.timer import Timer

from backend.core.datadir import DataDir
from tests.tui.test_console import SIZE, console, loaded, until
from tui.widgets.banner import Banner


async def test_a_refresh_the_budget_holds_back_waits_on_a_loop_timer_not_a_textual_one(
    healthy_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Textual `Timer` is a task of its own and its wake-ups; the refresh budget sets one about
    every throttled refresh: it takes the loop's `call_later` instead."""
    made: list[Timer] = []
    init = Timer.__init__

    def counted(timer: Timer, *args: Any, **kwargs: Any) -> None:
        made.append(timer)
        init(timer, *args, **kwargs)

    monkeypatch.setattr(Timer, "__init__", counted)
    app = console(healthy_dir, watch=False, poll_s=3600, health_s=3600, min_interval_s=0.5)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await until(pilot, lambda: app.refresher.idle, "the first refresh ended")
        cycles, made[:] = app.refresher.cycles, []
        for _ in range(3):  # within 0.5 s of the last start: each waits for the timer
            app.request_refresh()
        assert not app.refresher.idle
        await until(pilot, lambda: app.refresher.cycles == cycles + 1 and app.refresher.idle, "the refresh")
        assert made == []


async def test_a_refresh_that_finds_the_same_problems_touches_no_banner(
    healthy_dir: DataDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every refresh reports every source (the database, Chroma, its refusal, the feed): when none
    changed, the banner's classes and text are left alone (each class set is a check and a lookup)."""
    touched: list[str] = []
    set_class = Banner.set_class

    def counted(banner: Banner, add: bool, *names: str, update: bool = True) -> Banner:
        touched.extend(names)
        return set_class(banner, add, *names, update=update)

    monkeypatch.setattr(Banner, "set_class", counted)
    app = console(healthy_dir, watch=False, poll_s=3600, health_s=3600, cpu_share=None)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await until(pilot, lambda: app.refresher.idle, "the first refresh ended")
        touched.clear()
        shown = app.probes.stats["applies"]
        for _ in range(3):
            app.request_refresh(force=True, urgent=True)
            await until(pilot, lambda: app.refresher.idle, "the refresh")
        assert app.probes.stats["applies"] >= shown + 3
        assert touched == []
        app.banner.set_problem("database", "database unreachable")  # a change is still shown
        assert app.banner.has_class("-shown") and touched
