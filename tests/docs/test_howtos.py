"""The how-tos' code runs as the pages show it: the agent plug-ins of docs/your-agent.md, the
Python tool and the demo tools config of docs/your-tools.md.

Each test takes the code from the page itself (its fenced blocks), so an edit that
breaks the example breaks the test.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from types import ModuleType

import pytest

from backend.execution import sessions
from backend.execution.executor import Executor
from backend.runtime.context import Context
from backend.tools.registry import ToolRegistry
from tests.docs.pages import DOCS, Block, code_blocks
from tests.docs.test_getting_started import matches
from tests.fake_openai import FakeOpenAIServer
from tests.helpers import rem_env, run_rem

AGENT_PAGE = DOCS / "your-agent.md"
TOOLS_PAGE = DOCS / "your-tools.md"


def block(page: Path, lang: str, containing: str) -> Block:
    (found,) = [b for b in code_blocks(page) if b.lang == lang and containing in b.text]
    return found


def after(page: Path, first: Block) -> Block:
    """The block right after `first` on its page (its expected output)."""
    blocks = list(code_blocks(page))
    return blocks[[b.line for b in blocks].index(first.line) + 1]


@pytest.fixture
def module_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder on sys.path for the page's modules, taken off again (with the modules) after."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    before = set(sys.modules)
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        for name in set(sys.modules) - before:
            if getattr(sys.modules[name], "__file__", "") and str(folder) in str(sys.modules[name].__file__):
                del sys.modules[name]


def _module(folder: Path, name: str, source: str) -> ModuleType:
    (folder / f"{name}.py").write_text(source)
    return __import__(name)


def test_the_minimal_agent_answers_a_turn_as_the_page_shows(tmp_path: Path) -> None:
    code = block(AGENT_PAGE, "python", "class EchoAgent")
    (tmp_path / "echo_agent.py").write_text(code.text)
    exports = block(AGENT_PAGE, "sh", "REM_AGENT=")
    agent = re.search(r"REM_AGENT=(\S+)", exports.text)
    assert agent is not None and agent[1] == "echo_agent:make_agent"
    data = str(tmp_path / "data")
    env = rem_env(REM_AGENT=agent[1], PYTHONPATH=str(tmp_path), REM_AGENT_DELAY_MS="0")
    send = block(AGENT_PAGE, "sh", "rem send echo-1")
    for line in [*send.text.splitlines()[:1]]:
        assert line.startswith("rem send echo-1 "), line
    for argv in (["init"], ["send", "echo-1", "Is the ledger export late again?"]):
        proc = run_rem(*argv, "--data", data, env=env)
        assert proc.returncode == 0, proc.stderr
    executor = run_rem("daemon", "--role", "executor", "--once", "--data", data, env=env)
    assert executor.returncode == 0, executor.stderr
    shown = run_rem("show", "echo-1", "--data", data, env=env)
    assert shown.returncode == 0, shown.stderr
    expected = after(AGENT_PAGE, send)
    assert expected.lang == "text" and matches(expected.text, shown.stdout), shown.stdout


def test_a_missing_agent_module_is_the_one_line_the_page_quotes(tmp_path: Path) -> None:
    env = rem_env(REM_AGENT="echo_agent:make_agent", PYTHONPATH=str(tmp_path / "empty"))
    data = str(tmp_path / "data")
    assert run_rem("init", "--data", data, env=env).returncode == 0
    proc = run_rem("daemon", "--role", "executor", "--once", "--data", data, env=env)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    page = " ".join(AGENT_PAGE.read_text(encoding="utf-8").split())
    assert line.startswith("rem: error: REM_AGENT=") and line in page, line


async def test_the_model_agent_subclass_sends_its_own_instructions(
    db_ctx: Context, fake_model: FakeOpenAIServer, module_dir: Path
) -> None:
    code = block(AGENT_PAGE, "python", "class PaymentsAgent")
    payments = _module(module_dir, "payments_agent", code.text)
    agent = payments.make_agent()
    db = await db_ctx.db()
    await sessions.admit(db, "s1", "Who owns the payment gateway?", input_id="q1")
    await Executor(db_ctx, once=True, agent=agent).run()
    (request,) = fake_model.requests()
    assert request.messages[0] == {"role": "system", "content": payments.INSTRUCTIONS}
    assert (
        agent.snapshot()["system_prompt_sha256"]
        != type(agent).__mro__[1]().snapshot()["system_prompt_sha256"]
    )


async def test_the_python_tool_runs_once_per_key_and_counts(
    module_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    _module(module_dir, "jot_tools", block(TOOLS_PAGE, "python", "def make_tools").text)
    project = tomllib.loads(block(TOOLS_PAGE, "toml", "rem.tools").text)
    ((name, value),) = project["project"]["entry-points"]["rem.tools"].items()
    entry = EntryPoint(name=name, value=value, group="rem.tools")
    async with await ToolRegistry.load(config_path=None, entry_points=[entry]) as registry:
        specs = {spec.name: spec.effect for spec in await registry.catalogue()}
        assert specs == {"jot.add": "idempotent", "jot.count": "read"}
        first = await registry.call("jot.add", {"text": "export moved"}, idempotency_key="k1")
        again = await registry.call("jot.add", {"text": "export moved"}, idempotency_key="k1")
        assert first.text == again.text == "jotted: export moved" and not first.is_error
        counted = await registry.call("jot.count", {}, idempotency_key="k2")
        assert json.loads(counted.text) == {"lines": 1}
        refused = await registry.call("jot.add", {}, idempotency_key="k3")
        assert refused.is_error  # the schema's required `text`: checked before `run`
    shown = after(TOOLS_PAGE, block(TOOLS_PAGE, "sh", "pip install -e ."))
    assert matches(
        shown.text,
        "...\njot.add idempotent annotation allow default 60 s yes\n"
        "jot.count read annotation allow default 60 s yes\n...",
    )


def test_the_demo_tools_config_runs_as_the_page_shows(tmp_path: Path) -> None:
    script = block(TOOLS_PAGE, "sh", "cat > mcp.json")
    config = re.search(r"<<'EOF'\n(.*?)\nEOF\n", script.text, re.S)
    assert config is not None
    folder = tmp_path / "rem-tools"
    folder.mkdir(mode=0o700)
    (folder / "mcp.json").write_text(config[1])
    # wide: a long temp path must not wrap inside a word
    env = rem_env(PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin", HOME=str(tmp_path), COLUMNS="250")
    proc = run_rem("tools", "--config", str(folder / "mcp.json"), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = after(TOOLS_PAGE, script).text.replace("/home/you", str(tmp_path))
    assert matches(expected, proc.stdout), proc.stdout
    assert (folder / "tools-data").is_dir()  # the server ran in the config's folder
