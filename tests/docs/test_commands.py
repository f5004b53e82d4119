"""Every `rem ...` command line the docs show is one the CLI accepts: parsed by rem's own parser, never run.

A command line in a fenced code block is parsed whole (the command, its
options and their values, its arguments) by the click command the `rem` entry
point runs, exactly as `rem` would parse it, without invoking anything. Inline
code (`rem release LEASE_ID [--force]`) is read leniently, since it shows
placeholders and alternatives: its command must exist and every option it
names must be one of that command's or a global one. The examples that `rem
--help` and each command's help print are checked the same way.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.core.errors import RemError
from tests.docs.pages import ROOT, code_blocks, gen, inline_code, pages

# Commands the docs describe before they exist (docs/agent-tools.md, from the design): allowed there
# and in the lead's checklist only. When one lands, `test_planned_commands_do_not_exist_yet` fails:
# take it out of here, and check docs/agent-tools.md against docs/_todo.md.
PLANNED: set[str] = set()  # every command the docs name exists now
PLANNED_PAGES = {"agent-tools.md", "_todo.md"}
SHELL_BLOCKS = {"", "sh", "bash", "shell", "console"}
SEPARATORS = {"&&", "||", ";", "|", "&"}
REDIRECTS = {">", ">>", "<", "2>", "&>"}

GEN = gen()
REM = GEN.rem_command()


def _is_rem(word: str) -> bool:
    return word == "rem" or word.endswith("/rem")


def rem_argvs(command_line: str) -> Iterator[list[str]]:
    """The argv after `rem` of every rem command in one shell line (pipes, &&, env assignments...)."""
    lexer = shlex.shlex(command_line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    for token in [*lexer, ";"]:
        if token in SEPARATORS or (set(token) <= set(";&|") and token):
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                words.pop(0)  # VAR=value before the command
            if words and _is_rem(words[0]):
                argv = words[1:]
                for i, word in enumerate(argv):
                    if word in REDIRECTS or set(word) <= set("<>"):
                        argv = argv[: i - 1] if i and argv[i - 1].isdigit() else argv[:i]
                        break
                yield argv
            words = []
        else:
            words.append(token)


def block_command_lines(path: Path) -> Iterator[tuple[int, str]]:
    for block in code_blocks(path):
        if block.lang not in SHELL_BLOCKS:
            continue
        for offset, line in enumerate(block.text.splitlines()):
            line = line.strip()
            if block.lang == "console":
                if not line.startswith("$ "):
                    continue  # output, not a command
                line = line[2:]
            if re.search(r"(^|[\s/;&|])rem\b", line) and list(rem_argvs(line)):
                yield block.line + offset, line


def parse(argv: list[str]) -> Any:
    """Parse `rem ARGV` as rem would, down to the last subcommand; returns that command's context."""
    import typer

    try:
        ctx = REM.make_context("rem", list(argv))
        group, rest = REM, [*getattr(ctx, "_protected_args", []), *ctx.args]
        while rest:
            name, command, rest = group.resolve_command(ctx, rest)
            ctx = command.make_context(name, rest, parent=ctx)
            if not hasattr(command, "commands"):
                return ctx
            group, rest = command, [*getattr(ctx, "_protected_args", []), *ctx.args]
        return ctx
    except typer.Exit:  # --help (typer raises its vendored click's Exit)
        return None


def resolve(words: list[str]) -> tuple[list[str], Any] | None:
    """(the command's words, the command) for the words after `rem`, options skipped; None if none."""
    command, path, value_next = REM, [], False
    for word in words:
        if value_next or word.startswith("-"):
            value_next = word in GLOBAL_VALUE_OPTIONS and not path
            continue
        commands = getattr(command, "commands", None)
        if commands is None or word not in commands:
            break
        command, path = commands[word], [*path, word]
    return (path, command) if path else None


def option_names(command: Any) -> set[str]:
    return {name for param in command.params for name in [*param.opts, *getattr(param, "secondary_opts", [])]}


GLOBAL_OPTIONS = option_names(REM) | {"--help", "-h"}
GLOBAL_VALUE_OPTIONS = {"--data", "--chroma-url", "--db"}  # the global options that take a value


def all_block_lines() -> list[tuple[str, int, str]]:
    return [(str(p.relative_to(ROOT)), n, line) for p in pages() for n, line in block_command_lines(p)]


@pytest.mark.parametrize(("page", "line_no", "line"), all_block_lines())
def test_every_command_line_in_a_code_block_parses(page: str, line_no: int, line: str) -> None:
    for argv in rem_argvs(line):
        if argv and argv[0] in PLANNED:
            assert Path(page).name in PLANNED_PAGES, f"{page}:{line_no}: `rem {argv[0]}` does not exist yet"
            continue
        try:
            parse(argv)
        except (Exception, RemError) as exc:  # click's usage errors, a value's parser refusing
            pytest.fail(f"{page}:{line_no}: `rem {shlex.join(argv)}` is not a valid rem command line: {exc}")


def inline_commands() -> list[tuple[str, str]]:
    found = []
    for path in pages():
        for code in inline_code(path):
            if re.match(r"(\S*/)?rem [a-z-]", code) and not code.startswith("rem: "):
                found.append((str(path.relative_to(ROOT)), code))
    return found


@pytest.mark.parametrize(("page", "code"), inline_commands())
def test_every_inline_command_names_a_command_and_options_that_exist(page: str, code: str) -> None:
    words = [w.strip("[](){},|") for w in code.split()[1:]]
    words = [w for w in words if w]
    if words and words[0] in PLANNED:
        assert Path(page).name in PLANNED_PAGES, f"{page}: `{code}`: rem {words[0]} does not exist yet"
        return
    if words and words[0].isupper():
        return  # `rem COMMAND --help`: a placeholder, not a command
    found = resolve(words)
    assert found is not None, f"{page}: `{code}` names no rem command"
    _, command = found
    known = option_names(command) | GLOBAL_OPTIONS
    for word in words:
        if word.startswith("-") and word != "-":
            assert word.split("=")[0] in known, f"{page}: `{code}`: no option {word} (known: {sorted(known)})"


def help_examples() -> list[tuple[str, str]]:
    """Every `rem ...` example that `rem --help` and the commands' help texts print."""
    from backend.cli.app import EXAMPLES

    found = [("rem --help", line.split("#")[0].strip()) for line in EXAMPLES.splitlines()]
    root = REM.make_context("rem", [], resilient_parsing=True)
    for words, command, _ in GEN.walk_commands(REM, root):
        for match in re.finditer(r"Examples?: (rem [^(\n]*)", command.help or ""):
            found.append((f"rem {' '.join(words)} --help", match.group(1).strip()))
    return [(where, line) for where, line in found if line.startswith("rem ")]


@pytest.mark.parametrize(("where", "line"), help_examples())
def test_every_example_the_help_prints_parses(where: str, line: str) -> None:
    for argv in rem_argvs(line):
        try:
            parse(argv)
        except (Exception, RemError) as exc:
            pytest.fail(f"{where}: the example `{line}` does not parse: {exc}")


def test_planned_commands_do_not_exist_yet() -> None:
    landed = PLANNED & set(REM.commands)
    assert not landed, (
        f"rem {', '.join(sorted(landed))} exists now: take it out of PLANNED in {Path(__file__).name}, "
        "run python docs/gen.py, and check docs/agent-tools.md against docs/_todo.md"
    )


def test_the_parser_check_can_fail() -> None:
    """The checks above would catch a renamed option, a missing command and a bad value."""
    for bad in (["check", "--setled"], ["sned", "s1", "hi"], ["recall", "q", "--k", "N"], ["send", "s1"]):
        with pytest.raises(Exception):  # noqa: B017 - any of click's usage errors
            parse(bad)
    assert list(rem_argvs("REM_HOST=a rem --db postgresql://x/y up && rem check > out.txt")) == [
        ["--db", "postgresql://x/y", "up"],
        ["check"],
    ]
    assert list(rem_argvs("npx inspector --cli .venv/bin/rem mcp --method tools/list")) == []
    assert resolve(["drill", "sigkill", "--rounds", "3"]) is not None
    assert resolve(["COMMAND", "--help"]) is None
