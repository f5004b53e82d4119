"""`rem import` throughput: messages per second through both passes (validate, write).

    .venv/bin/python benchmarks/import_rate.py [--messages 100000] [--rounds 3] [--json]

Generates a JSON Lines file of `--messages` messages (200 sessions in 10
projects, ~60-character texts, alternating user and assistant) and imports it
into a fresh data dir each round through the library call behind `rem
import`. Reports messages/s per round (the target is >= 5 000).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend import ops
from backend.core.datadir import DataDir
from backend.runtime.context import Context

WORDS = "payments cluster replica dog beach bread flour garden paint sunrise friends group research deploy".split()


def generate(path: Path, messages: int) -> None:
    rng = random.Random(1)
    with path.open("w") as handle:
        for i in range(messages):
            session = i % 200
            text = " ".join(rng.choice(WORDS) for _ in range(8)) + f" number {i}."
            handle.write(
                json.dumps(
                    {
                        "project": f"p{session % 10}",
                        "session": f"s{session}",
                        "id": f"m{i}",
                        "role": "user" if i % 2 == 0 else "assistant",
                        "speaker": "Ann" if i % 2 == 0 else "Bob",
                        "text": text,
                        "time": 1_700_000_000_000 + i,
                    }
                )
                + "\n"
            )


async def one_round(path: Path, root: Path) -> float:
    ctx = Context(DataDir(root / "data"), start_chroma=False)
    try:
        await ctx.db()
        started = time.perf_counter()
        result = await ops.import_file(ctx, path)
        took = time.perf_counter() - started
        assert result["ok"], result["errors"]
        return result["written"] / took
    finally:
        await ctx.close()
        shutil.rmtree(root / "data", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rem-import-"))
    try:
        path = root / "chats.jsonl"
        generate(path, args.messages)
        rates = [asyncio.run(one_round(path, root)) for _ in range(args.rounds)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "messages": args.messages,
        "rounds_msgs_per_s": [round(r) for r in rates],
        "median_msgs_per_s": round(statistics.median(rates)),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"rem import of {args.messages} messages: median {result['median_msgs_per_s']} messages/s "
            f"(rounds {', '.join(map(str, result['rounds_msgs_per_s']))})"
        )


if __name__ == "__main__":
    main()
