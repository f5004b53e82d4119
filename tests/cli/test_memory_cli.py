"""`rem import`, `rem recall`, `rem reindex` as real commands: one JSON document on stdout, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from tests.backend.test_recall import write_jsonl
from tests.helpers import rem_env, run_rem


def test_import_then_recall_as_commands(tmp_path: Path, chroma_url: str, collection: str) -> None:
    env = rem_env(REM_CHROMA_URL=chroma_url, REM_CHROMA_COLLECTION=collection)
    data = str(tmp_path / "data")
    path = write_jsonl(tmp_path / "chats.jsonl")
    imported = run_rem("import", str(path), "--data", data, "--json", env=env)
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["written"] == 6
    # before the summarizer and Dream ran, recall finds nothing and says why, and what indexes them
    early = run_rem("recall", "sourdough bread", "--project", "ops", "--data", data, "--json", env=env)
    assert early.returncode == 0, early.stderr
    assert json.loads(early.stdout)["items"] == []
    assert json.loads(early.stdout)["not_indexed"] == {"turns": 5, "sessions": 3}  # ops: 5 turns, 3 sessions
    told = run_rem("recall", "sourdough bread", "--project", "ops", "--data", data, env=env)
    assert "not indexed yet 5 turn(s) in 3 session(s)" in " ".join(told.stdout.split())
    assert "rem up" in told.stdout and "--role dream --once" in " ".join(told.stdout.split())
    for role in ("summarizer", "dream"):
        done = run_rem("daemon", "--role", role, "--once", "--data", data, env=env)
        assert done.returncode == 0, done.stderr
    found = run_rem(
        "recall", "sourdough bread", "--project", "ops", "--k", "2", "--data", data, "--json", env=env
    )
    assert found.returncode == 0, found.stderr
    result = json.loads(found.stdout)  # stdout is exactly one JSON document
    assert result["items"][0]["message_id"] == "f-1" and len(result["items"]) <= 2
    assert json.loads(found.stdout)["not_indexed"] is None  # items found: not looked for
    human = run_rem(
        "recall", "sourdough bread", "--project", "ops", "--data", data, env={**env, "COLUMNS": "80"}
    )
    assert human.returncode == 0 and "sourdough" in human.stdout and "Traceback" not in human.stderr
    assert max(len(line) for line in human.stdout.splitlines()) <= 80, human.stdout  # fits 80 columns
    assert "not indexed" not in human.stdout
    # each item: its line (rank, kind, score, session, who and when, retrievers), then its text under it
    lines = human.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(" 1 turn"))
    assert "food" in lines[first] and "Ravi" in lines[first] and "fts" in lines[first]
    assert lines[first + 1].startswith("   I baked sourdough bread")
    # an agent's step is given that memory, and `rem show` prints what it was given
    step_env = {**env, "REM_AGENT_DELAY_MS": "0"}
    sent = run_rem(
        "send", "new", "How is the dog doing on the beach?", "--project", "ops", "--data", data, env=step_env
    )
    assert sent.returncode == 0, sent.stderr
    ran = run_rem("daemon", "--role", "executor", "--once", "--data", data, env=step_env)
    assert ran.returncode == 0, ran.stderr
    shown = run_rem("show", "new", "--data", data, env=step_env)
    assert shown.returncode == 0, shown.stderr
    assert "project ops" in shown.stdout and "memory turn p-1 (pets" in shown.stdout, shown.stdout


def test_a_bad_import_line_exits_1_and_bad_recall_input_exits_2(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session": "s", "id": "x", "role": "user", "text": "hi", "time": "soon"}\n')
    result = run_rem("import", str(bad), "--data", data, "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["errors"][0]["line"] == 1
    missing = run_rem("import", str(tmp_path / "nope.jsonl"), "--data", data)
    assert (
        missing.returncode == 2
        and missing.stderr.startswith("rem: error: ")
        and "not a file" in missing.stderr
    )
    empty = run_rem("recall", " ", "--data", data)
    assert empty.returncode == 2 and empty.stderr.strip() == (
        "rem: error: the recall query is empty: pass the words to look for as QUERY"
    )
