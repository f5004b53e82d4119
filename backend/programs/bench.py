"""`rem bench`: run the benchmark scripts of `benchmarks/` and collect their headline figures.

Each benchmark is a script in the source tree that prints one JSON document
(the scripts are the measurement; this only runs them and picks the figures
the README table shows). `quick=True` runs smaller sizes for a fast look.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.core import processes
from backend.core.errors import RemError, UsageError

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    headline: Callable[[dict[str, Any]], list[tuple[str, str]]]


def _turns(r: dict[str, Any]) -> list[tuple[str, str]]:
    rounds = r.get("rounds", 1)
    return [
        ("turns/s (instant agent)", f"{r['turns_per_s']:,.0f}"),
        (
            "turn-path write tx/s vs bare BEGIN;INSERT;COMMIT (median round)",
            f"{r['turn_path_tx_per_s']:,.0f} vs {r['bare_tx_per_s']:,.0f} (ratio {r.get('ratio_median', r['ratio'])}; "
            f"{rounds} rounds {r.get('ratio_min', r['ratio'])}-{r.get('ratio_max', r['ratio'])})",
        ),
        (
            "the same per CPU second of the process (immune to what other work leaves)",
            f"ratio {r.get('ratio_cpu_median', '-')} ({rounds} rounds {r.get('ratio_cpu_min', '-')}-"
            f"{r.get('ratio_cpu_max', '-')}); load average {r.get('load_average_1m', '-')}",
        ),
    ]


def _streaming(r: dict[str, Any]) -> list[tuple[str, str]]:
    streams = f"{r['sessions']} streams x {r['tokens_per_s_per_stream']:g} tokens/s, one executor"
    return [
        (
            f"durable lag, delta -> committed ({streams}; target p99 < 250 ms)",
            f"p50 {r['durable_lag_ms_p50']} ms, p99 {r['durable_lag_ms_p99']} ms, max {r['durable_lag_ms_max']} ms "
            f"({r['deltas_per_s']:,} deltas/s achieved, stream {r['wall_s']} s vs {r['ideal_stream_s']} s ideal)",
        ),
        (
            "commits/s vs bare commits/s on the same file; WAL pages/s",
            f"{r['commits_per_s']} vs {r['bare_commits_per_s']:,} ({r['write_tx_per_s']} write tx/s); "
            f"{r['wal_pages_per_s']:,} pages/s",
        ),
        (
            "executor CPU share (load average, machine busy)",
            f"{r['executor_cpu_pct']}% of a core, {r['executor_cpu_us_per_delta']} us/delta "
            f"(load {r['load_average_1m']}, machine {r['machine_busy_pct_of_all_cores']}% busy)",
        ),
        (
            "time to first token rem adds to the server's own",
            f"p50 {r['rem_adds_ms_sequential_p50']} ms single requests; p50 {r['rem_adds_ms_p50']} ms when "
            f"all {r['sessions']} start at once (server's own p50 {r['server_ttft_ms_p50']} ms)",
        ),
    ]


def _receipts(r: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (
            f"receipts verified/s vs raw batched get ({r['receipts']:,} receipts)",
            f"{r['verified_receipts_per_s']:,} vs {r['raw_get_rows_per_s']:,} rows/s (ratio {r['ratio']})",
        )
    ]


def _dream(r: dict[str, Any]) -> list[tuple[str, str]]:
    sel, dig = r["selection"], r["digest_with_chroma"]
    return [
        (
            f"Dream selection ({sel['sessions']:,} sessions, {sel['pending']:,} pending)",
            f"median {sel['select_ms_median']} ms, p99 {sel['select_ms_p99']} ms",
        ),
        ("Dream sessions digested/s (with Chroma overlay)", f"{dig['sessions_per_s']}"),
    ]


def _status(r: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (
            f"status() at {r['sessions']:,} sessions / {r['leases']:,} leases",
            f"p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms",
        )
    ]


def _console_freshness(r: dict[str, Any]) -> list[tuple[str, str]]:
    # one store's result, or (`--store both`) one per store
    per_store: dict[str, Any] = {name: r[name] for name in ("sqlite", "postgresql") if name in r} or {"": r}
    rows = []
    for name, one in per_store.items():
        lat = one["latency_ms"]
        on = f" on {name}" if name else ""
        rows.append(
            (
                f"console{on}: commit by another process -> on screen ({one['commits']} commits)",
                f"p50 {lat['p50']} ms, p95 {lat['p95']} ms, max {lat['max']} ms",
            )
        )
    return rows


def _console_load(r: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for p in r["points"]:
        lat = p["latency_ms"]
        rows.append(
            (
                f"console on {p['store']}, {p['backlog']:,} waiting, {p['rate']:g} commits/s",
                f"CPU {p['cpu_pct']} %, commit -> screen p50 {lat.get('p50')} ms p95 {lat.get('p95')} ms, "
                f"{p['refreshes_per_s']} refreshes/s, RSS {p['rss_mb']['start']} -> {p['rss_mb']['end']} MB",
            )
        )
    return rows


def _console_scale(r: dict[str, Any]) -> list[tuple[str, str]]:
    start = max(s["start_s"] for s in r["start"])
    sessions = f"{r['sessions']:,}" if isinstance(r.get("sessions"), int) else "?"
    return [
        (f"console start ({sessions} sessions)", f"{start:.2f} s"),
        (
            f"console under writes every {r['writes_every_ms']:g} ms ({r['soak_s']} s, a key/s)",
            f"longest UI callback {r['callback_cpu_ms']['max']} ms CPU "
            + (
                f"({r['refresh_only']['callback_cpu_ms']['max']} ms with refreshes alone), "
                if r.get("refresh_only")
                else ", "
            )
            + f"RSS max {r['rss_mb']['max']} MB",
        ),
    ]


def _scale(r: dict[str, Any]) -> list[tuple[str, str]]:
    data, status, scrape = r["data"], r["status"], r["scrape"]
    size = (
        f"{data['sessions']:,} sessions / {data['messages']:,} messages / {data['receipts']:,} receipts "
        f"({data['mismatched']:,} mismatched) / {data['leases']:,} leases"
    )
    out = [
        (
            f"scale {r['scale']}x data dir: {size}",
            f"{data['bytes'] / 2**30:.2f} GiB, built in {data['build_s']} s",
        ),
        *(
            (
                f"status() at {r['scale']}x, {label} ({status[mode]['n']} rounds)",
                f"p50 {status[mode]['p50_ms']} ms, p95 {status[mode]['p95_ms']} ms, max {status[mode]['max_ms']} ms",
            )
            for mode, label in (
                ("unchanged", "nothing committed between"),
                ("after_commit", "re-read as after a commit"),
                ("scrape_after_commit", "the same + OpenMetrics (a scrape's work)"),
            )
        ),
        (
            f"rem metrics scrape at {r['scale']}x (1.1 s apart / cached)",
            f"p95 {scrape['cold']['p95_ms']} ms / {scrape['warm']['p95_ms']} ms",
        ),
    ]
    if "check" in r:
        out.append(
            (
                f"rem check (state.db) at {r['scale']}x",
                f"{r['check']['seconds']} s, longest read {r['check']['longest_read_ms']} ms",
            )
        )
    return out


def _check_cold(r: dict[str, Any]) -> list[tuple[str, str]]:
    def runs(key: str) -> str:
        return " / ".join(f"{x['s']} s (structure {x['structure_s']} s)" for x in r[key])

    gib = r["bytes"] / 2**30
    return [
        (f"rem check (state.db, {gib:.2f} GiB) from a cold page cache", runs("cold_read_ahead")),
        ("the same without reading state.db ahead", f"{runs('cold')}; same findings: {r['same_findings']}"),
    ]


def _idle(r: dict[str, Any]) -> list[tuple[str, str]]:
    # one store's result, or (`--store both`) one per store
    per_store: dict[str, Any] = {name: r[name] for name in ("sqlite", "postgresql") if name in r} or {"": r}
    rows = []
    for one in per_store.values():
        cpu, wake = one["idle_cpu"], one["wake_latency"]
        rows.append(
            (
                f"idle fleet on {one['store']}: CPU per daemon over {cpu['window_s']:g} s "
                f"({one['turns']:,} turns settled; target <= 0.2 % of a core)",
                f"max {cpu['daemon_pct_max']} %, mean {cpu['daemon_pct_mean']} %; supervisor "
                f"{cpu['pct_of_a_core'].get('supervisor')} % (load {cpu['load_average_1m']})",
            )
        )
        rows.append(
            (
                f"wake on {one['store']}: input durable -> claimed ({wake['n']} inputs; target median <= 500 ms)",
                f"median {wake['median_ms']} ms, p90 {wake['p90_ms']} ms, max {wake['max_ms']} ms",
            )
        )
    return rows


BENCHES = {
    "turns": Bench(
        "turns",
        "turns.py",
        (),
        ("--turns", "400", "--sessions", "20", "--bare", "2000", "--rounds", "3", "--slices", "3"),
        _turns,
    ),
    "streaming": Bench(
        "streaming",
        "streaming.py",
        (),
        ("--sessions", "50", "--tokens", "150", "--bare", "1000", "--sequential", "10"),
        _streaming,
    ),
    "receipts": Bench(
        "receipts", "receipts.py", ("--json",), ("--json", "--receipts", "2000", "--rounds", "3"), _receipts
    ),
    "dream": Bench(
        "dream",
        "dream.py",
        ("--json",),
        ("--json", "--sessions", "10000", "--pending", "500", "--digest", "50"),
        _dream,
    ),
    "status": Bench("status", "status.py", (), ("--quick",), _status),
    "console": Bench("console", "console_freshness.py", (), ("--commits", "30"), _console_freshness),
    "console-load": Bench(
        "console-load",
        "console_load.py",
        (),
        ("--store", "sqlite", "--rates", "10,200", "--backlogs", "100,3000", "--seconds", "5"),
        _console_load,
    ),
    "scale": Bench(
        "scale",
        "scale.py",
        ("--scale", "10"),
        ("--scale", "1", "--rounds", "50", "--scrapes", "5"),
        _scale,
    ),
    "check-cold": Bench(
        "check-cold",
        "check_cold.py",
        ("--scale", "10", "--rounds", "1"),
        ("--scale", "1", "--rounds", "1"),
        _check_cold,
    ),
    "idle": Bench(
        "idle",
        "idle.py",
        ("--json",),
        (
            "--json",
            "--turns",
            "600",
            "--sessions",
            "30",
            "--window-s",
            "10",
            "--quiet-s",
            "3",
            "--wakes",
            "5",
            "--settle-timeout-s",
            "600",
        ),
        _idle,
    ),
    "console-scale": Bench(
        "console-scale",
        "console_scale.py",
        ("--soak-s", "120"),
        ("--sessions", "20000", "--soak-s", "15", "--quiet-s", "10"),
        _console_scale,
    ),
}


def run_one(bench: Bench, quick: bool, timeout_s: float = 1800) -> dict[str, Any]:
    script = BENCH_DIR / bench.script
    if not script.exists():
        raise UsageError(f"{script} not found: `rem bench` runs from a source checkout (pip install -e .)")
    args = bench.quick if quick else bench.full
    started = time.monotonic()
    command = processes.python_child(script, *args, cwd=BENCH_DIR.parent)
    proc = command.run(capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RemError(f"benchmark {bench.name} failed (exit {proc.returncode}): {tail}")
    result = json.loads(proc.stdout[proc.stdout.index("{") :])
    return {
        "name": bench.name,
        "seconds": round(time.monotonic() - started, 1),
        "result": result,
        "headline": [{"what": w, "figure": f} for w, f in bench.headline(result)],
    }


def run(
    names: list[str] | None, quick: bool, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run the named benchmarks (default: all) and return their results and headlines."""
    chosen = names or list(BENCHES)
    unknown = [n for n in chosen if n not in BENCHES]
    if unknown:
        raise UsageError(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(BENCHES)}")
    results = []
    for name in chosen:
        if progress is not None:
            progress(f"running {name} ...")
        results.append(run_one(BENCHES[name], quick))
    return {"quick": quick, "benchmarks": results}
