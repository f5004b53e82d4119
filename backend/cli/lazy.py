"""rem's command group, built one command at a time: a command runs with only its module imported.

typer builds a click command for every registered command before it parses
anything: it inspects each function's signature and annotations, ~0.07 s of
CPU for rem's 24 commands, and every command module (with what it imports)
must be loaded first. `lazy_group(COMMANDS)` is the group class `rem`'s Typer
uses instead: its `commands` mapping knows every name and its module up
front, imports a module when one of its commands is first asked for, and
builds that command with typer's own functions (`get_command_from_info`,
`get_group_from_info`), so it parses, validates and helps exactly as typer
would. `rem status` imports `backend.cli.status` and builds one command.

`rem --help` lists every command with the first paragraph of its docstring:
for the listing, the group hands typer's help formatter a summary of each
command, its name and that paragraph as the table in `backend.cli.app` holds
it, so the listing imports no command module (importing all 22 cost ~0.03 s;
tests/cli/test_lazy_commands.py keeps the table equal to the docstrings, and
the listing equal to typer's own). Anything that walks `commands`
(docs/gen.py, the docs tests, shell completion) gets the fully built commands.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import typer
from typer import main as typer_main
from typer._click import Command, Context, HelpFormatter
from typer.core import TyperCommand, TyperGroup
from typer.models import CommandInfo, TyperInfo

PACKAGE = "backend.cli"


class CommandTable(MutableMapping[str, Command]):
    """Command name -> click command, each module imported and each command built on first use."""

    def __init__(self, commands: Mapping[str, tuple[str, str]], group: TyperGroup) -> None:
        # command name -> its module in backend.cli, and the help `rem --help` lists, in its order
        self.modules = {name: module for name, (module, _) in commands.items()}
        self.listed = {name: listed for name, (_, listed) in commands.items()}
        self.group = group
        self._registered: dict[str, typer.Typer] = {}
        self._built: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._built:
            self._built[name] = self._build(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:  # click's add_command
        self.modules.setdefault(name, "")
        self.listed.setdefault(name, command.help or "")
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self.modules[name], self.listed[name]
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self.modules)

    def __len__(self) -> int:
        return len(self.modules)

    def __contains__(self, name: object) -> bool:
        return name in self.modules

    def registration(self, name: str) -> CommandInfo | TyperInfo:
        """What `name`'s module registered for it (a command, or a sub-app such as `drill`)."""
        module = self.modules[name]
        if module not in self._registered:
            app = typer.Typer()
            importlib.import_module(f"{PACKAGE}.{module}").register(app)
            self._registered[module] = app
        registered = self._registered[module]
        for info in registered.registered_commands:
            if info.name == name:
                return info
        for group in registered.registered_groups:
            if group.name == name:
                return group
        raise LookupError(f"backend.cli.{module} registers no command {name!r}")

    def summary(self, name: str) -> Command:
        """`name` as the group's help lists it: its name and listed help, nothing imported or built."""
        if name in self._built:
            return self._built[name]
        return TyperCommand(name=name, help=self.listed[name], rich_markup_mode=self.group.rich_markup_mode)

    def _build(self, name: str) -> Command:
        info = self.registration(name)
        markup = self.group.rich_markup_mode
        if isinstance(info, CommandInfo):
            return typer_main.get_command_from_info(
                info, pretty_exceptions_short=True, rich_markup_mode=markup
            )
        return typer_main.get_group_from_info(
            info,
            pretty_exceptions_short=True,
            suggest_commands=self.group.suggest_commands,
            rich_markup_mode=markup,
        )


def lazy_group(commands: Mapping[str, tuple[str, str]]) -> type[TyperGroup]:
    """A TyperGroup class whose commands are `commands` (name -> (module in backend.cli, listed
    help)), each built when first asked for."""

    class LazyGroup(TyperGroup):
        def __init__(self, **attrs: Any) -> None:
            super().__init__(**attrs)
            self.commands = CommandTable(commands, self)
            self._listing = False

        def list_commands(self, ctx: Context) -> list[str]:
            return list(self.commands)

        def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
            table = self.commands
            assert isinstance(table, CommandTable)
            if cmd_name not in table:
                return None
            return table.summary(cmd_name) if self._listing else table[cmd_name]

        def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
            self._listing = True  # the listing needs each command's help, not its parameters
            try:
                super().format_help(ctx, formatter)
            finally:
                self._listing = False

    return LazyGroup
