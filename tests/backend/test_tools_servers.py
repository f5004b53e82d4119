"""Tool sources over real MCP servers: rem's demo server (stdio and streamable HTTP), mcp-server-git, a broken one.

One registry (one event loop) for the whole module: each server starts once
(Python MCP servers take seconds to start on a loaded machine).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from backend.chroma.server import free_port
from backend.core import clock
from backend.programs.demo_tools import server_config
from backend.tools.errors import ToolConnectionLost, ToolTimeout, ToolUnavailable
from backend.tools.health import Limits
from backend.tools.registry import ToolRegistry

pytestmark = pytest.mark.asyncio(loop_scope="module")

DEMO = [sys.executable, "-P", "-m", "backend.programs.demo_tools"]
LIMITS = Limits(timeout_ms=20_000, start_timeout_ms=90_000, result_max_bytes=64 * 1024, model_max_bytes=4096)
DEADLINE_S = 60.0


def wait_for(predicate: Any, what: str, timeout: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def until(predicate: Any, what: str, timeout: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def calls(data: Path, **match: Any) -> list[dict[str, Any]]:
    """The demo server's call log lines that match every `match` item."""
    path = data / "tools.log.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    records = [json.loads(line) for line in lines]
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tools")
    repo = root / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return {"root": root, "stdio": root / "stdio", "http": root / "http", "repo": repo}


class HttpDemo:
    """rem's demo tool server over streamable HTTP, on one port across restarts."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [*DEMO, "--data", str(self.data), "--test-tools", "--http", str(self.port)]
        self.process = process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _accepts(self.port) or process.poll() is not None, "the HTTP demo server")
        assert process.poll() is None, "the HTTP demo server exited"

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def http_demo(dirs: dict[str, Path]) -> Iterator[HttpDemo]:
    demo = HttpDemo(dirs["http"])
    demo.start()
    try:
        yield demo
    finally:
        demo.stop()


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def registry(dirs: dict[str, Path], http_demo: HttpDemo) -> AsyncIterator[ToolRegistry]:
    git = shutil.which("mcp-server-git", path=str(Path(sys.executable).parent))
    assert git is not None, "mcp-server-git is in the test extra"
    config = {
        "mcpServers": {
            "demo": server_config(dirs["stdio"], test_tools=True),
            "web": {"url": http_demo.url, "headers": {"X-Rem-Test": "1"}},
            "git": {"command": git, "args": ["--repository", str(dirs["repo"])]},
            "broken": {
                "command": sys.executable,
                "args": ["-c", "import sys; print('boom: no token', file=sys.stderr); sys.exit(3)"],
            },
        },
        "rem": {
            "tools": {
                "demo.notes_search": {"timeout_ms": 1500},
                "git.git_add": {"effect": "effect"},
                "git.*": {"timeout_ms": 10_000},
                "broken.launch": {"permission": "deny"},
            }
        },
    }
    path = dirs["root"] / "mcp.json"
    path.write_text(json.dumps(config))
    registry = await ToolRegistry.load(config_path=path, entry_points=[], limits=LIMITS)
    try:
        yield registry
    finally:
        await registry.aclose()


async def test_catalogue_classifies_tools_from_annotations_and_config(registry: ToolRegistry) -> None:
    specs = {spec.name: spec for spec in await registry.catalogue()}

    def row(name: str) -> tuple[str, str, str, str, int]:
        s = specs[name]
        return (s.effect, s.effect_source, s.permission, s.permission_source, s.timeout_ms)

    assert row("demo.notes_search") == ("read", "annotation", "allow", "default", 1500)
    assert row("demo.notes_add") == ("idempotent", "annotation", "allow", "default", 20_000)
    assert row("demo.outbox_send") == ("effect", "annotation", "ask", "default", 20_000)
    assert row("web.outbox_send")[:3] == ("effect", "annotation", "ask")
    # mcp-server-git's own annotations: read-only tools, idempotent writes, and effects
    assert row("git.git_status") == ("read", "annotation", "allow", "default", 10_000)
    assert row("git.git_commit") == ("effect", "annotation", "ask", "default", 10_000)
    assert row("git.git_reset")[:2] == ("idempotent", "annotation")  # destructive, but idempotent
    assert row("git.git_add") == ("effect", "config", "ask", "default", 10_000)  # idempotent, overridden
    assert specs["git.git_add"].annotations["idempotentHint"] is True
    assert {n for n, s in specs.items() if s.server == "git" and s.effect == "read"} == {
        f"git.git_{t}" for t in ("status", "diff_unstaged", "diff_staged", "diff", "log", "show", "branch")
    }
    # the broken server: down, its configured tool listed as unavailable, the others unaffected
    assert row("broken.launch")[2:4] == ("deny", "config")
    assert not specs["broken.launch"].available and "boom: no token" in str(
        specs["broken.launch"].unavailable_reason
    )
    assert all(s.available for n, s in specs.items() if s.server != "broken")
    tool = specs["demo.notes_add"].openai_tool()
    assert (
        tool["function"]["name"] == "demo__notes_add"
        and "text" in tool["function"]["parameters"]["properties"]
    )
    assert (await registry.spec("git__git_commit")).name == "git.git_commit"


async def test_a_server_that_cannot_start_is_down_with_backoff_and_the_others_work(
    registry: ToolRegistry, dirs: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rem.tools.server")
    errors: list[ToolUnavailable] = []
    for attempt in range(3):  # the first failure restarts at once; the next ones back off
        with pytest.raises(ToolUnavailable) as caught:
            await registry.call("broken.launch", {}, idempotency_key=f"b-{attempt}")
        errors.append(caught.value)
        if caught.value.retry_in_ms is not None:
            break
    assert not errors[0].request_sent and "exited with code 3: boom: no token" in str(errors[0])
    assert "next start in" in str(errors[-1]) and 0 < (errors[-1].retry_in_ms or 0) <= 30_000
    stderr = [r.getMessage() for r in caplog.records if r.name == "rem.tools.server"]
    assert "broken: boom: no token" in stderr  # its stderr went to the log, line by line
    with pytest.raises(ToolUnavailable, match="is not known yet"):  # not ToolNotFound: it never listed
        await registry.spec("broken.anything")
    health = {h["server"]: h for h in registry.health()}
    broken = health["broken"]
    assert broken["state"] == "down" and broken["restarts"] >= 1 and broken["retry_at"] is not None
    assert "boom: no token" in str(broken["last_error"]) and broken["pid"] is None
    assert health["demo"]["state"] in ("up", "idle") and health["git"]["state"] in ("up", "idle")
    result = await registry.call("git.git_status", {"repo_path": str(dirs["repo"])}, idempotency_key="g-1")
    assert not result.is_error and "Repository status" in result.text


@pytest.mark.parametrize("server", ["demo", "web"])
async def test_a_call_sends_its_idempotency_key_in_meta(
    registry: ToolRegistry, dirs: dict[str, Path], server: str
) -> None:
    data = dirs["stdio" if server == "demo" else "http"]
    key = f"{server}-add-1"
    first = await registry.call(f"{server}.notes_add", {"text": "buy milk"}, idempotency_key=key)
    again = await registry.call(f"{server}.notes_add", {"text": "buy milk"}, idempotency_key=key)
    assert first.text.endswith(" added") and again.text.endswith(" already added") and not again.is_error
    assert [r["key"] for r in calls(data, tool="notes_add", phase="start")].count(key) == 2
    notes = [json.loads(line) for line in (data / "notes.jsonl").read_text().splitlines()]
    assert [n["key"] for n in notes].count(key) == 1  # the repeat changed nothing
    sent = await registry.call(
        f"{server}.outbox_send", {"to": "ops", "body": "hi", "delay_ms": 0}, idempotency_key=f"{server}-send"
    )
    outbox = [json.loads(line) for line in (data / "outbox.jsonl").read_text().splitlines()]
    assert "sent to ops" in sent.text and [o["key"] for o in outbox] == [f"{server}-send"]
    missing = await registry.call(f"{server}.notes_add", {}, idempotency_key=f"{server}-bad")
    assert missing.is_error and "text" in missing.text  # a tool-level error is a result


async def test_parallel_calls_share_one_session_and_overlap(
    registry: ToolRegistry, dirs: dict[str, Path]
) -> None:
    await registry.call("demo.notes_add", {"text": "buy milk"}, idempotency_key="par-note")
    keys = [f"par-{i}" for i in range(6)]
    results = await asyncio.gather(
        *(
            registry.call("demo.notes_search", {"query": "milk", "delay_ms": 400}, idempotency_key=k)
            for k in keys
        )
    )
    assert all("buy milk" in r.text and not r.is_error for r in results)
    starts = [r for r in calls(dirs["stdio"], tool="notes_search", phase="start") if r["key"] in keys]
    finishes = [r for r in calls(dirs["stdio"], tool="notes_search", phase="finish") if r["key"] in keys]
    assert len({r["pid"] for r in starts}) == 1 and len(starts) == 6
    assert max(r["time"] for r in starts) < min(r["time"] for r in finishes)  # all six ran at once


async def test_a_call_past_its_timeout_raises_tool_timeout_and_is_cancelled(
    registry: ToolRegistry, dirs: dict[str, Path]
) -> None:
    with pytest.raises(ToolTimeout) as caught:
        await registry.call("demo.notes_search", {"delay_ms": 10_000}, idempotency_key="slow-1")
    assert caught.value.request_sent and caught.value.timeout_ms == 1500 and "1500 ms" in str(caught.value)
    await until(
        lambda: calls(dirs["stdio"], key="slow-1", phase="cancelled"), "the server to cancel the call"
    )
    quick = await registry.call(
        "demo.notes_search", {"delay_ms": 2000}, idempotency_key="slow-2", timeout_ms=15_000
    )
    assert not quick.is_error


@pytest.mark.parametrize("server", ["demo", "web"])
async def test_huge_and_hostile_results_are_bounded_and_inert(registry: ToolRegistry, server: str) -> None:
    big = 5 * LIMITS.message_max_bytes
    huge = await registry.call(f"{server}.test_blob", {"size_bytes": big}, idempotency_key=f"{server}-huge")
    assert huge.is_error and "discarded" in huge.text and len(huge.text) < 200
    over = await registry.call(
        f"{server}.test_blob", {"size_bytes": 100_000}, idempotency_key=f"{server}-over"
    )
    assert (
        over.truncated and over.size_bytes == 100_000 and len(over.text.encode()) == LIMITS.result_max_bytes
    )
    assert len(over.for_model(LIMITS.model_max_bytes).encode()) < LIMITS.model_max_bytes + 100
    hostile = await registry.call(
        f"{server}.test_blob", {"size_bytes": 4000, "hostile": True}, idempotency_key=f"{server}-hostile"
    )
    assert not {"\x00", "\x1b", "\x07", "\r", "\x9b"} & set(hostile.text) and "\\x1b[31m" in hostile.text
    after = await registry.call(
        f"{server}.notes_search", {"query": "milk"}, idempotency_key=f"{server}-after"
    )
    assert not after.is_error  # the session survived


async def test_a_server_killed_mid_call_is_restarted_and_the_next_call_succeeds(
    registry: ToolRegistry, dirs: dict[str, Path]
) -> None:
    await registry.call("demo.notes_search", {}, idempotency_key="kill-0")  # up, whatever ran before
    pid = next(h["pid"] for h in registry.health() if h["server"] == "demo")
    assert isinstance(pid, int)
    call = asyncio.create_task(
        registry.call("demo.notes_search", {"delay_ms": 20_000}, idempotency_key="kill-1", timeout_ms=60_000)
    )
    await until(lambda: calls(dirs["stdio"], key="kill-1", phase="start"), "the call to start")
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ToolConnectionLost) as lost:
        await call
    assert lost.value.request_sent and "killed by SIGKILL" in str(lost.value)
    demo = next(h for h in registry.health() if h["server"] == "demo")
    assert demo["state"] == "down" and "SIGKILL" in str(demo["last_error"])
    result = await registry.call("demo.notes_search", {"query": "milk"}, idempotency_key="kill-2")
    assert not result.is_error
    demo = next(h for h in registry.health() if h["server"] == "demo")
    assert demo["state"] == "up" and demo["pid"] not in (None, pid) and demo["restarts"] >= 1
    assert {r["pid"] for r in calls(dirs["stdio"], key="kill-2")} == {demo["pid"]}


async def test_an_http_server_that_forgot_rems_session_runs_the_call_once(
    registry: ToolRegistry, dirs: dict[str, Path], http_demo: HttpDemo
) -> None:
    await registry.call("web.notes_search", {}, idempotency_key="gone-0")  # a session, whatever ran before
    http_demo.stop()
    http_demo.start()  # a new process on the same URL: rem's session id means nothing to it
    result = await registry.call("web.notes_add", {"text": "after restart"}, idempotency_key="gone-1")
    assert result.text.endswith(" added")
    assert len(calls(dirs["http"], key="gone-1", phase="start")) == 1  # refused unprocessed, then sent once
    web = next(h for h in registry.health() if h["server"] == "web")
    assert web["state"] == "up" and web["restarts"] >= 1


async def test_a_failed_start_is_logged_once_a_streak_and_the_start_that_ends_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rem.tools.servers")
    program = tmp_path / "late-server"  # missing until the test writes it
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"late": {"command": str(program)}}}))
    registry = await ToolRegistry.load(config_path=config, entry_points=[], limits=LIMITS)
    try:
        changes = registry.health_changes
        for _ in range(3):  # the first failure restarts at once, then it backs off: 2 failed starts
            await registry.catalogue()
        late = registry.health()[0]
        assert late["state"] == "down" and late["restarts"] == 1 and registry.health_changes > changes
        lines = [r for r in caplog.records if r.name == "rem.tools.servers"]
        assert [r.levelno for r in lines] == [logging.WARNING]
        assert f"tool server late cannot start: cannot run '{program}'" in lines[0].getMessage()
        assert "next start at its next use" in lines[0].getMessage()
        demo = " ".join([sys.executable, "-P", "-m", "backend.programs.demo_tools", "--data", str(tmp_path)])
        program.write_text(f"#!/bin/sh\nexec {demo}\n")
        program.chmod(0o755)
        retry_at = late["retry_at"] or 0
        await until(lambda: clock.now_ms() >= retry_at, "the backoff to end")
        await registry.catalogue()
        assert registry.health()[0]["state"] == "up"
        up = [r.getMessage() for r in caplog.records if r.name == "rem.tools.servers"][1:]
        assert up == ["tool server late is up (3 tools) again: it had failed to start"]
    finally:
        await registry.aclose()
