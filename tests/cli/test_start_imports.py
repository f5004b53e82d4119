"""Commands start fast: each imports only what it uses. Asserted on the import set, not
on time (times are `benchmarks/cli_start.py`'s): a fresh interpreter runs one command the way the
`rem` script does and reports `sys.modules`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import rem_env, run_rem

# what no command below may load on SQLite: the PostgreSQL driver, the SDKs of other commands, the
# API client's httpx2 (only with --server), the console, and the validation library typer would load
# for plain option values
NEVER = (
    "psycopg",
    "chromadb",
    "openai",
    "mcp",
    "numpy",
    "wordllama",
    "textual",
    "pydantic",
    "click",
    "httpx2",
)
# rem's own modules that only other commands need
NOT_FOR_STATUS = (
    "backend.dream",
    "backend.ops.checks",
    "backend.programs",
    "backend.memory.recall",
    # the other operations and the daemons' modules (the snapshot reads their vocabularies only)
    "backend.ops.draining",
    "backend.ops.lease_release",
    "backend.ops.transcript",
    "backend.execution.model_turns",
    "backend.summaries.summarizer",
    "backend.summaries.receipt_replay",
    "backend.runtime.daemon",
)
# what typer's help formatter imports and rem's help never uses (backend/cli/rich_help.py)
NOT_FOR_HELP = ("rich.markdown", "markdown_it", "rich.traceback", "rich.syntax", "rich.pretty", "pygments")
# the entry point's own modules: a command loads these and its own module, no other command's
ENTRY = {"backend.cli", "backend.cli.app", "backend.cli.common", "backend.cli.lazy", "backend.cli.params"}

RUN_ONE = """
import json, sys
from backend.cli.app import main
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as out:
    json.dump({"code": code, "modules": sorted(sys.modules)}, out)
"""


def modules_after(tmp_path: Path, *argv: str) -> set[str]:
    """The modules loaded by a fresh `rem ARGV` (after it ran), checking it succeeded."""
    report = tmp_path / "modules.json"
    proc = subprocess.run(
        [sys.executable, "-c", RUN_ONE, str(report), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=rem_env(REM_CHROMA_AUTOSTART="0"),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(report.read_text())
    assert result["code"] == 0, proc.stderr
    return set(result["modules"])


def loaded(modules: set[str], *prefixes: str) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("start") / "d")
    assert run_rem("send", "s1", "hello", "--data", root).returncode == 0
    return root


def test_help_loads_no_library_database_or_sdk(tmp_path: Path) -> None:
    modules = modules_after(tmp_path, "--help")
    assert loaded(modules, "backend.cli") == sorted(ENTRY | {"backend.cli.rich_help"})  # no command's module
    assert "rich.panel" in modules  # the help is rich's panels
    assert loaded(modules, *NEVER) == []
    assert loaded(modules, *NOT_FOR_HELP) == []
    assert loaded(modules, "backend.ops.actions", "backend.store.db", "backend.runtime", "asyncio") == []


def test_a_commands_help_and_a_usage_error_load_only_that_command(tmp_path: Path) -> None:
    for argv in (("send", "--help"), ("drill", "sigkill", "--help")):
        modules = modules_after(tmp_path, *argv)
        assert loaded(modules, "backend.cli") == sorted(
            ENTRY | {"backend.cli.rich_help", f"backend.cli.{argv[0]}"}
        )
        assert loaded(modules, *NEVER, *NOT_FOR_HELP) == []
    proc = run_rem("status", "--bogus")
    assert proc.returncode == 2 and "No such option: --bogus" in proc.stderr, proc.stderr


def test_status_json_loads_the_snapshot_and_nothing_of_other_commands(tmp_path: Path, data: str) -> None:
    modules = modules_after(tmp_path, "status", "--json", "--data", data)
    assert "backend.ops.snapshot" in modules  # it did build the snapshot
    assert loaded(modules, *NEVER) == []
    assert loaded(modules, *NOT_FOR_STATUS) == []
    assert loaded(modules, "rich") == []  # --json prints no table
    assert set(loaded(modules, "backend.cli")) <= ENTRY | {"backend.cli.rich_help", "backend.cli.status"}


def test_the_alert_rules_load_no_store_or_chroma_client(tmp_path: Path) -> None:
    modules = modules_after(tmp_path, "metrics", "--rules")
    assert "backend.ops.alert_rules" in modules
    assert loaded(modules, *NEVER) == []
    assert loaded(modules, "backend.ops.actions", "backend.runtime", "backend.store.db", "asyncio") == []


@pytest.mark.parametrize(
    "argv",
    [("show", "s1", "--json"), ("send", "s1", "again", "--json"), ("status",)],
    ids=["show", "send", "status-table"],
)
def test_other_everyday_commands_load_no_driver_or_sdk(
    tmp_path: Path, data: str, argv: tuple[str, ...]
) -> None:
    modules = modules_after(tmp_path, *argv, "--data", data)
    assert loaded(modules, *NEVER) == []
    assert loaded(modules, "backend.ops.checks", "backend.programs") == []


def _parameters(command: Any) -> Iterator[tuple[Any, Any]]:
    for param in command.params:
        yield command, param
    for sub in getattr(command, "commands", {}).values():
        yield from _parameters(sub)


def _outcome(coercion: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        result = coercion.coerce(value, param=param, ctx=ctx)
    except Exception as exc:  # the same refusal, word for word
        return "refused", (type(exc).__name__, str(exc))
    return "value", (type(result).__name__, result)


def test_plain_values_are_what_typers_own_coercion_gives() -> None:
    """backend/cli/params.py answers without pydantic exactly what typer's coercion answers."""
    from typer._click import Context
    from typer._coercion import build_runtime_param
    from typer.main import get_command

    from backend.cli.app import app
    from backend.cli.params import PlainValues

    compared = 0
    for command, param in _parameters(get_command(app)):
        ctx = Context(command)
        ours, typers = PlainValues(param), build_runtime_param(param.type_descriptor)
        for value in (None, param.default, "5", "-1", "x", "", "queue", "./data"):
            expected = _outcome(typers, value, param, ctx)
            assert _outcome(ours, value, param, ctx) == expected, (param.name, value)
            compared += 1
    assert compared > 500
