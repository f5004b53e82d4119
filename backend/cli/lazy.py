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

`rem --help` lists every command, with the first paragraph of its docstring:
for the listing, the group hands typer's help formatter a summary of each
command (its name, help text and flags, from the module's registration,
without inspecting its parameters). Anything that walks `commands` (docs/gen.py,
the docs tests, shell completion) gets the fully built commands.
"""

from __future__ import annotations

import importlib
import inspect
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

    def __init__(self, modules: Mapping[str, str], group: TyperGroup) -> None:
        self.modules = dict(modules)  # command name -> module in backend.cli, in listing order
        self.group = group
        self._registered: dict[str, typer.Typer] = {}
        self._built: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._built:
            self._built[name] = self._build(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:  # click's add_command
        self.modules.setdefault(name, "")
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self.modules[name]
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
        """`name` as the group's help lists it: its name, help and flags, no parameters built."""
        if name in self._built:
            return self._built[name]
        info = self.registration(name)
        markup = self.group.rich_markup_mode
        if isinstance(info, CommandInfo):
            return TyperCommand(
                name=name,
                help=inspect.getdoc(info.callback) if info.help is None else inspect.cleandoc(info.help),
                short_help=info.short_help,
                hidden=info.hidden,
                deprecated=info.deprecated,
                rich_markup_mode=markup,
                rich_help_panel=info.rich_help_panel,
            )
        solved = typer_main.solve_typer_info_defaults(info)  # a sub-app (drill): its help as typer finds it
        return TyperGroup(
            name=name,
            help=solved.help,
            short_help=solved.short_help,
            hidden=solved.hidden,
            deprecated=solved.deprecated,
            rich_markup_mode=markup,
            rich_help_panel=solved.rich_help_panel,
        )

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


def lazy_group(modules: Mapping[str, str]) -> type[TyperGroup]:
    """A TyperGroup class whose commands are `modules` (name -> module in backend.cli), built lazily."""

    class LazyGroup(TyperGroup):
        def __init__(self, **attrs: Any) -> None:
            super().__init__(**attrs)
            self.commands = CommandTable(modules, self)
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
