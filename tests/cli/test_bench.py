"""`rem bench` runs a real benchmark script and reports its figures (not a timing test)."""

from __future__ import annotations

import json

from tests.helpers import run_rem


def test_bench_quick_status_reports_measured_figures() -> None:
    proc = run_rem("bench", "--quick", "status", "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    (bench,) = report["benchmarks"]
    assert bench["name"] == "status"
    result = bench["result"]
    assert result["sessions"] == 10_000 and result["rounds"] > 0
    assert 0 < result["p50_ms"] <= result["p95_ms"] <= result["max_ms"]
    assert "p95" in bench["headline"][0]["figure"]


def test_bench_unknown_name_is_a_usage_error() -> None:
    proc = run_rem("bench", "nope")
    assert proc.returncode == 2
    assert "unknown benchmark nope" in proc.stderr
