"""Tool sources without a server: REM_MCP_CONFIG's errors, effect classes, names, bounds, Python tools."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from backend.tools.config import StdioServer, load_config
from backend.tools.effects import EffectClass, Permission, Source, ToolSettings, resolve
from backend.tools.errors import ToolConfigError, ToolNotFound, ToolTimeout
from backend.tools.health import Limits
from backend.tools.lines import OVERSIZE_CODE, LineBuffer, Overflow, oversize_answer
from backend.tools.registry import ToolRegistry
from backend.tools.results import bounded_result, inert
from backend.tools.spec import source_name_problem, split_name, tool_name_problem
from tests.backend import tool_plugins

STDIO = {"command": "python3"}

CONFIG_ERRORS: list[tuple[Any, str, str]] = [
    # (file content, the key the error names, a piece of what it says)
    ("{not json", "line 1 column 2", "is not valid JSON"),
    ({"servers": {}}, "servers", "is not a key rem knows"),
    ({"mcpServers": []}, "mcpServers", "must be a JSON object, not a list"),
    ({"mcpServers": {"a b": STDIO}}, "mcpServers.a b", "may hold only letters"),
    ({"mcpServers": {"a__b": STDIO}}, "mcpServers.a__b", "may not hold '__'"),
    ({"mcpServers": {"notes_": STDIO}}, "mcpServers.notes_", "may not end in '_'"),
    ({"mcpServers": {"n": {"command": "x", "args": "-v"}}}, "mcpServers.n.args", "must be a list of strings"),
    ({"mcpServers": {"n": {"command": "x", "args": ["-v", 3]}}}, "mcpServers.n.args[1]", "must be a string"),
    ({"mcpServers": {"n": {"command": "x", "env": {"K": 1}}}}, "mcpServers.n.env.K", "must be a string"),
    ({"mcpServers": {"n": {"command": "x", "autoApprove": []}}}, "mcpServers.n.autoApprove", "not a key"),
    ({"mcpServers": {"n": {"args": []}}}, "mcpServers.n", "has no command"),
    ({"mcpServers": {"n": {"command": "x", "url": "http://h/mcp"}}}, "mcpServers.n", "has both command"),
    ({"mcpServers": {"n": {"type": "sse", "url": "http://h/sse"}}}, "mcpServers.n.type", "SSE transport"),
    ({"mcpServers": {"n": {"url": "ftp://h/mcp"}}}, "mcpServers.n.url", "not an http"),
    ({"mcpServers": {"n": {"url": "https://u:p@h/mcp"}}}, "mcpServers.n.url", "user:password@"),
    (
        {"mcpServers": {"n": {"command": "x", "env": {"K": "${REM_TEST_UNSET_VAR}"}}}},
        "mcpServers.n.env.K",
        "uses ${REM_TEST_UNSET_VAR}, which is not set",
    ),
    ({"mcpServers": {"n": {"command": "${X}"}}}, "mcpServers.n.command", "only in env and headers"),
    (
        {"mcpServers": {"n": {"url": "http://h", "headers": {"a b": "c"}}}},
        "mcpServers.n.headers.a b",
        "header",
    ),
    ({"mcpServers": {"n": STDIO}, "rem": {"tools": {"n": {}}}}, 'rem.tools."n"', "is not NAME.TOOL"),
    ({"mcpServers": {"n": STDIO}, "rem": {"tool": {}}}, "rem.tool", "is not a key rem knows"),
    ({"rem": {"tools": {"n.t": {"effect": "write"}}}}, 'rem.tools."n.t".effect', "read, idempotent, effect"),
    ({"rem": {"tools": {"n.t": {"permission": "yes"}}}}, 'rem.tools."n.t".permission', "allow, ask, deny"),
    ({"rem": {"tools": {"n.t": {"timeout_ms": "5s"}}}}, 'rem.tools."n.t".timeout_ms', "whole number"),
    ({"rem": {"tools": {"n.t": {"timeout_ms": 0}}}}, 'rem.tools."n.t".timeout_ms', "whole number"),
    ({"rem": {"tools": {"n.t": {"retries": 2}}}}, 'rem.tools."n.t".retries', "not a key"),
    ('{"mcpServers": {"n": {"command": "a"}, "n": {"command": "b"}}}', "'n'", "appears twice"),
]


@pytest.mark.parametrize(("content", "key", "says"), CONFIG_ERRORS)
def test_every_config_mistake_is_one_line_naming_file_key_and_fix(
    tmp_path: Path, content: Any, key: str, says: str
) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ToolConfigError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert message.startswith(f"REM_MCP_CONFIG {path}: {key}: "), message
    assert says in message and "\n" not in message
    assert "; " in message.split(f"{key}: ", 1)[1]  # what is wrong; then the fix


def test_an_unreadable_config_and_an_unknown_source_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ToolConfigError, match="cannot be read .No such file or directory"):
        load_config(tmp_path / "missing.json")
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"notes": STDIO}, "rem": {"tools": {"ledger.post": {}}}}))
    with pytest.raises(ToolConfigError, match=r"rem.tools.\"ledger.post\": names 'ledger', which is no"):
        _load(ToolRegistry.load(config_path=path, entry_points=[]))


def test_the_mcp_servers_shape_parses_with_variables_and_paths(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    config = {
        "mcpServers": {
            "notes": {
                "command": "python3",
                "args": ["-m", "x", "/h"],
                "env": {"T": "${TOKEN:-none}"},
            },
            "web": {
                "type": "http",
                "url": "https://h.example/mcp",
                "headers": {"Authorization": "Bearer ${WEB_KEY}"},
            },
            "local": {"command": "./bin/server", "cwd": "sub"},
        },
        "rem": {"tools": {"web.*": {"effect": "read"}, "web.post": {"permission": "deny", "timeout_ms": 5}}},
    }
    path.write_text(json.dumps(config))
    parsed = load_config(path, environ={"TOKEN": "s3cret", "WEB_KEY": "k"})
    notes = parsed.servers["notes"]
    assert isinstance(notes, StdioServer) and notes.args == ("-m", "x", "/h") and notes.env == {"T": "s3cret"}
    assert notes.cwd == tmp_path / "." and parsed.servers["local"].cwd == tmp_path / "sub"  # type: ignore[union-attr]
    assert parsed.servers["web"].headers == {"Authorization": "Bearer k"}  # type: ignore[union-attr]
    assert parsed.settings_for("web", "post") == ToolSettings(EffectClass.READ, Permission.DENY, 5)
    assert parsed.settings_for("web", "get") == ToolSettings(effect=EffectClass.READ)
    assert load_config(path, environ={"WEB_KEY": "k"}).servers["notes"].env == {"T": "none"}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("annotations", "settings", "expected"),
    [
        ({"readOnlyHint": True}, ToolSettings(), ("read", "annotation", "allow", "default")),
        (
            {"idempotentHint": True, "destructiveHint": True},
            ToolSettings(),
            ("idempotent", "annotation", "allow", "default"),
        ),
        (
            {"readOnlyHint": False, "idempotentHint": False},
            ToolSettings(),
            ("effect", "annotation", "ask", "default"),
        ),
        ({"destructiveHint": True}, ToolSettings(), ("effect", "annotation", "ask", "default")),
        # a pair that contradicts itself is a lie somewhere: the worse half counts
        (
            {"readOnlyHint": True, "destructiveHint": True},
            ToolSettings(),
            ("effect", "annotation", "ask", "default"),
        ),
        (
            {"read_only_hint": True, "idempotent_hint": False},
            ToolSettings(),
            ("effect", "annotation", "ask", "default"),
        ),
        (
            {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True},
            ToolSettings(),
            ("read", "annotation", "allow", "default"),
        ),
        (
            {"readOnlyHint": True, "destructiveHint": True},
            ToolSettings(effect=EffectClass.READ),
            ("read", "config", "allow", "default"),
        ),
        ({}, ToolSettings(), ("effect", "default", "ask", "default")),
        ({"openWorldHint": True, "title": "t"}, ToolSettings(), ("effect", "default", "ask", "default")),
        (
            {"readOnlyHint": True},
            ToolSettings(effect=EffectClass.EFFECT),
            ("effect", "config", "ask", "default"),
        ),
        ({}, ToolSettings(effect=EffectClass.READ), ("read", "config", "allow", "default")),
        (
            {"readOnlyHint": True},
            ToolSettings(permission=Permission.DENY),
            ("read", "annotation", "deny", "config"),
        ),
    ],
)
def test_effect_class_and_permission_resolve_with_their_sources(
    annotations: dict[str, Any], settings: ToolSettings, expected: tuple[str, str, str, str]
) -> None:
    resolved = resolve(annotations, settings, default_timeout_ms=60_000)
    got = (resolved.effect, resolved.effect_source, resolved.permission, resolved.permission_source)
    assert got == expected
    assert (resolved.timeout_ms, resolved.timeout_source) == (60_000, Source.DEFAULT)
    timed = resolve(annotations, ToolSettings(timeout_ms=5), default_timeout_ms=60_000)
    assert (timed.timeout_ms, timed.timeout_source) == (5, Source.CONFIG)


def test_names_map_one_to_one_and_unfit_tool_names_are_refused() -> None:
    assert source_name_problem("git-2_a") is None
    assert split_name("git.git_commit") == ("git", "git_commit") == split_name("git__git_commit")
    assert split_name("a_b__c__d") == ("a_b", "c__d")  # the first __ ends NAME: NAME holds none
    assert split_name("nothing") is None and split_name("bad name.x") is None
    assert tool_name_problem("git", "git_commit") is None
    assert "rename it in the server" in (tool_name_problem("git", "commit.all") or "")
    assert "over 64" in (tool_name_problem("git", "x" * 60) or "")


def test_results_are_bounded_and_inert() -> None:
    hostile = "ok\x00\x1b[2J\x07\r\n\t\x9b\ud800é" * 3
    text = inert(hostile)
    assert "\x00" not in text and "\x1b" not in text and "\x9b" not in text and "\r" not in text
    assert "\\x1b[2J" in text and "\n\t" in text and "\ufffd" in text and "é" in text
    result = bounded_result("é" * 1000, is_error=False, max_bytes=501)
    assert result.truncated and result.size_bytes == 2000 and len(result.text.encode()) == 500
    shown = result.for_model(100)
    assert shown.startswith("é" * 50) and "2000 bytes; only the first 100" in shown
    small = bounded_result("fine", is_error=True, max_bytes=501)
    assert small.for_model(100) == "fine" and small.is_error and not small.truncated


def test_a_line_over_the_bound_is_discarded_as_it_streams_and_answered() -> None:
    lines = LineBuffer(max_bytes=64)
    assert lines.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    head = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"'
    out = lines.feed(b":2}\n" + head + b"x" * 10)
    assert out[0] == b'{"b":2}' and isinstance(out[1], Overflow) and out[1].head.startswith(head[:60])
    assert lines.feed(b"y" * 100_000) == [] and lines.size == 0  # nothing of it is kept
    assert lines.feed(b'"}}\n{"c":3}\n') == [b'{"c":3}']
    answer = oversize_answer(out[1].head, 64)
    assert answer is not None and answer["id"] == 7 and answer["error"]["code"] == OVERSIZE_CODE
    assert oversize_answer(b'{"jsonrpc":"2.0","method":"x","id":3,"params":', 64) is None
    assert oversize_answer(b'{"jsonrpc":"2.0","result":{"id":9', 64) is None


LIMITS = Limits(timeout_ms=2_000, result_max_bytes=1024, model_max_bytes=256)


def _entry(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group="rem.tools")


def _load(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


async def test_python_tools_come_from_entry_points() -> None:
    tool_plugins.CALLS.clear()
    entry_points = [
        _entry("ledger", "tests.backend.tool_plugins:make_tools"),
        _entry("gone", "no_such_module:x"),
    ]
    async with await ToolRegistry.load(
        config_path=None, entry_points=entry_points, limits=LIMITS
    ) as registry:
        specs = {spec.name: spec for spec in await registry.catalogue()}
        assert set(specs) == {"ledger.add", "ledger.fail", "ledger.stall"}
        add = specs["ledger.add"]
        assert (add.kind, add.model_name, add.effect, add.effect_source) == (
            "python",
            "ledger__add",
            "read",
            "annotation",
        )
        assert (specs["ledger.stall"].effect, specs["ledger.stall"].permission) == ("effect", "ask")
        assert [r.tool for r in registry.refused()] == ["bad.name"]
        health = {h["server"]: h for h in registry.health()}
        assert health["ledger"]["state"] == "up" and health["ledger"]["refused"][0]["tool"] == "bad.name"
        assert (
            health["gone"]["state"] == "down"
            and "No module named 'no_such_module'" in health["gone"]["last_error"]
        )

        result = await registry.call("ledger__add", {"a": 2, "b": 3}, idempotency_key="k-1")
        assert json.loads(result.text) == {"sum": 5, "key": "k-1"} and not result.is_error
        refused = await registry.call("ledger.add", {"a": "two"}, idempotency_key="k-2")
        assert refused.is_error and "invalid arguments" in refused.text and len(tool_plugins.CALLS) == 1
        failed = await registry.call("ledger.fail", {}, idempotency_key="k-3")
        assert failed.is_error and failed.text == "RuntimeError: the ledger is closed\\x1b[2J"
        with pytest.raises(ToolTimeout) as timed_out:
            await registry.call("ledger.stall", {}, idempotency_key="k-4", timeout_ms=50)
        assert timed_out.value.request_sent
        with pytest.raises(ToolNotFound, match="refused"):
            await registry.spec("ledger.bad.name")
        with pytest.raises(ToolNotFound, match="no tool source 'nope'"):
            await registry.call("nope.x", {}, idempotency_key="k-5")
    assert [call[2] for call in tool_plugins.CALLS] == ["k-1", "k-3", "k-4"]


def test_a_name_used_twice_across_servers_and_entry_points_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"ledger": STDIO}}))
    plugin = _entry("ledger", "tests.backend.tool_plugins:make_tools")
    with pytest.raises(ToolConfigError, match="mcpServers.ledger: 'ledger' is also a rem.tools entry point"):
        _load(ToolRegistry.load(config_path=path, entry_points=[plugin]))
    with pytest.raises(ToolConfigError, match="two rem.tools entry points are named 'ledger'"):
        _load(ToolRegistry.load(config_path=None, entry_points=[plugin, plugin]))
    with pytest.raises(ToolConfigError, match="entry point 'led__ger'"):
        _load(ToolRegistry.load(config_path=None, entry_points=[_entry("led__ger", "x:y")]))
