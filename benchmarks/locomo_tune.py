"""LoCoMo's tuning loop: recall variants scored on a settled tuning data dir, and why questions miss.

    .venv/bin/python benchmarks/locomo.py --data ../shared/data/locomo --part tuning --keep
    .venv/bin/python benchmarks/locomo_tune.py DATA_DIR --data ../shared/data/locomo \
        --variant 'hop=+{"hop_weight": 0.2}' --misses multi-hop

`locomo.py --part tuning --keep` imports and settles only the tuning conversations
(those `locomo.held_out` does not hold out) and keeps the data dir; this script then
recalls every question of those conversations against it once per variant (each a
`RecallConfig` with some fields replaced), and prints R@10 by category as
`locomo.py` scores it (k = 50, turns), in ~30 s a variant instead of a whole run.
It refuses a data dir that holds a held-out conversation: no choice is tuned on them.

`--misses CATEGORY` prints, for the first variant, each question of that category
whose evidence is not all in the top 10: every evidence turn (hit or miss, its
session, speaker and text) and the five turns ranked first.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend.core.datadir import DataDir
from backend.memory import recall as memory_recall
from backend.memory.config import RecallConfig, recall_config
from backend.runtime.context import Context
from benchmarks import locomo

Ranked = list[tuple[dict[str, Any], list[str]]]  # (question, its ranked turns)


def variant(raw: str) -> tuple[str, dict[str, Any]]:
    """'name=+{"field": value}' -> (name, the RecallConfig fields it replaces)."""
    name, _, fields = raw.partition("=+")
    replaced = json.loads(fields) if fields else {}
    unknown = set(replaced) - {f.name for f in dataclasses.fields(RecallConfig)}
    if unknown:
        raise SystemExit(f"locomo_tune: unknown RecallConfig field(s) {sorted(unknown)}")
    return name, replaced


async def refuse_held_out(ctx: Context, held: list[str]) -> None:
    """Stop if the data dir holds a held-out conversation (made without `--part tuning`)."""
    db = await ctx.db()
    projects = [f"c{cid}" for cid in held]
    marks = ", ".join("?" for _ in projects)
    found = await db.scalar(f"SELECT count(*) FROM memory_turn WHERE project IN ({marks})", projects)
    if found:
        raise SystemExit(
            f"locomo_tune: the data dir holds held-out conversations {held}: "
            "make it with `benchmarks/locomo.py --part tuning --keep`"
        )


async def rank_all(ctx: Context, asked: list[tuple[str, dict[str, Any]]], config: RecallConfig) -> Ranked:
    """Every question's ranked turns (k = 50, turns only), as `locomo.py` scores them."""
    out: Ranked = []
    for cid, q in asked:
        found = await memory_recall.recall(
            ctx, q["question"], project=f"c{cid}", k=50, kinds=("turn",), config=config
        )
        out.append((q, [i["message_id"] for i in found["items"]]))
    return out


def print_scores(name: str, ranked: Ranked) -> None:
    scored = locomo.score([(q["category"], q["evidence"], turns) for q, turns in ranked])
    cats = " / ".join(f"{c} {v['R@10']:.3f}" for c, v in scored["by_category"].items() if v["n"])
    print(f"{name}: R@10 all {scored['all']['R@10']:.3f}; {cats}", flush=True)


def print_misses(ranked: Ranked, category: str, texts: dict[str, tuple[str, str, str]]) -> None:
    """Each question of `category` missing evidence in its top 10: the evidence and the top 5."""
    number = {name: n for n, name in locomo.CATEGORIES.items()}[category]
    for q, turns in ranked:
        if q["category"] != number or all(e in turns[:10] for e in q["evidence"]):
            continue
        print(f"\nQ {q['question']}")
        for mid in q["evidence"]:
            session, speaker, text = texts.get(mid, ("?", "?", "?"))
            print(f"  {'hit ' if mid in turns[:10] else 'MISS'} {mid} {session} {speaker}: {text[:140]}")
        for mid in turns[:5]:
            print(f"       top {mid} {texts[mid][1]}: {texts[mid][2][:100]}")


async def run(args: argparse.Namespace) -> None:
    convs = dict(locomo.load(p) for p in sorted(args.data.glob("*.json")))
    held = locomo.held_out(sorted(convs))
    tuning = {cid: conv for cid, conv in convs.items() if cid not in held}
    asked = [(cid, q) for cid, conv in tuning.items() for q in locomo.questions(cid, conv)]
    texts = {
        ln["id"]: (ln["session"], ln["speaker"], ln["text"])
        for cid, conv in tuning.items()
        for ln in locomo.to_jsonl(cid, conv)
    }
    ctx = Context(DataDir(args.data_dir))
    try:
        await refuse_held_out(ctx, held)
        for i, (name, replaced) in enumerate(args.variant or [("defaults", {})]):
            ranked = await rank_all(ctx, asked, dataclasses.replace(recall_config(), **replaced))
            print_scores(name, ranked)
            if i == 0 and args.misses:
                print_misses(ranked, args.misses, texts)
    finally:
        await ctx.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, help="a data dir kept by `locomo.py --part tuning --keep`")
    parser.add_argument("--data", type=Path, required=True, help="the LoCoMo JSON files")
    parser.add_argument(
        "--variant",
        type=variant,
        action="append",
        help='NAME=+{"recall_config_field": value}: one more variant (default: the settings as they are)',
    )
    parser.add_argument(
        "--misses", choices=list(locomo.CATEGORIES.values()), help="print this category's misses"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
