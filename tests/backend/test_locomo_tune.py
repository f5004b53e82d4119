"""LoCoMo's tuning loop (`benchmarks/locomo_tune.py`) refuses a data dir holding a held-out conversation,
and scores its variants with recall's own ranking."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from backend import ops
from backend.memory.config import recall_config
from backend.runtime.context import Context
from benchmarks import locomo_tune
from tests.backend.test_recall import settle

pytestmark = pytest.mark.both_stores

T0 = 1_683_554_160_000  # 8 May 2023, 13:56 UTC


async def import_conversations(ctx: Context, tmp_path: Path, cids: list[str]) -> None:
    """Two turns in each LoCoMo-like conversation `c<cid>`, as `benchmarks/locomo.py` imports them."""
    rows = [
        {
            "project": f"c{cid}",
            "session": f"c{cid}-s1",
            "id": f"c{cid}-D1-{n}",
            "role": "user",
            "speaker": "Ana",
            "text": text,
            "time": T0 + n * 1000,
        }
        for cid in cids
        for n, text in enumerate(["I adopted a grey kitten named Biscuit.", "The weather was mild."], 1)
    ]
    path = tmp_path / "lines.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert (await ops.import_file(ctx, path))["ok"]
    await settle(ctx)


async def test_a_data_dir_holding_a_held_out_conversation_is_refused(ctx: Context, tmp_path: Path) -> None:
    await import_conversations(ctx, tmp_path, ["26", "41"])
    with pytest.raises(SystemExit, match=r"held-out conversations \['41'\].*--part tuning --keep"):
        await locomo_tune.refuse_held_out(ctx, ["41"])
    await locomo_tune.refuse_held_out(ctx, ["43"])  # not imported: the loop may run


async def test_a_variant_is_scored_with_recalls_own_ranking(ctx: Context, tmp_path: Path) -> None:
    await import_conversations(ctx, tmp_path, ["26"])
    asked = [("26", {"question": "What is the kitten called?", "category": 4, "evidence": ["c26-D1-1"]})]
    name, replaced = locomo_tune.variant('no hop=+{"hop_seeds": 0}')
    assert (name, replaced) == ("no hop", {"hop_seeds": 0})
    ranked = await locomo_tune.rank_all(ctx, asked, dataclasses.replace(recall_config(), **replaced))
    assert ranked[0][1][0] == "c26-D1-1"


def test_a_variant_naming_no_recall_setting_is_refused() -> None:
    with pytest.raises(SystemExit, match=r"unknown RecallConfig field\(s\) \['hop_wieght'\]"):
        locomo_tune.variant('typo=+{"hop_wieght": 0.2}')
