"""An agent commits with the official `mcp-server-git` (its `git_commit` is an effect): the call waits
for `rem approve`, the executor is SIGKILLed after the commit landed but before rem recorded it,
the takeover makes the outcome unknown and holds the session, the operator sees the commit and
runs `rem resolve --done`, and the turn ends with one reply. The repository has one commit:
nothing ran it twice. The model is the scripted OpenAI-compatible server (tool_calls streamed)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from backend.execution import sessions
from backend.runtime.context import Context
from backend.store.db import Database
from tests.fake_openai import FakeOpenAIServer, Scenario
from tests.helpers import await_until, rem_env, run_rem, spawn_rem


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "agent@example.com")
    _git(repo, "config", "user.name", "agent")
    (repo / "NOTES.md").write_text("standup moved to 10:30\n")
    _git(repo, "add", "NOTES.md")
    return repo


async def _state(db: Database) -> str | None:
    value = await db.scalar("SELECT state FROM tool_call")
    return None if value is None else str(value)


async def test_an_agent_commits_once_through_approval_a_sigkill_and_a_resolve(
    db_ctx: Context, tmp_path: Path, fake_model: FakeOpenAIServer
) -> None:
    git = shutil.which("mcp-server-git", path=str(Path(sys.executable).parent))
    assert git is not None
    repo = _repo(tmp_path)
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"git": {"command": git, "args": ["--repository", str(repo)]}}})
    )
    call = {"name": "git__git_commit", "arguments": json.dumps({"repo_path": str(repo), "message": "notes"})}
    fake_model.push(Scenario(reply="Committing.", tool_calls=[call]))
    fake_model.set_default(Scenario(reply="Committed the notes."))
    env = rem_env(
        REM_AGENT="openai",
        REM_MCP_CONFIG=str(config),
        REM_EXECUTION_LEASE_MS="1500",
        REM_CHROMA_AUTOSTART="0",
        REM_LOG="1",
        REM_TEST_MODE="1",
    )
    data = ["--data", str(db_ctx.data.root)]
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Commit the staged notes.", input_id="in-1")
    victim = spawn_rem(
        "daemon",
        "--role",
        "executor",
        *data,
        env={**env, "REM_FAULTS": "tools.after_result"},
        log=tmp_path / "v.log",
    )
    rescuer: subprocess.Popen[bytes] | None = None
    try:
        await await_until(lambda: _state(db), timeout=120, message="the commit to be asked for")
        assert await _state(db) == "awaiting_approval" and _git(repo, "rev-list", "--all") == ""
        call_id = await db.scalar("SELECT id FROM tool_call")
        assert run_rem("approve", call_id, *data, env=env).returncode == 0
        assert victim.wait(timeout=120) == -signal.SIGKILL, (tmp_path / "v.log").read_text()[-3000:]
        assert len(_git(repo, "rev-list", "--all").split()) == 1  # it landed; rem never heard
        rescuer = spawn_rem("daemon", "--role", "executor", *data, env=env, log=tmp_path / "r.log")

        async def held_unknown() -> bool:
            # the takeover marks the call unknown, then parks the turn (the session held) in its next
            # transaction of the same pass
            held = await db.scalar("SELECT held_reason FROM session WHERE id = 's1'")
            return await _state(db) == "unknown" and held == "tool_outcome_unknown"

        await await_until(held_unknown, timeout=120, message="the takeover to find the outcome unknown, held")
        head = _git(repo, "rev-parse", "HEAD").strip()
        resolved = run_rem("resolve", call_id, "--done", "--result", f"committed {head}", *data, env=env)
        assert resolved.returncode == 0, resolved.stderr

        async def answered() -> bool:
            return bool(
                await db.scalar(
                    "SELECT count(*) FROM session_message WHERE type = 'assistant' "
                    "AND json_extract(data, '$.status') = 'completed'"
                )
            )

        await await_until(answered, timeout=120, message="the reply after the resolve")
    finally:
        for proc in (victim, rescuer):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    assert len(_git(repo, "rev-list", "--all").split()) == 1  # never committed twice
    row = await db.fetchone("SELECT state, starts, retries, result FROM tool_call")
    assert row is not None and (row[0], row[1], row[2]) == ("completed", 1, 0) and head in row[3]
    last = fake_model.requests()[-1].body["messages"]
    assert any(m["role"] == "tool" and head in m["content"] for m in last)
