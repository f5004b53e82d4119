"""rem as the MCP client of a hostile tool server (tests/hostile_mcp.py: raw JSON-RPC that misbehaves on purpose).

One registry for the module (one event loop), with one hostile server per
way of starting (a good listing over stdio and over HTTP, a silent
`initialize`, a garbage listing, one bad tool, a 2 MB schema, a listing over
the message bound); each test asks it to misbehave in one more way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
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

from backend import ops
from backend.chroma.server import free_port
from backend.cli.render_tools import print_tools
from backend.execution.tool_health import server_record
from backend.execution.tool_runner import ToolRunner
from backend.store.states import ToolCallState
from backend.tools.errors import ToolError, ToolTimeout
from backend.tools.health import Limits
from backend.tools.registry import ToolRegistry

pytestmark = pytest.mark.asyncio(loop_scope="module")

HOSTILE = [sys.executable, str(Path(__file__).parents[1] / "hostile_mcp.py")]
LIMITS = Limits(timeout_ms=20_000, start_timeout_ms=60_000)  # the message bound: 4 MB and a bit
DEADLINE_S = 60.0


async def until(predicate: Any, what: str, timeout: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def arrived(log: Path, key: str) -> bool:
    """The hostile server logged a tools/call with this idempotency key."""
    lines = log.read_text().splitlines() if log.exists() else []
    return any(json.loads(line)["key"] == key for line in lines)


def server(*args: str) -> dict[str, Any]:
    return {"command": HOSTILE[0], "args": [HOSTILE[1], *args]}


class HttpHostile:
    """The hostile server over HTTP (plain JSON responses) on a free port."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        args = [*HOSTILE, "--http", str(self.port), "--log", str(log)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + DEADLINE_S
        while not _accepts(self.port):
            assert self.process.poll() is None and time.monotonic() < deadline, "the HTTP hostile server"
            time.sleep(0.05)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(scope="module")
def http_hostile(root: Path) -> Iterator[HttpHostile]:
    hostile = HttpHostile(root / "web.jsonl")
    try:
        yield hostile
    finally:
        hostile.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def registry(root: Path, http_hostile: HttpHostile) -> AsyncIterator[ToolRegistry]:
    config = {
        "mcpServers": {
            "pay": server("--log", str(root / "pay.jsonl")),
            "web": {"url": http_hostile.url},
            "onebad": server("--listing", "one_bad"),
        }
    }
    path = root / "mcp.json"
    path.write_text(json.dumps(config))
    registry = await ToolRegistry.load(config_path=path, entry_points=[], limits=LIMITS)
    try:
        yield registry
    finally:
        await registry.aclose()


def runner_for(registry: ToolRegistry) -> ToolRunner:
    """An executor's ToolRunner over `registry`, to see what a call's ending makes of its row."""
    runner = ToolRunner(lambda: None, "test-owner", logging.getLogger("test"), registered=lambda: False)  # type: ignore[arg-type,return-value]
    runner._registry = registry
    return runner


def effect_row(tool: str, arguments: dict[str, Any], key: str) -> dict[str, Any]:
    return {"tool": tool, "arguments": json.dumps(arguments), "idempotency_key": key, "effect": "effect"}


# -- 3: a JSON-RPC error that arrived is the tool's answer; only a real loss or timeout is unknown


@pytest.mark.parametrize(
    ("tool", "code"),
    [("pay", -32000), ("pay", -32001), ("pay", -32603), ("web", -32000), ("web", -32001)],
)
async def test_a_json_rpc_error_answer_is_the_calls_error_not_an_unknown_outcome(
    registry: ToolRegistry, tool: str, code: int
) -> None:
    arguments = {"how": "error", "code": code, "message": "payment refused by bank \x1b[31m"}
    key = f"refused-{tool}{code}"
    outcome = await runner_for(registry)._call(effect_row(f"{tool}.send_payment", arguments, key))
    assert outcome.state == ToolCallState.COMPLETED and outcome.is_error, outcome  # answered: not held
    assert outcome.result is not None and "payment refused by bank" in outcome.result
    assert "\x1b" not in outcome.result  # the message is inert
    again = await registry.call(f"{tool}.send_payment", arguments, idempotency_key=key + "-again")
    assert again.is_error and again.error_code == code


async def test_an_effect_whose_server_is_killed_mid_call_is_unknown(
    registry: ToolRegistry, root: Path
) -> None:
    await registry.call("pay.lookup", {"query": "up"}, idempotency_key="kill-0")
    pid = next(h["pid"] for h in registry.health() if h["server"] == "pay")
    assert isinstance(pid, int)
    row = effect_row("pay.send_payment", {"how": "hang"}, "kill-1")
    call = asyncio.create_task(runner_for(registry)._call(row))
    await until(lambda: arrived(root / "pay.jsonl", "kill-1"), "the call to reach the server")
    os.kill(pid, signal.SIGKILL)
    outcome = await call
    assert outcome.state == ToolCallState.UNKNOWN, outcome
    assert "died during the call (was killed by SIGKILL)" in str(outcome.reason), outcome
    # the next start is immediate after one death: the server is back for the next test
    assert not (await registry.call("pay.lookup", {"query": "back"}, idempotency_key="kill-2")).is_error


@pytest.mark.parametrize("tool", ["pay", "web"])
async def test_an_effect_that_times_out_is_unknown(registry: ToolRegistry, tool: str) -> None:
    with pytest.raises(ToolTimeout) as caught:
        await registry.call(
            f"{tool}.send_payment", {"how": "hang"}, idempotency_key=f"late-{tool}", timeout_ms=300
        )
    assert caught.value.outcome_unknown and "300 ms" in str(caught.value)
    assert not (
        await registry.call(f"{tool}.lookup", {"query": "after"}, idempotency_key=f"after-{tool}")
    ).is_error


# -- 7: an answer rem cannot read fails the call at once; one bad tool does not take its server down


async def test_a_lone_surrogate_in_an_answer_is_read_as_a_replacement_character(
    registry: ToolRegistry,
) -> None:
    result = await registry.call("pay.send_payment", {"how": "surrogate"}, idempotency_key="sur-1")
    assert not result.is_error and result.text == "paid \ufffd twice"


@pytest.mark.parametrize(
    ("tool", "how"),
    [("pay", "bad_utf8"), ("pay", "result5"), ("web", "bad_utf8"), ("web", "result5"), ("web", "surrogate")],
)
async def test_an_unreadable_answer_fails_at_once_and_an_effect_is_unknown(
    registry: ToolRegistry, tool: str, how: str
) -> None:
    """Over HTTP the SDK parses the answer: a lone surrogate is unreadable there, not replaced."""
    row = effect_row(f"{tool}.send_payment", {"how": how}, f"bad-{tool}-{how}")
    outcome = await runner_for(registry)._call(row)
    assert outcome.state == ToolCallState.UNKNOWN, outcome  # the server answered, but with what?
    assert "cannot read" in str(outcome.reason) and "did not answer" not in str(outcome.reason)
    read = {**row, "effect": "read", "idempotency_key": f"bad-{tool}-{how}-read"}
    outcome = await runner_for(registry)._call(read)
    assert outcome.state == ToolCallState.ERROR and "cannot read" in str(outcome.result)
    after = await registry.call(f"{tool}.lookup", {"query": how}, idempotency_key=f"after-{tool}-{how}")
    assert not after.is_error  # the session survived


async def test_one_bad_tool_in_a_listing_is_refused_and_the_others_are_offered(
    registry: ToolRegistry,
) -> None:
    specs = {spec.name: spec for spec in await registry.catalogue()}
    assert specs["onebad.lookup"].available and specs["onebad.send_payment"].available
    refused = [r for r in registry.refused() if r.server == "onebad"]
    assert len(refused) == 2 and {r.tool for r in refused} >= {"broken"}
    assert all("not a valid MCP tool" in r.reason for r in refused), refused
    result = await registry.call("onebad.lookup", {"query": "x"}, idempotency_key="onebad-1")
    assert result.text == "found x"


# -- 4: a tool's inputSchema is bounded like its description


async def test_a_tool_whose_schema_is_over_the_bound_is_refused_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.WARNING, logger="rem.tools")
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"big": server("--listing", "big_schema")}}))
    report = await ops.tools(config_path=path)  # what `rem tools` shows
    assert report["ok"] and {t["name"] for t in report["tools"]} == {"big.lookup", "big.send_payment"}
    [refused] = report["servers"][0]["refused"]
    assert refused["tool"] == "big" and re.search(r"inputSchema of \d+ bytes, over", refused["reason"])
    logged = [r.getMessage() for r in caplog.records if "tool big is refused" in r.getMessage()]
    assert len(logged) == 1 and "REM_TOOL_SCHEMA_MAX_BYTES (65536)" in logged[0], logged
    print_tools(report)
    assert "refused: big.big: it has an inputSchema of" in capsys.readouterr().out
    async with await ToolRegistry.load(config_path=path, entry_points=[], limits=LIMITS) as registry:
        offered = json.dumps([spec.openai_tool() for spec in await registry.catalogue()])
        assert len(offered) < 10_000  # what goes into every model request (it was over 2 MB)
        assert not (await registry.call("big.lookup", {"query": "y"}, idempotency_key="big-1")).is_error


# -- 8: a start that fails says why


@pytest.mark.parametrize(
    ("listing", "cause"),
    [
        ("garbage", r"cannot start: its tools/list answer is not valid MCP \(tools: "),
        ("oversize", r"cannot start: its tools/list answer was over \d+ bytes"),
    ],
)
async def test_a_failed_start_says_what_happened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, listing: str, cause: str
) -> None:
    caplog.set_level(logging.WARNING, logger="rem.tools.servers")
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"bad": server("--listing", listing)}}))
    async with await ToolRegistry.load(config_path=path, entry_points=[], limits=LIMITS) as registry:
        with pytest.raises(ToolError) as caught:
            await registry.call("bad.lookup", {}, idempotency_key="start-1")
        [health] = registry.health()
    assert re.search(cause, str(caught.value)) and "exited" not in str(caught.value), caught.value
    record = server_record(health)  # what the executor records for rem status
    assert record is not None and re.search(cause, str(record["error"])), record
    logged = [r.getMessage() for r in caplog.records if "tool server bad cannot start" in r.getMessage()]
    assert len(logged) == 1 and re.search(cause, logged[0]), logged


async def test_a_server_that_never_answers_initialize_says_so(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"silent": server("--init", "silent")}}))
    limits = Limits(start_timeout_ms=1000)
    async with await ToolRegistry.load(config_path=path, entry_points=[], limits=limits) as registry:
        await registry.catalogue()
        [health] = registry.health()
    assert health["state"] == "down"
    assert "no answer to initialize within 1000 ms" in str(health["last_error"]), health


# -- 10: a flood of log notifications and stderr lines is sampled, and says how much it dropped


async def test_a_flood_of_log_lines_is_rate_limited_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rem.tools")
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"flood": server()}}))
    started = time.monotonic()
    async with await ToolRegistry.load(config_path=path, entry_points=[], limits=LIMITS) as registry:
        result = await registry.call("flood.send_payment", {"how": "flood", "n": 5000}, idempotency_key="f-1")
        assert result.text == "flooded"
    elapsed = time.monotonic() - started
    lines = [r.getMessage() for r in caplog.records if "flood" in r.getMessage()]
    passed = [line for line in lines if re.search(r"flood \d+ x", line)]
    reports = [re.search(r"dropped ([\d]+) of ([\d]+) lines", line) for line in lines]
    counts = [(int(m.group(1)), int(m.group(2))) for m in reports if m]
    assert counts, lines[-5:]
    dropped, offered = sum(c[0] for c in counts), sum(c[1] for c in counts)
    assert offered >= 9_500 and dropped + len(passed) == offered, (dropped, len(passed), offered)
    assert len(passed) <= 200 + 20 * elapsed + 20, (len(passed), elapsed)
