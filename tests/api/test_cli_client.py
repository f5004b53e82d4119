"""`rem send|show|approve|deny|resolve|recall --server URL` against a real `rem serve` on SQLite and
PostgreSQL: the same output and exit codes as on the local store (`--json` the same shape where the
API gives the same data), the API's refusals as rem's one-line errors, another project's session or
call answering exactly like a missing one, and the token file refused unless it is private."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backend.core import private
from backend.ops.results import ToolDecision
from backend.runtime.context import Context
from backend.store.states import ToolCallState
from tests.api.conftest import Served, parked_turn, unique
from tests.api.test_resources import _transcript
from tests.cli.test_start_imports import RUN_ONE
from tests.helpers import rem_env, run_rem

AWAITING, RUNNING = ToolCallState.AWAITING_APPROVAL, ToolCallState.RUNNING


@pytest.fixture(scope="module")
def tokens(served: Served, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each of the server's tokens in a private file (mode 600), as REM_TOKEN_FILE names one."""
    root = tmp_path_factory.mktemp("tokens")
    files = {}
    for name, token in served.tokens.items():
        path = root / name
        path.write_text(token + "\n")
        path.chmod(0o600)
        files[name] = path
    return files


def through(served: Served, token: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    """`rem ARGS --server URL` with REM_TOKEN_FILE naming `token` (None: unset)."""
    env = rem_env(**({"REM_TOKEN_FILE": str(token)} if token is not None else {}))
    return run_rem(*args, "--server", served.url, env=env)


def local(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    """`rem ARGS` on the server's own store, as a shell on its host runs it."""
    return run_rem(*args, "--data", str(served.data), env=served.env)


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a refusal prints (nothing on stdout, no traceback)."""
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("rem: error: ")
    return proc.stderr.strip()


def test_send_and_show_through_the_server_answer_as_on_the_store(
    served: Served, tokens: dict[str, Path]
) -> None:
    sid = unique("s")
    sent = through(served, tokens["alpha"], "send", sid, "What is the export format?", "--json")
    assert sent.returncode == 0, sent.stderr
    admitted = json.loads(sent.stdout)
    assert set(admitted) == {"session_id", "input_id", "delivery", "admitted_seq", "duplicate"}
    assert admitted["session_id"] == sid and admitted["duplicate"] is False
    assert re.fullmatch(r"in_[0-9a-f]{25}", admitted["input_id"])  # made by the client: a retry is safe
    again = through(
        served, tokens["alpha"], "send", sid, "What is the export format?", "--id", admitted["input_id"]
    )
    assert again.returncode == 0 and again.stdout == ""
    assert again.stderr == f"rem: already admitted {admitted['input_id']} into session {sid} (queue, seq 1)\n"
    other = through(served, tokens["alpha"], "send", sid, "Another question", "--id", admitted["input_id"])
    assert other.returncode == 2 and admitted["input_id"] in one_error(other)  # the 409, as the local refusal
    malformed = through(served, tokens["alpha"], "send", "bad id", "x")
    assert malformed.returncode == 2
    assert one_error(malformed) == one_error(local(served, "send", "bad id", "x"))
    ran = local(served, "daemon", "--role", "executor", "--once")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    remote = json.loads(through(served, tokens["alpha"], "show", sid, "--json").stdout)
    stored = json.loads(local(served, "show", sid, "--json").stdout)
    assert remote["session"] == stored["session"]
    assert remote["state"] == "idle" and remote["execution"] is None and remote["held"] is None
    assert [_without_part_types(m) for m in remote["messages"]] == stored["messages"]
    assert [m["type"] for m in remote["messages"]] == ["user", "assistant"]
    assert remote["messages"][1]["parts"] and all(p["type"] == "text" for p in remote["messages"][1]["parts"])
    human = through(served, tokens["alpha"], "show", sid)
    assert human.returncode == 0 and human.stdout == local(served, "show", sid).stdout
    last = json.loads(through(served, tokens["alpha"], "show", sid, "--last", "1", "--json").stdout)
    assert [m["id"] for m in last["messages"]] == [remote["messages"][-1]["id"]]


async def test_show_through_the_server_reads_the_transcript_a_page_at_a_time(
    served: Served, tokens: dict[str, Path], store_ctx: Context
) -> None:
    sid = unique("s")
    await _transcript(await store_ctx.db(), sid, "alpha", 230)  # three pages of the API's 100
    remote = json.loads(through(served, tokens["alpha"], "show", sid, "--json").stdout)
    stored = json.loads(local(served, "show", sid, "--json").stdout)
    assert [_without_part_types(m) for m in remote["messages"]] == stored["messages"]
    assert [m["seq"] for m in remote["messages"]] == list(range(1, 231))
    last = json.loads(through(served, tokens["alpha"], "show", sid, "--last", "130", "--json").stdout)
    assert last["messages"] == remote["messages"][-130:]


def test_a_command_through_the_server_loads_the_client_not_the_server(
    served: Served, tokens: dict[str, Path], tmp_path: Path
) -> None:
    report = tmp_path / "modules.json"
    argv = ["show", "nope", "--server", served.url]
    proc = subprocess.run(
        [sys.executable, "-c", RUN_ONE, str(report), *argv],
        capture_output=True,
        text=True,
        env=rem_env(REM_TOKEN_FILE=str(tokens["alpha"])),
        timeout=120,
    )
    assert proc.returncode == 0 and "no session 'nope'" in proc.stderr, proc.stderr
    modules = json.loads(report.read_text())
    assert modules["code"] == 1 and "httpx2" in modules["modules"]  # it asked the server
    server_side = ("fastapi", "starlette", "uvicorn", "pydantic", "mcp", "chromadb", "psycopg", "numpy")
    assert [m for m in modules["modules"] if m.partition(".")[0] in server_side] == []


def _without_part_types(message: dict[str, Any]) -> dict[str, Any]:
    """A message as `rem show --json` on the store gives it: its parts without their type."""
    return {**message, "parts": [{"idx": p["idx"], "text": p["text"]} for p in message["parts"]]}


async def test_decisions_through_the_server_answer_as_on_the_store(
    served: Served, tokens: dict[str, Path], store_ctx: Context
) -> None:
    db = await store_ctx.db()
    approve_id, deny_id = await parked_turn(db, unique("s"), "alpha", [AWAITING, AWAITING])
    (resolve_id,) = await parked_turn(db, unique("s"), "alpha", [RUNNING])
    approved = through(served, tokens["alpha"], "approve", approve_id, "--json")
    assert approved.returncode == 0, approved.stderr
    decision = json.loads(approved.stdout)
    assert set(decision) == set(ToolDecision.__annotations__)  # rem approve --json's shape
    assert decision["decision"] == "approve" and decision["state"] == "pending"
    assert decision["decided_by"] == "alpha"  # journaled with the token's name
    twice = through(served, tokens["alpha"], "approve", approve_id)
    assert twice.returncode == 1 and "pending" in one_error(twice)  # wrong state: 409, named
    denied = through(served, tokens["alpha"], "deny", deny_id, "--reason", "not to customers")
    assert denied.returncode == 0 and denied.stdout == ""
    assert denied.stderr.startswith(f"rem: deny {deny_id} (outbox.outbox_send, session ")
    assert denied.stderr.rstrip().endswith("awaiting_approval -> denied; its turn resumes now")
    wrong = through(served, tokens["alpha"], "resolve", resolve_id, "--done", "--reason", "x")
    assert wrong.returncode == 2  # refused before any request, as on the store
    assert one_error(wrong) == one_error(local(served, "resolve", resolve_id, "--done", "--reason", "x"))
    done = through(served, tokens["alpha"], "resolve", resolve_id, "--done", "--result", "sent", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["decision"] == "done" and json.loads(done.stdout)["state"] == "completed"
    reader = through(served, tokens["reader"], "resolve", resolve_id, "--retry")
    assert reader.returncode == 1 and "'decide' scope" in one_error(reader)


async def test_another_projects_session_and_call_answer_like_missing_ones(
    served: Served, tokens: dict[str, Path], store_ctx: Context
) -> None:
    theirs, missing = unique("s"), unique("s")
    (call_id,) = await parked_turn(await store_ctx.db(), theirs, "beta", [AWAITING])
    for args in (
        ("show", "{sid}"),
        ("recall", "ledger", "--session", "{sid}"),
        ("approve", "{call}"),
        ("deny", "{call}"),
        ("resolve", "{call}", "--fail"),
    ):
        seen = through(served, tokens["alpha"], *(a.format(sid=theirs, call=call_id) for a in args))
        absent = through(
            served, tokens["alpha"], *(a.format(sid=missing, call="call_" + missing) for a in args)
        )
        assert seen.returncode == absent.returncode == 1, (args, seen.stderr, absent.stderr)
        assert one_error(seen).replace(theirs, "ID").replace(call_id, "ID") == one_error(absent).replace(
            missing, "ID"
        ).replace("call_ID", "ID"), args
    # a send to a missing session creates it; to another project's, it is the missing session's answer
    sent = through(served, tokens["alpha"], "send", theirs, "hello")
    shown = through(served, tokens["alpha"], "show", missing)
    assert sent.returncode == 1 and one_error(sent).replace(theirs, "ID") == one_error(shown).replace(
        missing, "ID"
    )
    assert through(served, tokens["beta"], "show", theirs).returncode == 0  # its own token sees it


def test_recall_through_the_server_gives_what_rem_recall_json_gives(
    served: Served, tokens: dict[str, Path], tmp_path: Path
) -> None:
    from tests.backend.test_recall import write_jsonl

    imported = local(served, "import", str(write_jsonl(tmp_path / "chats.jsonl")))
    assert imported.returncode == 0, imported.stderr
    query = ("recall", "sourdough bread", "--project", "ops", "--k", "3", "--json")
    for role in ("summarizer", "dream"):  # what indexes the turns
        assert local(served, "daemon", "--role", role, "--once").returncode == 0
    found = json.loads(through(served, tokens["ops"], *query).stdout)
    stored = json.loads(local(served, *query).stdout)
    assert set(found) == set(stored) and found["items"] == stored["items"]
    assert "turn" in {item["kind"] for item in found["items"]}
    summaries = json.loads(through(served, tokens["ops"], *query, "--kind", "summary").stdout)["items"]
    assert summaries and {item["kind"] for item in summaries} == {"summary"}  # --kind went with the query
    everywhere = through(served, tokens["alpha"], "recall", "sourdough", "--all-projects")
    assert everywhere.returncode == 1 and "every project" in one_error(everywhere)
    assert through(served, tokens["ops"], "recall", "sourdough", "--all-projects", "--json").returncode == 0


async def test_the_token_file_is_refused_unless_it_is_private_and_holds_a_live_token(
    served: Served, tokens: dict[str, Path], tmp_path: Path, store_ctx: Context
) -> None:
    sid = unique("s")
    secret = served.tokens["alpha"]
    unset = through(served, None, "send", sid, "hello")
    assert unset.returncode == 2 and "REM_TOKEN_FILE is not set" in one_error(unset)
    loose = tmp_path / "loose"
    loose.write_text(secret)
    for mode, said in ((0o644, "mode 644"), (0o640, "mode 640"), (0o604, "mode 604")):
        loose.chmod(mode)
        refused = through(served, loose, "send", sid, "hello")
        assert (
            refused.returncode == 2 and said in one_error(refused) and f"chmod 600 {loose}" in refused.stderr
        )
    for content in ("", f"{secret} {secret}", "line one\nline two"):
        loose.write_text(content)
        loose.chmod(0o600)
        refused = through(served, loose, "send", sid, "hello")
        assert refused.returncode == 2 and "REM_TOKEN_FILE" in one_error(refused)
    assert through(served, tmp_path, "send", sid, "hello").returncode == 2  # a folder
    assert through(served, tmp_path / "nope", "send", sid, "hello").returncode == 2
    forged = tmp_path / "forged"
    forged.write_text("rem_" + "x" * 43)
    forged.chmod(0o600)
    unknown = through(served, forged, "send", sid, "hello")
    assert unknown.returncode == 2 and "not a live rem token" in one_error(unknown)
    db = await store_ctx.db()
    assert await db.scalar("SELECT count(*) FROM session WHERE id = ?", (sid,)) == 0  # nothing admitted
    assert all(secret not in text for text in (unset.stderr, refused.stderr, unknown.stderr))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_token_file_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.write_text("rem_" + "x" * 43)
    theirs.chmod(0o600)
    os.chown(theirs, 65534, 65534)
    env = rem_env(REM_TOKEN_FILE=str(theirs))
    refused = run_rem("show", "anything", "--server", "http://127.0.0.1:9", env=env)  # refused before it
    assert refused.returncode == 2
    assert f"owned by {private.user_name(65534)} (uid 65534), not by you" in one_error(refused)


def test_a_server_that_cannot_be_reached_is_exit_3_naming_it(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: refused
        token = tmp_path / "token"
        token.write_text("rem_" + "x" * 43)
        token.chmod(0o600)
        env = rem_env(REM_TOKEN_FILE=str(token))
        for args in (("send", "s1", "hello", "--follow"), ("show", "s1"), ("approve", "c1"), ("recall", "x")):
            down = run_rem(*args, "--server", url, env=env)
            assert down.returncode == 3, (args, down.stderr)
            assert f"cannot reach the rem server at {url}" in one_error(down) and "`rem serve`" in down.stderr
        through_env = run_rem("show", "s1", env={**env, "REM_SERVER": url})
        assert through_env.returncode == 3 and url in through_env.stderr
    plain = run_rem("show", "s1", "--server", "http://rem.example.com:8765", env=env)
    assert plain.returncode == 2 and "plain http to another host" in one_error(plain)
    both = run_rem("show", "s1", "--server", url, "--data", str(tmp_path), env=env)
    assert both.returncode == 2 and "give one" in one_error(both)
    alone = run_rem("send", "s1", "hello", "--follow", "--data", str(tmp_path / "d"))
    assert alone.returncode == 2 and "--server" in one_error(alone)
    assert not (tmp_path / "d").exists()  # refused before the store was opened
