"""CPU instructions a turn and a tool call cost rem's process, counted by valgrind: a figure a busy machine does not move.

    python benchmarks/instructions.py [--turns 200] [--calls 200] [--json]

Wall-clock and CPU-time rates (`benchmarks/turns.py`, `benchmarks/tool_calls.py`)
swing with whatever else the machine runs; the instructions a process executes
for the same work do not (runs agree within about 1 %). This runs two measured
phases, each in a fresh process under `valgrind --tool=callgrind` with
instrumentation switched on only for the phase (`callgrind_control -i on/off`),
on a fresh SQLite data dir:

1. **turn**: one in-process `Executor` (`--once`, instant offline agent, 8 at
   once) answers `--turns` queue inputs over 30 sessions (60 answered first,
   unmeasured, to warm it up), as in `benchmarks/turns.py`;
2. **tool call**: the same executor with `--calls / 10` sessions each asking
   for 10 read calls (`notes_search` of rem's demo MCP server over stdio), as
   the throughput half of `benchmarks/tool_calls.py`. The MCP server's own
   process is not counted (the bare client pays it too); for scale, the bare
   SDK client costs about 1.0 M instructions a call here.

Prints millions of instructions per turn and per call. Needs valgrind
(Debian: `apt-get install valgrind`); it runs ~50x slower than native, so
about a minute in all. Not run by the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def switch(on: bool) -> None:
    """Callgrind's instrumentation on or off for this process (no-op when not under valgrind)."""
    if shutil.which("callgrind_control"):
        subprocess.run(
            ["callgrind_control", "-i", "on" if on else "off", str(os.getpid())], capture_output=True
        )


async def turn_phase(root: Path, turns: int) -> int:
    from backend.core.datadir import DataDir
    from backend.execution.agent import OfflineResponder
    from backend.execution.executor import Executor
    from backend.runtime.context import Context
    from benchmarks.turns import admit_all

    ctx = Context(DataDir(root), start_chroma=False)
    db = await ctx.db()
    await admit_all(db, 0, 60, 30)
    await Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), concurrency=8).run()
    await admit_all(db, 60, turns, 30)
    executor = Executor(ctx, once=True, agent=OfflineResponder(delay_ms=0), concurrency=8)
    switch(True)
    await executor.run()
    switch(False)
    await ctx.close()
    return executor.turns_completed


async def tool_phase(root: Path, calls: int) -> int:
    from backend.core.datadir import DataDir
    from backend.execution import sessions
    from backend.execution.executor import Executor
    from backend.programs.demo_tools import server_config
    from backend.runtime.context import Context
    from benchmarks.tool_calls import ReadAgent

    config = root / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"demo": server_config(root / "tools", effect_delay_ms=0)}}))
    os.environ["REM_MCP_CONFIG"], os.environ["REM_AGENT_DELAY_MS"] = str(config), "0"
    ctx = Context(DataDir(root / "data"), start_chroma=False)
    db = await ctx.db()
    count = max(1, calls // 10)
    for n in range(count):
        await sessions.admit(db, f"tp{n:04d}", "bench", input_id=f"tp{n:04d}-in")
    executor = Executor(ctx, once=True, agent=ReadAgent(10), concurrency=count)
    await executor.tools.offered()  # its server started and listed before counting starts
    switch(True)
    await executor.run()
    switch(False)
    done = await db.scalar("SELECT count(*) FROM tool_call WHERE state = 'completed'")
    await ctx.close()
    return int(done)


def phase_child(kind: str, n: int) -> None:
    """Run one phase in this process (under valgrind) and print how many units it did."""
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="rem-instr-") as tmp:
        coro = turn_phase(Path(tmp), n) if kind == "turn" else tool_phase(Path(tmp), n)
        print(f"units {asyncio.run(coro)}")


def counted(kind: str, n: int) -> dict[str, float]:
    """One phase under callgrind: its units and millions of instructions per unit."""
    with tempfile.TemporaryDirectory(prefix="rem-cg-") as tmp:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={tmp}/cg.out",
            sys.executable,
            __file__,
            "--child",
            kind,
            str(n),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    units = int(re.search(r"units (\d+)", out.stdout).group(1))  # type: ignore[union-attr]
    collected = int(re.search(r"Collected : (\d+)", out.stderr).group(1))  # type: ignore[union-attr]
    return {"units": units, "m_instructions_per_unit": round(collected / max(units, 1) / 1e6, 3)}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        phase_child(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("benchmarks/instructions.py needs valgrind: apt-get install valgrind")
    result = {"turn": counted("turn", args.turns), "tool_call": counted("tool", args.calls)}
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"turn:      {result['turn']['m_instructions_per_unit']} M instructions ({result['turn']['units']} turns)"
    )
    tool = result["tool_call"]
    print(f"tool call: {tool['m_instructions_per_unit']} M instructions ({tool['units']} read calls)")


if __name__ == "__main__":
    main()
