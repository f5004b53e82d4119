"""The console's recall screen, from the palette, over a data dir with real memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.command import CommandList
from textual.widgets import DataTable, Input, Label

from backend import ops
from backend.core.datadir import DataDir
from backend.runtime.context import Context
from tests.backend.test_recall import settle, write_jsonl
from tests.tui.test_console import SIZE, console, loaded, until
from tui.screens.recall import RecallScreen


@pytest.fixture
async def memory_dir(
    data_dir: DataDir, chroma_url: str, collection: str, tmp_path: Path, monkeypatch: Any
) -> DataDir:
    monkeypatch.setenv("REM_CHROMA_COLLECTION", collection)
    ctx = Context(data_dir, chroma_url=chroma_url)
    try:
        await ops.import_file(ctx, write_jsonl(tmp_path / "chats.jsonl"))
        await settle(ctx)
    finally:
        await ctx.close()
    return data_dir


async def test_recall_from_the_palette_shows_ranked_items(memory_dir: DataDir, chroma_url: str) -> None:
    async with console(memory_dir, chroma_url=chroma_url, read_only=True).run_test(size=SIZE) as pilot:
        app = await loaded(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"recall memory")

        def recall_highlighted() -> bool:
            hits = app.screen.query(CommandList)
            index = hits.first().highlighted if hits else None
            return index is not None and hits.first().get_option_at_index(index).hit.text == "Recall memory"

        await until(pilot, recall_highlighted, "the recall command highlighted in the palette")
        await pilot.press("enter")
        screen = await until(
            pilot, lambda: isinstance(app.screen, RecallScreen) and app.screen, "the recall screen"
        )
        screen.query_one("#recall-query", Input).value = "puppy at the seaside"
        screen.query_one("#recall-project", Input).value = "ops"
        screen.query_one("#recall-query", Input).focus()
        await pilot.press("enter")
        items = screen.query_one("#recall-items", DataTable)
        await until(pilot, lambda: items.row_count > 0, "ranked items")
        first = [str(c) for c in items.get_row_at(0)]
        assert (
            first[1] == "turn" and first[3] == "pets" and first[4] == "Maya" and "My dog Biscuit" in first[5]
        )
        kinds = {str(items.get_row_at(i)[1]) for i in range(items.row_count)}
        assert "summary" in kinds
        status = str(screen.query_one("#recall-status", Label).content)
        assert "in project ops" in status and "degraded" not in status
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, RecallScreen), "the screen closed")
