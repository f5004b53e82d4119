"""`rem tools`: its JSON is pinned (normalised for pids and times), its exit codes and its one-line errors.

Regenerate the golden file (REM_GOLDEN_UPDATE=1) only for a deliberate, documented change of output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from backend.programs.demo_tools import server_config
from tests.helpers import REM, rem_env, run_rem

GOLDEN = Path(__file__).with_name("golden") / "tools_demo.json"


def normalised(report: dict[str, Any], config: Path) -> dict[str, Any]:
    """The report with what differs between runs (pids, times, temp paths) replaced by placeholders."""
    text = json.dumps(report).replace(str(config.parent), "<dir>")
    out = json.loads(text)
    for server in out["servers"]:
        for key in ("pid", "since", "retry_at"):
            if server[key] is not None:
                server[key] = f"<{key}>"
    return out


def test_rem_tools_json_lists_every_tool_with_its_class_source_and_health(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    servers = {
        "demo": server_config(tmp_path / "demo"),
        "broken": {
            "command": sys.executable,
            "args": ["-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"],
        },
    }
    tools = {
        "demo.notes_search": {"timeout_ms": 5000},
        "demo.outbox_send": {"permission": "deny"},
        "demo.gone": {},
    }
    config.write_text(json.dumps({"mcpServers": servers, "rem": {"tools": tools}}))
    proc = run_rem("tools", "--config", str(config), "--json", timeout=180)
    assert proc.returncode == 3, proc.stderr  # a server is down: a dependency is unreachable
    # a server's stderr goes to the log, not to rem's terminal: only rem's own one line says why
    # it could not start (WARNING), its last stderr line quoted there
    [failed] = [line for line in proc.stderr.splitlines() if "boom" in line]
    assert "tool server broken cannot start: exited with code 3: boom; its tools are unavailable" in failed
    report = normalised(json.loads(proc.stdout), config)
    if os.environ.get("REM_GOLDEN_UPDATE"):
        GOLDEN.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    assert report == json.loads(GOLDEN.read_text())
    # what the golden file pins, said plainly
    by_name = {tool["name"]: tool for tool in report["tools"]}
    assert (
        by_name["demo.outbox_send"]["effect"] == "effect"
        and by_name["demo.outbox_send"]["permission"] == "deny"
    )
    assert by_name["demo.notes_add"]["effect_source"] == "annotation" and "demo.gone" not in by_name
    assert report["warnings"] == ["rem.tools.\"demo.gone\": 'demo' offers no tool 'gone'"]
    assert [s["state"] for s in report["servers"]] == ["down", "up"] and not report["ok"]


def test_rem_tools_errors_are_one_line_and_no_config_is_fine(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"notes": {"command": "x", "args": "-v"}}}))
    proc = run_rem("tools", "--config", str(config), "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr
        == f'rem: error: REM_MCP_CONFIG {config}: mcpServers.notes.args: must be a list of strings, not a string; write ["a", "b"]\n'
    )
    env = rem_env()
    env.pop("REM_MCP_CONFIG", None)
    proc = run_rem("tools", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"config": None, "ok": True, "servers": [], "tools": [], "warnings": []}
    proc = run_rem("tools", env={**env, "REM_MCP_CONFIG": str(tmp_path / "nope.json")})
    assert proc.returncode == 2 and "cannot be read (No such file or directory)" in proc.stderr
    (tmp_path / "empty.json").write_text('{"mcpServers": {}}')
    relative = {**env, "REM_MCP_CONFIG": "empty.json"}  # pinned absolute for what rem starts elsewhere
    proc = subprocess.run(
        [REM, "tools", "--json"], cwd=tmp_path, env=relative, capture_output=True, text=True
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["config"] == str(tmp_path / "empty.json")


def test_the_demos_tools_config_offers_notes_at_once_and_sends_after_approval(tmp_path: Path) -> None:
    """`rem demo`'s REM_MCP_CONFIG, read by `rem tools` against the real demo server it starts."""
    from backend.programs.demo import write_tools_config

    config = write_tools_config(tmp_path)
    assert config == tmp_path / "mcp.json" and oct(config.stat().st_mode & 0o777) == "0o600"
    proc = run_rem("tools", "--config", str(config), "--json", timeout=180)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    by_name = {tool["name"]: tool for tool in report["tools"]}
    assert (by_name["demo.outbox_send"]["effect"], by_name["demo.outbox_send"]["permission"]) == (
        "effect",
        "ask",
    )
    assert by_name["demo.notes_add"]["permission"] == "allow" and report["warnings"] == []
