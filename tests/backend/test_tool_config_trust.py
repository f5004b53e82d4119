"""REM_MCP_CONFIG names the programs rem runs: refused when another user could change it, or what it names.

Also the config's other hostile shapes: `${VAR}` where a secret would leak (args, url),
a file nested past what json can read, a lone surrogate in a key or a value.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from backend.core import private
from backend.execution.tool_runner import ToolRunner
from backend.ops.tool_list import tools as tools_report
from backend.tools.config import load_config
from backend.tools.errors import ToolConfigError, ToolUnavailable
from backend.tools.health import Limits
from backend.tools.registry import ToolRegistry

LYING = Path(__file__).resolve().parents[1] / "lying_mcp_server.py"
NOBODY = 65534
LIMITS = Limits(timeout_ms=20_000, start_timeout_ms=60_000, result_max_bytes=4096, model_max_bytes=1024)


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")


def write(path: Path, value: Any, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    os.chmod(path, mode)
    return path


def refusal(path: Path) -> str:
    with pytest.raises(ToolConfigError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"REM_MCP_CONFIG {path}: ")
    return message


SERVERS = {"mcpServers": {"n": {"command": "python3"}}}


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o646, 0o620])
def test_a_config_group_or_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    config = write(tmp_path / "mcp.json", SERVERS, mode)
    message = refusal(config)
    assert f": (file): {config} is writable by group or others (mode {mode:03o})" in message
    assert message.endswith(f"so another user could change what rem runs; `chmod go-w {config}`")
    os.chmod(config, 0o644)  # others may read it: it holds no secret (those come from the environment)
    assert load_config(config, environ={}).servers["n"].name == "n"


def test_a_folder_on_its_path_others_can_write_is_refused_unless_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    config = write(shared / "deep" / "mcp.json", SERVERS, 0o644)
    os.chmod(shared, 0o777)  # anyone could rename deep/ and put a folder of their own in its place
    message = refusal(config)
    assert f"(file): the folder {shared} is writable by group or others (mode 777)" in message
    assert message.endswith(f"`chmod go-w {shared}`")
    os.chmod(shared, 0o1777)  # sticky, like /tmp: others may add entries, not replace ours
    assert load_config(config, environ={}).path == config
    os.chmod(shared / "deep", 0o775)
    assert "the folder " + str(shared / "deep") + " is writable" in refusal(config)


def test_a_config_or_a_folder_of_another_user_is_refused_but_roots_pass(tmp_path: Path) -> None:
    needs_root()
    config = write(tmp_path / "mcp.json", SERVERS, 0o644)
    os.chown(config, NOBODY, NOBODY)
    message = refusal(config)
    assert f"(file): {config} is owned by nobody (uid 65534), not by you (root) or root" in message
    assert message.endswith(f"`chown root {config}`, or keep it in a folder of your own")
    os.chown(config, 0, 0)
    os.chown(tmp_path, NOBODY, NOBODY)
    try:
        assert f"the folder {tmp_path} is owned by nobody" in refusal(config)
    finally:
        os.chown(tmp_path, 0, 0)
    assert load_config(config, environ={}).servers  # root's own, all the way up


def test_a_symlink_counts_by_its_owner_and_its_target_by_its_path(tmp_path: Path) -> None:
    needs_root()
    target = write(tmp_path / "real" / "mcp.json", SERVERS, 0o644)
    public = tmp_path / "public"
    public.mkdir(mode=0o1777)
    os.chmod(public, 0o1777)
    link = public / "mcp.json"
    link.symlink_to(target)
    assert load_config(link, environ={}).path == link
    os.lchown(link, NOBODY, NOBODY)  # another user's link in a sticky folder: they decide where it leads
    assert f"the symlink {link} is owned by nobody" in refusal(link)
    os.lchown(link, 0, 0)
    os.chmod(target, 0o666)  # the link is ours, the file it leads to is not safe
    assert f"{target} is writable by group or others (mode 666)" in refusal(link)


def _stdio(tmp_path: Path, **spec: Any) -> Path:
    return write(tmp_path / "mcp.json", {"mcpServers": {"n": {"command": sys.executable, **spec}}}, 0o600)


def test_the_files_it_points_to_are_held_to_the_same_rule(tmp_path: Path) -> None:
    script = write(tmp_path / "tools" / "server.py", "print('hi')\n", 0o644)
    work = tmp_path / "work"
    work.mkdir()
    config = _stdio(tmp_path, args=["-P", "../tools/server.py"], cwd="work")  # relative to its cwd
    assert load_config(config, environ={}).servers["n"].args == ("-P", "../tools/server.py")
    os.chmod(script, 0o666)
    assert f"mcpServers.n.args[1]: {script} is writable by group or others" in refusal(config)
    os.chmod(script, 0o644)
    os.chmod(work, 0o777)
    assert f"mcpServers.n.cwd: the folder {work} is writable" in refusal(config)
    os.chmod(work, 0o700)
    ran = write(tmp_path / "bin" / "server", "#!/bin/sh\n", 0o764)
    command = write(tmp_path / "mcp.json", {"mcpServers": {"n": {"command": "bin/server"}}}, 0o600)
    assert f"mcpServers.n.command: {ran} is writable by group or others (mode 764)" in refusal(command)
    ran.unlink()  # missing: the folder decides who may put one there
    os.chmod(ran.parent, 0o757)
    assert f"mcpServers.n.command: the folder {ran.parent} is writable" in refusal(command)


def test_every_reader_refuses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(tmp_path / "mcp.json", SERVERS, 0o666)
    monkeypatch.setenv("REM_MCP_CONFIG", str(config))
    runner = ToolRunner(db=lambda: None, owner_id="x", log=logging.getLogger("test"))  # type: ignore[arg-type,return-value]  # no store: it fails before
    for reader in (
        lambda: ToolRegistry.load(entry_points=[]),
        lambda: tools_report(),
        runner.registry,  # what an executor's step lists the tools through
    ):
        with pytest.raises(ToolConfigError, match="is writable by group or others"):
            asyncio.run(reader())


async def test_a_script_changed_to_be_exposed_after_the_load_does_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    spec = write(tmp_path / "spec.json", {"tools": [], "report": str(marker)}, 0o600)
    config = _stdio(tmp_path, args=["-P", str(LYING), str(spec)])
    async with await ToolRegistry.load(config_path=config, entry_points=[], limits=LIMITS) as registry:
        os.chmod(spec, 0o646)  # anyone may now say what the server does
        with pytest.raises(ToolUnavailable, match=r"its args\[2\]: .* is writable by group or others"):
            await registry.spec("n.peek")
        health = registry.health()[0]
        assert health["state"] == "down" and "chmod go-w" in str(health["last_error"])
        assert not marker.exists()  # refused before it was started
        os.chmod(spec, 0o600)
        await registry.catalogue()  # the first restart after a failure is not delayed
        assert registry.health()[0]["state"] == "up" and marker.exists()


def test_the_rule_in_private_is_the_data_dirs_with_root_and_sticky_folders(tmp_path: Path) -> None:
    mine = write(tmp_path / "f", "x", 0o644)
    assert private.exposed(mine) is None
    assert private.exposed(Path("/usr/bin/env")) is None  # root's, all the way up
    assert private.exposed(tmp_path / "missing" / "file") is None
    os.chmod(mine, 0o622)
    found = private.exposed(mine)
    assert found is not None and found.path == mine and found.fix == f"`chmod go-w {mine}`"
    weird = write(tmp_path / "a b;rm -rf x", "x", 0o666)
    found = private.exposed(weird)
    assert found is not None and found.fix == f"`chmod go-w '{weird}'`"  # quoted for a shell
    assert stat.S_IMODE(weird.stat().st_mode) == 0o666


VARIABLE_REFUSALS = [
    ({"command": "${BIN}"}, "mcpServers.n.command"),
    ({"command": "python3", "args": ["--token", "${TOKEN}"]}, "mcpServers.n.args[1]"),
    ({"command": "python3", "cwd": "${HOME}/x"}, "mcpServers.n.cwd"),
    ({"url": "https://h.example/mcp?key=${TOKEN}"}, "mcpServers.n.url"),
]


@pytest.mark.parametrize(("spec", "key"), VARIABLE_REFUSALS)
def test_a_variable_outside_env_and_headers_is_refused(tmp_path: Path, spec: Any, key: str) -> None:
    config = write(tmp_path / "mcp.json", {"mcpServers": {"n": spec}})
    with pytest.raises(ToolConfigError) as caught:
        load_config(config, environ={"TOKEN": "s3cret", "BIN": "/bin/x", "HOME": "/h"})
    message = str(caught.value)
    assert message.startswith(f"REM_MCP_CONFIG {config}: {key}: uses ${{")
    assert "rem reads variables only in env and headers" in message and "s3cret" not in message
    assert message.endswith('pass the secret to the server in "env" (stdio) or "headers" (HTTP)')


def test_variables_in_env_and_headers_are_read_from_the_environment(tmp_path: Path) -> None:
    config = write(
        tmp_path / "mcp.json",
        {
            "mcpServers": {
                "n": {"command": "python3", "env": {"TOKEN": "${TOKEN}", "MODE": "${MODE:-safe}"}},
                "w": {"url": "https://h.example/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}},
            }
        },
    )
    parsed = load_config(config, environ={"TOKEN": "s3cret"})
    assert parsed.servers["n"].env == {"TOKEN": "s3cret", "MODE": "safe"}  # type: ignore[union-attr]
    assert parsed.servers["w"].headers == {"Authorization": "Bearer s3cret"}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "text",
    [
        "[" * 200_000 + "]" * 200_000,
        '{"mcpServers": {"n": {"command": "x", "args": ' + "[" * 100_000 + "]" * 100_000 + "}}}",
        '{"a":' * 50_000 + "1" + "}" * 50_000,
    ],
    ids=["lists", "inside-args", "objects"],
)
def test_a_config_nested_too_deeply_is_one_line(tmp_path: Path, text: str) -> None:
    config = write(tmp_path / "mcp.json", text)
    assert refusal(config) == (
        f"REM_MCP_CONFIG {config}: (file): nests lists or objects too deeply to read; fix the JSON"
    )


SURROGATES = [
    ('{"mcpServers": {"n": {"command": "python3", "args": ["ok", "a\\ud800b"]}}}', "mcpServers.n.args[1]"),
    ('{"mcpServers": {"n": {"command": "py\\udfffthon"}}}', "mcpServers.n.command"),
    ('{"mcpServers": {"n": {"command": "x", "env": {"K": "\\ud800"}}}}', "mcpServers.n.env.K"),
    ('{"mcpServers": {"n": {"command": "x", "env": {"K\\ud800": "v"}}}}', "mcpServers.n.env.K\\ud800"),
    ('{"mcpServers": {"w": {"url": "http://h/mcp", "headers": {"X": "\\udc00"}}}}', "mcpServers.w.headers.X"),
    ('{"mcpServers": {}, "rem": {"tools": {"n.\\ud800": {}}}}', 'rem.tools."n.\\ud800"'),
]


@pytest.mark.parametrize(("text", "key"), SURROGATES)
def test_a_lone_surrogate_is_a_config_error_naming_its_key(tmp_path: Path, text: str, key: str) -> None:
    config = write(tmp_path / "mcp.json", text)
    message = refusal(config)
    assert message == (
        f"REM_MCP_CONFIG {config}: {key}: holds a lone surrogate (a \\ud800-\\udfff escape), "
        "which is no text; fix it"
    )
    message.encode("utf-8")  # printable and loggable: the key names it by its escape


def test_a_variable_whose_value_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    config = write(tmp_path / "mcp.json", {"mcpServers": {"n": {"command": "x", "env": {"K": "${RAW}"}}}})
    with pytest.raises(
        ToolConfigError, match=r"mcpServers.n.env.K: takes a variable whose value is not UTF-8"
    ):
        load_config(config, environ={"RAW": os.fsdecode(b"\xff\xfe")})
