"""Regenerate the docs' generated parts from the code: `python docs/gen.py` (or `--check`).

A generated part sits between `<!-- gen:NAME -->` and `<!-- /gen:NAME -->` in a
page; everything else on the page is written by hand. The parts:

* `settings` (configuration.md): every `REM_*` variable, grouped as
  `backend/core/settings.py` groups them, from `declared()`;
* `cli` (cli.md): every `rem` command with its help, usage, arguments and
  options, from the typer app itself;
* `console-keys` (operators.md): the console's keys, from its BINDINGS (the
  tables its `?` screen shows);
* `rule:NAME` (operators.md): each alert rule's expression, hold, severity and
  summary, from `backend/ops/alert_rules.py`;
* `api` (api.md): every operation of `rem serve` with its scope, parameters, body
  fields and answers, from the app's own OpenAPI document.

`tests/docs/test_generated.py` fails when a page differs from what this would
write, and says to run it. `--check` prints the pages that differ and exits 1.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

MARK = re.compile(r"(<!-- gen:(?P<name>[\w:.-]+) -->\n)(?P<body>.*?)(<!-- /gen:(?P=name) -->)", re.S)


def cell(text: str) -> str:
    """Text for one Markdown table cell: one line, pipes and angle brackets escaped."""
    flat = " ".join(str(text).split())
    return flat.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def code_cell(text: str) -> str:
    """Code in a table cell: a code span, or `<code>` when it holds a pipe (a `\\|` stays in a code span)."""
    flat = " ".join(str(text).split())
    if "|" not in flat:
        return f"`{flat}`"
    escaped = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "&#124;")
    return f"<code>{escaped}</code>"


# -- the configuration page ------------------------------------------------------------------------


def settings_groups() -> list[tuple[str, list[str]]]:
    """(the comment heading a group in the Settings class, the attribute names under it), in order."""
    path = ROOT / "backend" / "core" / "settings.py"
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    (cls,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    groups: list[tuple[str, list[str]]] = []
    previous_end = cls.body[0].lineno - 1
    for stmt in cls.body:
        comments = [
            line.strip()[1:].strip()
            for line in lines[previous_end : stmt.lineno - 1]
            if line.strip().startswith("#")
        ]
        previous_end = stmt.end_lineno or stmt.lineno
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
        if not isinstance(target, ast.Name):
            continue
        if comments or not groups:
            groups.append((" ".join(comments) or "settings", []))
        groups[-1][1].append(target.id)
    return groups


def settings_tables() -> str:
    """One table per group of settings, each row the variable, its default and its meaning."""
    from backend.core.settings import Settings

    parts = []
    for title, names in settings_groups():
        rows = ["| variable | default | what |", "|---|---|---|"]
        for name in names:
            setting = getattr(Settings, name)
            rows.append(f"| `{setting.env}` | {cell(setting.default_text())} | {cell(setting.doc)} |")
        # a short heading (it lands in the page's table of contents); what follows a colon, under it
        heading, _, prose = title.partition(": ")
        heading = heading[0].upper() + heading[1:]
        intro = f"{prose[0].upper()}{prose[1:]}.\n\n" if prose else ""
        parts.append(f"### {heading}\n\n{intro}" + "\n".join(rows))
    return "\n\n".join(parts)


# -- the CLI reference -------------------------------------------------------------------------------


def rem_command() -> Any:
    """The click command the `rem` entry point runs (typer's group)."""
    import typer.main

    from backend.cli.app import app

    return typer.main.get_command(app)


def walk_commands(
    group: Any, ctx: Any, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    """(the words after `rem`, the command, its context) for every command, in `rem --help`'s order."""
    for name, command in group.commands.items():
        if getattr(command, "hidden", False):
            continue
        words = (*path, name)
        sub = command.make_context(name, [], parent=ctx, resilient_parsing=True)
        yield words, command, sub
        if hasattr(command, "commands"):
            yield from walk_commands(command, sub, words)


EXAMPLE = re.compile(r"Examples?: ((?:[A-Z_][A-Z0-9_]*=\S+ )*rem .*?)\s*(?:\((.*)\))?$")


def _example(line: str) -> str:
    """One `Example:` line of a help text as Markdown: its command as code, a note after it as prose."""
    found = EXAMPLE.match(line)
    if found is None:
        return line
    tail = f" ({found.group(2)})" if found.group(2) else ""
    return f"Example: `{found.group(1).strip()}`{tail}"


def _help_paragraphs(text: str) -> str:
    """A command's help as Markdown: its paragraphs, each `Example:` line one of its own, as code."""
    out = []
    for paragraph in (p.strip() for p in (text or "").strip().split("\n\n")):
        # a line that starts `Example:` starts an item of its own; other lines join the item before
        items: list[list[str]] = []
        for line in paragraph.splitlines():
            if not items or line.strip().startswith(("Example:", "Examples:")):
                items.append([])
            items[-1].append(line.strip())
        for item in items:
            flat = " ".join(" ".join(item).split())
            if flat:
                out.append(_example(flat))
    return "\n\n".join(out)


def _shown(piece: str) -> str:
    """A usage piece as the usage line shows it: `{SESSION}` (a required argument) as `SESSION`."""
    return piece.strip("{}").upper() if piece.startswith("{") else piece


def _usage(words: tuple[str, ...], command: Any, ctx: Any) -> str:
    """The usage line `rem ... --help` prints (a group's `COMMAND [ARGS]...` is among its pieces)."""
    pieces = [_shown(p) for p in command.collect_usage_pieces(ctx)]
    return " ".join(["rem", *words, *pieces])


def _params_table(command: Any, ctx: Any) -> str:
    rows = []
    for param in command.params:
        record = param.get_help_record(ctx)
        if record is None:
            continue
        declared, help_text = record
        if param.param_type_name == "argument":
            declared = " ".join(_shown(p) for p in param.get_usage_pieces(ctx))  # as the usage line
        rows.append(f"| {code_cell(declared)} | {cell(help_text)} |")
    if not rows:
        return ""
    return "\n".join(["| argument / option | what |", "|---|---|", *rows])


def cli_reference() -> str:
    """Every command: a heading, its help, its usage and a table of its arguments and options."""
    group = rem_command()
    root = group.make_context("rem", [], resilient_parsing=True)
    parts = [
        "## Global options\n\nGiven before the command (`rem --data DIR status`); `--data` and "
        "`--chroma-url` are also accepted after it.\n\n" + _params_table(group, root)
    ]
    for words, command, ctx in walk_commands(group, root):
        block = [f"## rem {' '.join(words)}", _help_paragraphs(command.help or "")]
        block.append(f"```text\n{_usage(words, command, ctx)}\n```")
        table = _params_table(command, ctx)
        if table:
            block.append(table)
        if hasattr(command, "commands"):
            block.append("Commands: " + ", ".join(f"`rem {' '.join(words)} {n}`" for n in command.commands))
        parts.append("\n\n".join(b for b in block if b))
    return "\n\n".join(parts)


# -- the console's keys and the alert rules ---------------------------------------------------------


def console_keys() -> str:
    """The console's key tables, section by section, as its `?` screen shows them."""
    from tui.app import ConsoleApp
    from tui.screens.help import help_sections

    parts = []
    for title, rows in help_sections(ConsoleApp.BINDINGS):
        table = [
            "| key | does |",
            "|---|---|",
            *(f"| {code_cell(key)} | {cell(what)} |" for key, what in rows),
        ]
        parts.append(f"**{title}**\n\n" + "\n".join(table))
    return "\n\n".join(parts)


TEMPLATE = re.compile(r"\{\{\s*(?P<expr>[^}]*?)\s*\}\}")
# what a summary's `{{ $value | FUNCTION }}` reads as on the page
VALUE_FILTERS = {"humanizeDuration": "DURATION", "humanizePercentage": "PERCENT", "humanize": "N"}


def placeholder(expr: str) -> str:
    """One Prometheus template expression as a placeholder: `$labels.kind` as KIND, `$value` as N."""
    value, _, function = (part.strip() for part in expr.partition("|"))
    if value.startswith("$labels."):
        return value.removeprefix("$labels.").upper()
    if value == "$value":
        return VALUE_FILTERS.get(function, "N") if function else "N"
    raise ValueError(f"an alert summary template docs/gen.py cannot show: {{{{ {expr} }}}}")


def rendered_summary(summary: str) -> str:
    """An alert rule's summary with its templates as placeholders, as the runbook shows it."""
    return TEMPLATE.sub(lambda m: placeholder(m["expr"]), summary)


def alert_rule(name: str) -> Callable[[], str]:
    def render() -> str:
        from backend.ops.alert_rules import RULES

        (rule,) = (r for r in RULES if r.name == name)
        summary = rendered_summary(rule.summary)
        return (
            f"Fires when `{rule.expr}` holds for {rule.hold} (severity **{rule.severity}**). "
            f"Console: `{rule.console_key}`.\n\n> {summary}"
        )

    return render


# -- the API reference ------------------------------------------------------------------------------


def openapi_document() -> dict[str, Any]:
    """`rem serve`'s OpenAPI document, from the app itself (built over a Context it never opens)."""
    from backend.api.app import create_app
    from backend.core.datadir import DataDir
    from backend.runtime.context import Context

    app = create_app(Context(DataDir(ROOT / "nonexistent"), start_chroma=False, db_url=None))
    document: dict[str, Any] = app.openapi()
    return document


def _schema_type(schema: dict[str, Any]) -> str:
    """A parameter's or field's type in a few words (`string, 1-100 long`, `integer 1-100`, `queue | steer`)."""
    if "enum" in schema:
        return " | ".join(str(v) for v in schema["enum"])
    if "anyOf" in schema:
        kinds = [_schema_type(s) for s in schema["anyOf"] if s.get("type") != "null"]
        return " or ".join(kinds) or "null"
    if "$ref" in schema:
        return str(schema["$ref"].rsplit("/", 1)[1])
    kind = str(schema.get("type", "any"))
    low = schema.get("minimum", schema.get("minLength"))
    high = schema.get("maximum", schema.get("maxLength"))
    unit = " long" if "minLength" in schema or "maxLength" in schema else ""
    if low is not None and high is not None:
        return f"{kind}, {low}-{high}{unit}"
    if high is not None:
        return f"{kind}, at most {high}{unit}"
    if low is not None:
        return f"{kind}, at least {low}{unit}"
    return kind


def _body_rows(document: dict[str, Any], operation: dict[str, Any]) -> list[str]:
    content = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    ref = content.get("schema", {})
    ref = next((s for s in ref.get("anyOf", []) if "$ref" in s), ref)
    if "$ref" not in ref:
        return []
    model = document["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]
    required = set(model.get("required", []))
    return [
        f"| `{name}` (body{', required' if name in required else ''}) | {cell(_schema_type(field))} | "
        f"{cell(field.get('description', ''))} |"
        for name, field in model.get("properties", {}).items()
    ]


def api_reference() -> str:
    """Every operation of `rem serve`: its scope, parameters, body fields and answers."""
    document = openapi_document()
    parts = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            scope = operation.get("x-rem-scope")
            needs = (
                f"Scope: `{scope}`."
                if scope
                else "No scope: " + ("any live token." if operation.get("security") else "no token.")
            )
            rows = [
                f"| `{p['name']}` ({p['in']}{', required' if p.get('required') else ''}) | "
                f"{cell(_schema_type(p.get('schema', {})))} | {cell(p.get('description', ''))} |"
                for p in operation.get("parameters", [])
            ] + _body_rows(document, operation)
            codes = ", ".join(f"`{code}`" for code in sorted(operation.get("responses", {})))
            block = [f"### {method.upper()} {path}", f"{operation.get('summary', '')} {needs}"]
            if rows:
                block.append("\n".join(["| parameter | type | what |", "|---|---|---|", *rows]))
            block.append(f"Answers: {codes}.")
            parts.append("\n\n".join(block))
    return "\n\n".join(parts)


def generator(name: str) -> Callable[[], str]:
    """The function that writes the generated part called `name`."""
    fixed: dict[str, Callable[[], str]] = {
        "settings": settings_tables,
        "cli": cli_reference,
        "console-keys": console_keys,
        "api": api_reference,
    }
    if name in fixed:
        return fixed[name]
    if name.startswith("rule:"):
        return alert_rule(name.removeprefix("rule:"))
    raise KeyError(f"no generator for <!-- gen:{name} -->")


def regenerated(text: str) -> str:
    """A page with every generated part written anew."""

    def replace(match: re.Match[str]) -> str:
        body = generator(match["name"])().strip()
        return f"{match.group(1)}{body}\n{match.group(4)}"

    return MARK.sub(replace, text)


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        fresh = regenerated(text)
        if fresh != text:
            stale.append(page.relative_to(ROOT))
            if not check:
                page.write_text(fresh, encoding="utf-8")
    verb = "differ from the code (run python docs/gen.py)" if check else "regenerated"
    for path in stale:
        print(f"{path}: {verb}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
