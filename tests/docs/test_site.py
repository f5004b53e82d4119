"""The docs site builds offline, strictly, and its runbook anchors exist in the built pages.

The gates already run `mkdocs build --strict` (tests/gates.py); this builds it
once more into a temp dir to look inside: the runbook ids Prometheus links to,
and no asset fetched from elsewhere when a page is opened.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from backend.ops.alert_rules import RULES
from tests.docs.pages import README, ROOT


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_every_runbook_url_anchor_is_an_id_of_the_built_runbook_page(site: Path) -> None:
    html = (site / "operators" / "index.html").read_text(encoding="utf-8")
    ids = set(re.findall(r'\bid="([^"]+)"', html))
    for rule in RULES:
        assert rule.runbook_anchor in ids, rule.name


def test_pages_load_nothing_from_elsewhere(site: Path) -> None:
    for page in site.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        external = re.findall(r'<(?:link|script|img)\b[^>]*\b(?:href|src)="(?:https?:)?//[^"]+"', html)
        assert not external, (page, external[:3])
    assert (site / "screenshots" / "console.svg").is_file()  # the screenshots are part of the site


def test_the_build_needs_no_network() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["theme"]["font"] is False  # Material would link Google Fonts
    plugins = {p if isinstance(p, str) else next(iter(p)) for p in config.get("plugins", [])}
    assert not plugins & {"social", "privacy", "material/social", "material/privacy"}, plugins
    assert config["strict"] is True


def test_the_readme_is_short_and_its_figures_are_results_linked_to_the_benchmarks() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250 and len(text.encode()) <= 20 * 1024
    results = text.split("\n## Results\n", 1)[1]
    for line in results.splitlines():
        if line.startswith("* "):
            assert "](docs/benchmarks.md#" in line, line
    before = text.split("\n## Results\n", 1)[0]
    measured = re.findall(r"\b\d[\d ]*(?:\.\d+)? ?(?:ms|s|MB|GB|KB|turns/s|tx/s|%)\b", before)
    assert not measured, f"figures outside the Results section: {measured}"
    assert (
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest" in text
    )
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert (
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest" in ci
    )


def test_the_benchmark_page_has_a_row_for_every_benchmark_and_no_cell_over_200_characters() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    for row in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        assert len(cells) == 6, row[:80]
        long = [c for c in cells if len(re.sub(r'<a id="[\w-]+"></a>', "", c)) > 200]
        assert not long, long
        assert re.search(r"`[0-9a-f]{7}`", cells[5]), f"no commit for {cells[0][:60]}"
    helpers = {"__init__", "console_common", "pg_common", "gen_big"}  # shared code, a data generator
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        if script.stem not in helpers:
            assert f"benchmarks/{script.name}" in text or f"rem bench {script.stem}" in text, script.name
