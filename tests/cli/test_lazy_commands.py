"""rem's command group builds one command at a time (backend/cli/lazy.py) and typer's help loads
without Markdown (backend/cli/rich_help.py): neither changes a word of what an operator sees."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest
import typer
from typer.core import TyperGroup

import backend.cli
from backend.cli.app import COMMANDS, app


def test_the_table_names_every_command_a_module_registers_and_no_other() -> None:
    registered = {}
    for info in pkgutil.iter_modules(backend.cli.__path__):
        module = importlib.import_module(f"backend.cli.{info.name}")
        if not hasattr(module, "register"):
            continue
        probe = typer.Typer()
        module.register(probe)
        names = [c.name for c in probe.registered_commands] + [g.name for g in probe.registered_groups]
        registered.update({name: info.name for name in names})
    assert registered == {name: module for name, (module, _) in COMMANDS.items()}


def test_the_help_listed_for_each_command_is_the_first_paragraph_of_its_own() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    for name, (_, listed) in COMMANDS.items():
        command = group.commands[name]
        first = inspect.cleandoc(command.help or "").partition("\n\n")[0]
        assert listed == first, f"backend/cli/app.py COMMANDS[{name!r}]: put {first!r}"
        assert (command.short_help, command.hidden, command.deprecated) == (None, False, False), name


def _eager(lazy: TyperGroup) -> TyperGroup:
    """The same group as typer builds it: every command built before anything runs."""
    return TyperGroup(
        name=lazy.name,
        commands={name: lazy.commands[name] for name in lazy.commands},
        params=lazy.params,
        help=lazy.help,
        epilog=lazy.epilog,
        no_args_is_help=lazy.no_args_is_help,
        context_settings=lazy.context_settings,
        rich_markup_mode=lazy.rich_markup_mode,
    )


def _help(group: TyperGroup, capsys: pytest.CaptureFixture[str]) -> str:
    with group.make_context("rem", [], resilient_parsing=True) as ctx:
        group.format_help(ctx, None)  # type: ignore[arg-type]  # typer's rich help prints itself
    return capsys.readouterr().out


def test_the_help_lists_what_typers_eager_group_lists_while_building_no_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lazy = typer.main.get_command(app)
    assert isinstance(lazy, TyperGroup)
    before = set(sys.modules)
    listed = _help(lazy, capsys)
    assert lazy.commands._built == {}  # type: ignore[attr-defined]  # the listing built nothing
    assert {m for m in sys.modules if m.startswith("backend.cli.")} <= before  # nor imported a module
    for name in COMMANDS:
        assert f" {name} " in listed
    assert listed == _help(_eager(lazy), capsys)
    assert "Examples:" in listed and "rem: a durable runtime" in listed


def test_a_command_is_built_once_and_an_unknown_one_is_none() -> None:
    lazy = typer.main.get_command(app)
    assert isinstance(lazy, TyperGroup)
    ctx = lazy.make_context("rem", ["status"], resilient_parsing=True)
    status = lazy.get_command(ctx, "status")
    assert status is not None and [p.name for p in status.params][:2] == ["data", "chroma_url"]
    assert lazy.get_command(ctx, "status") is status
    assert lazy.get_command(ctx, "stats") is None and "stats" not in lazy.commands
    assert list(lazy.commands) == list(COMMANDS) == lazy.list_commands(ctx)


def test_typers_help_loads_without_markdown_yet_a_markdown_or_traceback_is_the_real_one() -> None:
    code = (
        "import sys\n"
        "from backend.cli.app import main\n"
        "assert main(['--help']) == 0\n"
        "assert 'rich.markdown' not in sys.modules and 'typer.rich_utils' in sys.modules\n"
        "import typer.rich_utils as ru\n"
        "import rich.markdown, rich.traceback\n"
        "assert isinstance(ru.Markdown('**x**'), rich.markdown.Markdown)\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError as exc:\n"
        "    tb = ru.Traceback.from_exception(type(exc), exc, exc.__traceback__)\n"
        "assert isinstance(tb, rich.traceback.Traceback)\n"
        "assert sys.modules['rich'].markdown is sys.modules['rich.markdown']\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
