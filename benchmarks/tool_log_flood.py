"""Benchmark what a flooding tool server costs rem's log: bytes and lines written, and the flood's wall time.

    python benchmarks/tool_log_flood.py [--lines 20000]

A hostile MCP server (tests/hostile_mcp.py, over stdio) answers one
`tools/call` after sending `--lines` log notifications and as many stderr
lines (about 1 KB each): the review's reproduction of a log flood. rem's registry runs in
this process, logging at INFO to a file, as a daemon does (`REM_LOG=1`).
Reported: the bytes and lines the flood added to the log, how many lines the
server sent, and the call's wall time. Prints a table on stderr and one JSON
line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from backend.tools.health import Limits
from backend.tools.registry import ToolRegistry

HOSTILE = Path(__file__).resolve().parents[1] / "tests" / "hostile_mcp.py"


async def flood(root: Path, lines: int) -> dict[str, Any]:
    config = root / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"flood": {"command": sys.executable, "args": [str(HOSTILE)]}}})
    )
    log_path = root / "daemon.log"
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    async with await ToolRegistry.load(config_path=config, entry_points=[], limits=Limits()) as registry:
        await registry.catalogue()  # started before the clock: the flood alone is measured
        before = log_path.stat().st_size
        started = time.perf_counter()
        await registry.call("flood.send_payment", {"how": "flood", "n": lines}, idempotency_key="flood")
        wall_s = time.perf_counter() - started
    handler.flush()
    text = log_path.read_bytes()[before:]
    return {
        "sent_lines": 2 * lines,
        "log_bytes": len(text),
        "log_lines": text.count(b"\n"),
        "call_wall_s": round(wall_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        result = asyncio.run(flood(Path(root), args.lines))
    for key, value in result.items():
        print(f"{key:>12}  {value}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
