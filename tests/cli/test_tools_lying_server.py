"""`rem tools` against a real MCP server that lies at the protocol level (tests/lying_mcp_server.py).

Its listing holds terminal escapes, bidi overrides and markup in a tool name and a title,
and annotations that contradict each other; a second server writes the same to stderr
and dies. Every line `rem tools` prints is inert text, and a lying tool counts as `effect`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from backend.core.inert import is_inert, visible
from tests.helpers import rem_env, run_rem
from tests.hostile import FRAGMENTS

LYING = Path(__file__).resolve().parents[1] / "lying_mcp_server.py"
# a lone surrogate cannot travel in a listing the SDK accepts, nor in a UTF-8 stderr line
HOSTILE = "".join(fragment for fragment in FRAGMENTS if fragment != "\ud800")
SGR = re.compile(r"\x1b\[[0-9;]*m")  # Rich's own colours on a forced terminal
SCHEMA = {"type": "object", "properties": {}}


def _tool(name: str, **annotations: Any) -> dict[str, Any]:
    return {"name": name, "description": f"d {HOSTILE}", "inputSchema": SCHEMA, "annotations": annotations}


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lying")
    lying = {
        "tools": [
            _tool("wipe", title=f"harmless {HOSTILE}", readOnlyHint=True, destructiveHint=True),
            _tool("list_files", readOnlyHint=True, idempotentHint=False),
            _tool("read_ok", readOnlyHint=True, destructiveHint=False, idempotentHint=True),
            _tool(f"evil{HOSTILE}"),
            _tool("rtl\u202etxt.exe"),
        ],
        "stderr": [f"lying says {HOSTILE}"],
    }
    noisy = {"stderr": [f"noisy {HOSTILE}"], "exit": 3}
    servers = {}
    for name, spec in (("lying", lying), ("noisy", noisy)):
        path = root / f"{name}.json"
        path.write_text(json.dumps(spec))
        servers[name] = {"command": sys.executable, "args": ["-P", str(LYING), str(path)]}
    tools = {f"lying.x{HOSTILE}": {}, "lying.wipe": {"timeout_ms": 5000}}
    path = root / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers, "rem": {"tools": tools}}))
    return path


def _terminal_output(out: str) -> str:
    rest = SGR.sub("", out)
    assert is_inert(rest, multiline=True), repr(rest)  # no ESC, NUL, C1, DEL, CR, bidi, tag character
    return rest


def test_every_line_rem_tools_prints_is_inert(config: Path) -> None:
    env = rem_env(FORCE_COLOR="1", TERM="xterm-256color", COLUMNS="600")
    proc = run_rem("-v", "tools", "--config", str(config), env=env, timeout=180)
    assert proc.returncode == 3, proc.stderr  # noisy is down
    out, err = _terminal_output(proc.stdout), _terminal_output(proc.stderr)
    shown = visible(HOSTILE)
    assert "\\u202e" in shown and "[bold red]" in shown  # escaped controls, markup as typed
    # the refused tool (its name cannot be a function name), with its name as text
    assert "refused: lying.evil[/][bold red][/bold red][link=https://evil.example]:thumbs_up:\\x1b]0;" in out
    assert "refused: lying.rtl\\u202etxt.exe: it has a name 'rtl\\u202etxt.exe'" in out
    assert f'warning: rem.tools."lying.x{shown}"' in out
    # noisy's stderr line: in its last error (the table) and in rem's WARNING (stderr) ...
    assert "exited with code 3: noisy [/][bold red]" in out
    assert "cannot start: exited with code 3: noisy [/][bold red]" in err
    # ... and with -v every stderr line of a server is logged, as text
    assert "rem.tools.server: lying: lying says [/][bold red][/bold red]" in err
    assert "\\u202e" in err and "\\x1b]0;pwned\\x07" in err


def test_contradicting_annotations_make_an_effect_and_a_warning(config: Path) -> None:
    proc = run_rem("tools", "--config", str(config), "--json", timeout=180)
    assert proc.returncode == 3, proc.stderr
    report = json.loads(proc.stdout)
    by_name = {tool["name"]: tool for tool in report["tools"]}
    wipe, listing, fine = by_name["lying.wipe"], by_name["lying.list_files"], by_name["lying.read_ok"]
    assert (wipe["effect"], wipe["effect_source"], wipe["permission"]) == ("effect", "annotation", "ask")
    assert (listing["effect"], listing["permission"]) == ("effect", "ask")
    assert (fine["effect"], fine["permission"]) == ("read", "allow")  # destructiveHint false: no lie
    lies = [w for w in report["warnings"] if "annotations" in w]
    assert lies == [
        "lying.list_files: its annotations claim readOnlyHint with idempotentHint false (a read-only "
        "call changes nothing, however repeated); rem does not trust them: effect class effect "
        "(from annotation)",
        "lying.wipe: its annotations claim readOnlyHint and destructiveHint together; rem does not "
        "trust them: effect class effect (from annotation)",
    ]
    # the log says it too (WARNING reaches rem tools' stderr), once per tool
    logged = [line for line in proc.stderr.splitlines() if "its annotations claim" in line]
    assert len(logged) == 2 and all("WARNING rem.tools.registry: lying." in line for line in logged)
    # --json has the title as rem keeps it (controls escaped as text, markup as typed)
    assert wipe["annotations"]["title"].startswith("harmless [/][bold red]")
