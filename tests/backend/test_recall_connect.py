"""Recall that connects: the second hop through Dream's graph across sessions, days resolved from time
words, and the spread of the top k across sessions."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from backend import ops
from backend.core import clock
from backend.memory import expansion
from backend.memory import recall as memory_recall
from backend.memory.candidate import Candidate
from backend.memory.config import recall_config
from backend.runtime.context import Context
from tests.backend.test_recall import settle

pytestmark = pytest.mark.both_stores

# the state store's retrievers only: what the dense side would find by meaning stays out of the proof
STORE_SIDE = ("fts", "graph", "dates", "facts")


def at(day: str) -> int:
    return int(datetime.fromisoformat(day).replace(hour=14, tzinfo=UTC).timestamp() * 1000)


async def import_lines(ctx: Context, tmp_path: Path, lines: list[tuple[str, str, str, str, int]]) -> None:
    rows = [
        {"project": "p", "session": s, "id": i, "role": "user", "speaker": who, "text": t, "time": when}
        for s, i, who, t, when in lines
    ]
    path = tmp_path / "lines.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert (await ops.import_file(ctx, path))["ok"]
    await settle(ctx)


def turns(result: dict[str, Any]) -> list[str]:
    return [i["message_id"] for i in result["items"] if i["kind"] == "turn"]


MOVE = [
    ("s1", "a1", "Ana", "We finished the move to Portland with the green truck.", at("2023-05-01")),
    ("s1", "a2", "Ana", "The kitchen still needs shelves and a lamp.", at("2023-05-01")),
    ("s2", "b1", "Ana", "Jonas lent us his green truck for Portland.", at("2023-05-20")),
    ("s3", "c1", "Ana", "I baked rye bread and walked the dog.", at("2023-06-02")),
]


async def test_the_second_hop_brings_the_other_sessions_evidence(ctx: Context, tmp_path: Path) -> None:
    await import_lines(ctx, tmp_path, MOVE)
    query = "who helped with the move"  # b1 shares no word with it, only the truck and Portland with a1
    hopped = await memory_recall.recall(ctx, query, project="p", k=5, kinds=("turn",), retrievers=STORE_SIDE)
    assert turns(hopped)[:2] == ["a1", "b1"]
    second = hopped["items"][1]
    assert second["provenance"]["found_by"] == ["hop"] and second["session_id"] == "s2"
    flat = dataclasses.replace(recall_config(), hop_weight=0.0)
    first_hop = await memory_recall.recall(
        ctx, query, project="p", k=5, kinds=("turn",), retrievers=STORE_SIDE, config=flat
    )
    assert "b1" not in turns(first_hop)


async def test_the_hop_keeps_to_the_scope(ctx: Context, tmp_path: Path) -> None:
    await import_lines(ctx, tmp_path, MOVE)
    kept = await memory_recall.recall(
        ctx, "who helped with the move", project="p", session_id="s1", k=5, retrievers=STORE_SIDE
    )
    assert {i["session_id"] for i in kept["items"] if i["kind"] == "turn"} == {"s1"}


DAYS = [
    ("s1", "d1", "Cleo", "I went to the support group yesterday, it was powerful.", at("2023-05-08")),
    ("s2", "d2", "Cleo", "The support group meets again next month.", at("2023-05-08")),
    ("s3", "d3", "Cleo", "Painting by the lake is how I relax.", at("2023-07-15")),
]


async def test_dream_stores_the_days_a_turns_time_words_name(ctx: Context, tmp_path: Path) -> None:
    await import_lines(ctx, tmp_path, DAYS)
    db = await ctx.db()
    rows = await db.fetchall("SELECT src, dst FROM graph_edge WHERE kind = 'on' ORDER BY src, dst")
    assert [tuple(r) for r in rows] == [("turn:d1", "date:2023-05-07"), ("turn:d2", "date:2023-06")]
    labels = await db.fetchall("SELECT id, kind, label FROM graph_node WHERE kind = 'date' ORDER BY id")
    assert [tuple(r) for r in labels] == [
        ("date:2023-05-07", "date", "7 May 2023"),
        ("date:2023-06", "date", "June 2023"),
    ]


async def test_a_question_naming_a_day_finds_the_turn_that_said_it_in_words(
    ctx: Context, tmp_path: Path
) -> None:
    await import_lines(ctx, tmp_path, DAYS)
    # "yesterday" said on 8 May 2023: the turn names 7 May 2023, though neither word is in its text
    result = await memory_recall.recall(
        ctx, "What did Cleo do on 7 May 2023?", project="p", k=3, retrievers=STORE_SIDE
    )
    top = result["items"][0]
    assert top["message_id"] == "d1" and "dates" in top["provenance"]["found_by"]
    june = await memory_recall.recall(
        ctx, "plans for June 2023", project="p", k=3, kinds=("turn",), retrievers=STORE_SIDE
    )
    assert turns(june)[0] == "d2"


async def test_a_question_naming_days_favours_turns_said_on_them(ctx: Context, tmp_path: Path) -> None:
    now = clock.now_ms()
    week = 7 * 86_400_000
    lines = [  # the same words; e2 said 7 days ago (always in last week), e1 over a year ago
        ("s1", "e1", "Nate", "I won the gaming tournament, so happy.", now - 60 * week),
        ("s2", "e2", "Nate", "I won the gaming tournament, so happy.", now - week),
    ]
    await import_lines(ctx, tmp_path, lines)
    query = "Which tournament did Nate win last week?"  # no word of it names the day in the index
    kw: dict[str, Any] = {"project": "p", "k": 2, "kinds": ("turn",), "retrievers": STORE_SIDE}
    assert turns(await memory_recall.recall(ctx, query, **kw)) == ["e2", "e1"]
    off = dataclasses.replace(recall_config(), date_boost=0.0)
    assert turns(await memory_recall.recall(ctx, query, config=off, **kw)) == ["e1", "e2"]  # a tie, by id


def candidates(*turns: tuple[str, str]) -> dict[str, Candidate]:
    return {mid: Candidate(n, mid, sid) for n, (mid, sid) in enumerate(turns)}


@pytest.mark.parametrize(
    ("decay", "k", "picked"),
    [
        (1.0, 3, {"x1": 1.0, "x2": 0.9, "x3": 0.8}),  # no spread: the fused order
        (0.5, 3, {"x1": 1.0, "y1": 0.7, "x2": 0.45}),  # x2 halved once, x3 would be quartered
        (0.5, 2, {"x1": 1.0, "y1": 0.7}),
        (0.8, 4, {"x1": 1.0, "x2": 0.72, "y1": 0.7, "x3": 0.512}),
    ],
)
def test_the_top_k_is_spread_across_sessions(decay: float, k: int, picked: dict[str, float]) -> None:
    found = candidates(("x1", "X"), ("x2", "X"), ("x3", "X"), ("y1", "Y"))
    fused = {"x1": 1.0, "x2": 0.9, "x3": 0.8, "y1": 0.7}
    config = dataclasses.replace(recall_config(), session_decay=decay)
    spread = expansion.diversify(fused, found, config, k)
    assert list(spread) == list(picked)
    assert spread == pytest.approx(picked)


async def test_a_spread_recall_ranks_another_sessions_turn_into_the_top(ctx: Context, tmp_path: Path) -> None:
    lines = [
        ("s1", f"m{n}", "Ana", f"pottery glaze notes, part {n}: the pottery glaze", at("2023-05-01"))
        for n in range(4)
    ]
    lines.append(("s2", "n1", "Ana", "my pottery glaze cracked in the kiln", at("2023-06-01")))
    lines.append(
        ("s3", "o1", "Ana", "a long day at work, the glaze shop was closed, then dinner", at("2023-06-05"))
    )
    await import_lines(ctx, tmp_path, lines)
    kw: dict[str, Any] = {"project": "p", "k": 3, "kinds": ("turn",), "retrievers": STORE_SIDE}
    packed = await memory_recall.recall(ctx, "pottery glaze", **kw)
    assert {i["session_id"] for i in packed["items"]} == {"s1"}
    spread_config = dataclasses.replace(recall_config(), session_decay=0.5)
    spread = await memory_recall.recall(ctx, "pottery glaze", config=spread_config, **kw)
    assert "n1" in turns(spread) and len(turns(spread)) == 3
