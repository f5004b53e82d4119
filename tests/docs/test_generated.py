"""The generated parts of the docs equal what the code says now, and the alert rules link their runbooks."""

from __future__ import annotations

import json
import re

import pytest

from backend.core.settings import declared
from backend.ops.alert_rules import RULES, RUNBOOK_PAGE, rules_document
from tests.docs.pages import DOCS, ROOT, anchors, gen
from tests.helpers import run_rem

GEN = gen()
FIX = "the code changed: run `python docs/gen.py` and commit the pages it rewrites"


@pytest.mark.parametrize("page", GEN.pages(), ids=lambda p: p.name)
def test_every_generated_part_equals_what_the_code_says(page: object) -> None:
    text = page.read_text(encoding="utf-8")  # type: ignore[attr-defined]
    assert GEN.regenerated(text) == text, f"{page}: {FIX}"


def test_the_configuration_page_is_the_declared_settings() -> None:
    """Moved here with the table (it was the README's): every setting, its default and its meaning."""
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    for setting in declared():
        row = f"| `{setting.env}` | {GEN.cell(setting.default_text())} | {GEN.cell(setting.doc)} |"
        assert row in page, f"{setting.env}: {FIX}"
    grouped = [name for _, names in GEN.settings_groups() for name in names]
    assert len(grouped) == len(set(grouped)) == len(list(declared()))  # each setting in exactly one group


def test_the_cli_reference_lists_every_command_with_every_option() -> None:
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    command = GEN.rem_command()
    root = command.make_context("rem", [], resilient_parsing=True)
    for words, sub, _ in GEN.walk_commands(command, root):
        assert f"\n## rem {' '.join(words)}\n" in page, f"rem {' '.join(words)}: {FIX}"
        for param in sub.params:
            for name in param.opts:
                if name.startswith("-"):
                    assert name in page, f"rem {' '.join(words)} {name}: {FIX}"


def test_the_generator_notices_a_change() -> None:
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    stale = page.replace("| `REM_HOST` |", "| `REM_HOSTNAME` |")
    assert GEN.regenerated(stale) == page
    assert GEN.main(["--check"]) == 0  # nothing stale in the checkout


def test_every_alert_rule_has_a_runbook_section_its_runbook_url_points_at() -> None:
    page = DOCS / "operators.md"
    text = page.read_text(encoding="utf-8")
    ids = anchors(page)
    for rule in RULES:
        assert f"\n### {rule.name}\n" in text, f"{rule.name}: add a runbook section to docs/operators.md"
        assert f"<!-- gen:rule:{rule.name} -->" in text, rule.name
        section = text.split(f"\n### {rule.name}\n", 1)[1].split("\n### ", 1)[0]
        for part in ("**What it means.**", "**Look at.**", "**Fix.**", "**Do not**"):
            assert part in section, f"{rule.name}'s runbook lacks {part}"
        url = rule.runbook_url()
        assert url.startswith(RUNBOOK_PAGE + "#") and (ROOT / RUNBOOK_PAGE).is_file()
        assert url.split("#", 1)[1] in ids, f"{rule.name}: {url} names no section of {page.name}"
    sections = re.findall(r"^### (Rem\w+)$", text, re.M)
    assert sorted(sections) == sorted(r.name for r in RULES), "a runbook for a rule that does not exist"


def test_rem_metrics_rules_carry_runbook_urls_where_the_docs_are_served() -> None:
    default = rules_document()
    for entry, rule in zip(default["groups"][0]["rules"], RULES, strict=True):
        assert entry["annotations"]["runbook_url"] == f"docs/operators.md#{rule.name.lower()}"
    base = "https://docs.example/rem/operators/"
    proc = run_rem("metrics", "--rules", "--runbook-url", base, "--json")
    assert proc.returncode == 0, proc.stderr
    served = json.loads(proc.stdout)["groups"][0]["rules"]
    assert [r["annotations"]["runbook_url"] for r in served] == [f"{base}#{r.name.lower()}" for r in RULES]
    alone = run_rem("metrics", "--runbook-url", base, "--once")
    assert alone.returncode == 2 and "--runbook-url goes with --rules" in alone.stderr


def test_every_generated_alert_summary_reads_as_a_sentence() -> None:
    """Labels and values are different placeholders ("N KIND lease(s)"), never "N N"."""
    page = (DOCS / "operators.md").read_text(encoding="utf-8")
    for rule in RULES:
        shown = GEN.rendered_summary(rule.summary)
        assert f"> {shown}\n" in page, f"{rule.name}: {FIX}"
        assert "{{" not in shown and "}}" not in shown, shown
        words = shown.split()
        doubled = [a for a, b in zip(words, words[1:], strict=False) if a == b and a.isupper()]
        assert not doubled, f"{rule.name}: {shown}"
    assert not re.search(r"\b(N|DURATION|PERCENT) \1\b", page)


def test_the_summary_placeholders_keep_labels_apart_from_values() -> None:
    assert GEN.rendered_summary("{{ $value }} {{ $labels.kind }} lease(s)") == "N KIND lease(s)"
    assert GEN.rendered_summary("for {{ $value | humanizeDuration }}") == "for DURATION"
    assert GEN.rendered_summary("{{$labels.verdict}}") == "VERDICT"
    with pytest.raises(ValueError, match="cannot show"):
        GEN.rendered_summary("{{ range $x }}")


def _cli_sections() -> dict[str, str]:
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    parts = re.split(r"^## (rem [\w -]+)$", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_each_help_example_is_its_own_line_of_code() -> None:
    sections = _cli_sections()
    command = GEN.rem_command()
    root = command.make_context("rem", [], resilient_parsing=True)
    for words, sub, _ in GEN.walk_commands(command, root):
        section = sections[f"rem {' '.join(words)}"]
        said = len(re.findall(r"^\s*Examples?:", sub.help or "", re.M))
        shown = re.findall(r"^Example: `([^`]*)`", section, re.M)
        assert len(shown) == said, f"rem {' '.join(words)}: {FIX}"
        assert all("Example" not in code for code in shown), shown


def test_argument_names_and_usage_lines_are_the_ones_help_prints() -> None:
    for name, section in _cli_sections().items():
        usage = re.search(r"```text\n(.*)\n```", section)
        assert usage is not None, name
        assert "COMMAND [ARGS]... COMMAND" not in usage[1], usage[1]
        for cell in re.findall(r"^\| `([^`-][^`]*)` \|", section, re.M):
            assert cell in usage[1], f"{name}: the table's {cell} is not in the usage line {usage[1]}"


def test_the_api_reference_lists_every_operation_with_its_parameters() -> None:
    page = (DOCS / "api.md").read_text(encoding="utf-8")
    document = GEN.openapi_document()
    assert document["openapi"].startswith("3.1")
    operations = [(m.upper(), p, op) for p, item in document["paths"].items() for m, op in item.items()]
    assert len(operations) >= 14
    for method, path, operation in operations:
        section = page.split(f"\n### {method} {path}\n", 1)
        assert len(section) == 2, f"{method} {path}: {FIX}"
        body = section[1].split("\n### ", 1)[0]
        for parameter in operation.get("parameters", []):
            assert f"`{parameter['name']}` ({parameter['in']}" in body, (
                f"{method} {path} {parameter['name']}: {FIX}"
            )
        if path.startswith("/v1/"):
            assert "Scope: `" in body, f"{method} {path} names no scope: add openapi_extra x-rem-scope"
    assert "422" not in page  # every invalid request is a 400 in the one shape
