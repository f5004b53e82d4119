"""`rem bench` runs a real benchmark script and reports its figures (not a timing test)."""

from __future__ import annotations

import json

from tests.helpers import rem_env, run_rem


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


def test_bench_quick_streaming_measures_a_real_executor_on_a_real_endpoint() -> None:
    proc = run_rem("bench", "--quick", "streaming", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr
    (bench,) = json.loads(proc.stdout)["benchmarks"]
    result = bench["result"]
    assert result["completed"] == result["sessions"] == 50
    assert result["deltas"] == 50 * 150  # every streamed token was made durable and counted
    assert 0 < result["durable_lag_ms_p50"] <= result["durable_lag_ms_p99"] <= result["durable_lag_ms_max"]
    assert 0 < result["commits_per_s"] and 0 < result["bare_commits_per_s"] and 0 < result["wal_pages_per_s"]
    assert result["parts"] < result["deltas"]  # coalesced: fewer part rows than deltas
    assert "durable lag" in bench["headline"][0]["what"]


def test_bench_help_names_every_benchmark() -> None:
    from backend.programs.bench import BENCHES

    proc = run_rem("bench", "--help", env={**rem_env(), "COLUMNS": "400"})
    assert proc.returncode == 0, proc.stderr
    missing = [name for name in BENCHES if name not in proc.stdout]
    assert not missing, proc.stdout
