"""Capture `screenshots/recall.svg`: the console's recall screen over a data dir with real memory.

Apart from capture.py because it needs a real Chroma server (started here in a
temp dir and stopped after) and real memory: the chats of the recall tests are
imported, summarized and indexed by Dream, then the read-only console asks
"puppy at the seaside" in project `ops`. Run from the repo root:
`python screenshots/capture_recall.py`.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from textual.widgets import DataTable, Input

from backend import ops
from backend.chroma import server as chroma_server
from backend.core.datadir import DataDir
from backend.runtime.context import Context
from tests.backend.test_recall import settle, write_jsonl
from tests.tui.test_console import until
from tui.app import ConsoleApp
from tui.screens.recall import RecallScreen


async def main(out: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="rem-recall-shot-"))
    data = DataDir(work / "data").ensure()
    server = chroma_server.resolve(data)
    try:
        ctx = Context(data, chroma_url=server.url)
        await ops.import_file(ctx, write_jsonl(work / "chats.jsonl"))
        await settle(ctx)
        await ctx.close()
        app = ConsoleApp(data, chroma_url=server.url, read_only=True, data_label="demo-data")
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.applied is not None, "the first snapshot")
            await app.run_action("recall")
            await until(
                pilot, lambda: isinstance(app.screen, RecallScreen) and app.screen.query("#recall-items")
            )
            screen = app.screen
            screen.query_one("#recall-query", Input).value = "puppy at the seaside"
            screen.query_one("#recall-project", Input).value = "ops"
            screen.query_one("#recall-query", Input).focus()
            await pilot.press("enter")
            items = screen.query_one("#recall-items", DataTable)
            await until(pilot, lambda: items.row_count > 0, "ranked items", timeout=60.0)
            await pilot.pause(0.3)
            app.save_screenshot("recall.svg", str(out))
    finally:
        server.stop()
    print(f"wrote {out / 'recall.svg'}")


if __name__ == "__main__":
    asyncio.run(main(ROOT / "screenshots"))
