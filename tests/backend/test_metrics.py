"""`rem metrics`: every value equals the status snapshot it came from, parsed by prometheus_client itself."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from backend import ops
from backend.core import clock
from backend.core.datadir import DataDir
from backend.ops.prometheus import UNKNOWN_TOOL, SnapshotCollector, exposition, registry_for, tool_outcomes
from backend.ops.tool_status import OTHER_TOOL, TOOL_CAP, by_tool
from backend.runtime.context import Context
from tests.helpers import REM, data_fingerprint, rem_env, run_rem, wait_until
from tests.tui import scenes


@pytest.fixture
def scene_clock() -> Iterator[clock.FrozenClock]:
    frozen = clock.FrozenClock(scenes.NOW)
    clock.set_clock(frozen)
    yield frozen
    clock.set_clock(None)


def journal(scene: scenes.Scene) -> None:
    """Throughput the tally counts: turns with latencies, summaries, Dream passes, operator actions."""

    def rows() -> None:
        for i, latency in enumerate((80, 400, 1_200, 7_000)):
            scene.event(
                "execution.completed", scenes.EXEC_A, ago_ms=50_000 - i, turn=True, latency_ms=latency
            )
        scene.event("execution.completed", scenes.EXEC_A, ago_ms=49_000, turn=False)  # a handed-back claim
        scene.event("execution.completed", scenes.EXEC_A, ago_ms=48_000, turn=True)  # a takeover: no latency
        scene.event("summary.failed", scenes.SUMM, ago_ms=40_000)
        scene.event("operator.release", "alice", ago_ms=30_000, forced=False)
        scene.event("operator.release", "alice", ago_ms=29_000, forced=True)
        scene.event("operator.drain", "bob", ago_ms=28_000, result="draining")

    scene.tx(rows)


@pytest.fixture
def known_dir(tmp_path: Path, scene_clock: clock.FrozenClock) -> DataDir:
    return scenes.build(tmp_path / "data", scenes.incident, journal)


async def _status(data: DataDir) -> dict[str, Any]:
    ctx = Context(data, read_only=True, start_chroma=False)
    try:
        return await ops.status(ctx)
    finally:
        await ctx.close()


def _values(text: str, parser: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in parser(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def _get(values: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return values[(name, frozenset(labels.items()))]


@pytest.mark.parametrize("openmetrics", [True, False], ids=["openmetrics", "text-0.0.4"])
async def test_every_metric_equals_the_status_snapshot_it_came_from(
    known_dir: DataDir, openmetrics: bool
) -> None:
    status = await _status(known_dir)
    text = exposition(status, openmetrics=openmetrics).decode()
    values = _values(text, parse_openmetrics if openmetrics else parse_text)
    totals = status["totals"]
    for kind, n in totals["backlog"].items():
        assert _get(values, "rem_backlog_items", kind=kind) == n
        assert (
            _get(values, "rem_backlog_oldest_age_seconds", kind=kind)
            == totals["backlog_oldest_ms"][kind] / 1000
        )
    for kind, lease in totals["leases"].items():
        assert _get(values, "rem_leases", kind=kind) == lease["held"]
        assert _get(values, "rem_leases_expired", kind=kind) == lease["expired"]
        assert _get(values, "rem_leases_dead_owner", kind=kind) == lease["dead_owner"]
        assert _get(values, "rem_lease_expired_max_seconds", kind=kind) == lease["expired_max_ms"] / 1000
    for state in ("waiting", "parked"):
        assert _get(values, "rem_recoveries", state=state) == totals["recoveries"][state]
    for verdict, n in status["receipts"]["counts"].items():
        assert _get(values, "rem_receipts", verdict=verdict) == n
    for cls, n in status["dream_counts"].items():
        assert _get(values, "rem_dream_drift", **{"class": cls}) == n
    for worker in status["workers"]:
        labels = {k: str(worker[k]) for k in ("owner_id", "role", "state", "host", "pid")}
        assert _get(values, "rem_worker_heartbeat_age_seconds", **labels) == worker["heartbeat_age_ms"] / 1000
    for role in ("executor", "summarizer", "dream"):
        alive = sum(1 for w in status["workers"] if w["role"] == role and w["alive"])
        assert _get(values, "rem_workers_alive", role=role) == alive
        for state in ("running", "draining", "stopped"):
            n = sum(1 for w in status["workers"] if (w["role"], w["state"]) == (role, state))
            assert _get(values, "rem_workers", role=role, state=state) == n
    throughput = status["throughput"]
    for name, n in throughput["counters"].items():
        assert _get(values, f"rem_{name}_total") == n
    latency = throughput["turn_latency"]
    for bound, cumulative in zip(latency["buckets_s"], latency["cumulative"], strict=False):
        assert _get(values, "rem_turn_latency_seconds_bucket", le=str(float(bound))) == cumulative
    assert _get(values, "rem_turn_latency_seconds_count") == latency["count"]
    assert _get(values, "rem_turn_latency_seconds_sum") == latency["sum_s"]
    for row in throughput["operator_actions"]:
        assert (
            _get(values, "rem_operator_actions_total", action=row["action"], result=row["result"])
            == row["count"]
        )
    model = status["model"]
    for state in ("ok", "degraded", "down", "idle", "unused"):
        assert _get(values, "rem_model_state", state=state) == int(model["state"] == state)
    assert _get(values, "rem_model_window_seconds") == model["window_ms"] / 1000
    assert _get(values, "rem_model_requests") == model["requests"]
    for kind, n in model["requests_by_kind"].items():
        assert _get(values, "rem_model_requests_by_kind", kind=kind) == n
    for cls, n in model["errors_by_class"].items():
        assert _get(values, "rem_model_errors", **{"class": cls}) == n
    assert _get(values, "rem_model_error_ratio") == model["error_rate"]
    assert _get(values, "rem_model_retries") == model["retries"]
    for q, key in (("0.5", "ttft_ms_p50"), ("0.95", "ttft_ms_p95")):
        assert _get(values, "rem_model_ttft_seconds", quantile=q) == model[key] / 1000  # type: ignore[literal-required]
    assert _get(values, "rem_model_last_call_timestamp_seconds") == model["last_call_at"] / 1000
    assert _get(values, "rem_sessions_held") == len(status["backlog"]["held"]) == status["counts"]["held"]
    usage = status["usage"]["total"]
    assert _get(values, "rem_model_sessions") == usage["sessions"]
    for kind, n in usage["tokens"].items():
        assert _get(values, "rem_model_tokens", kind=kind) == n
    assert _get(values, "rem_model_cost") == pytest.approx(usage["cost"])
    index = status["backlog"]["index"]
    assert _get(values, "rem_recall_index_sessions_behind") == index["sessions_behind"]
    assert _get(values, "rem_recall_index_oldest_behind_seconds") == index["oldest_ms"] / 1000
    assert _get(values, "rem_recall_vectors_pending") == index["vectors_pending"]
    assert _get(values, "rem_recall_turns_indexed_approx") == index["turns_indexed_approx"]
    assert _get(values, "rem_chroma_up") == int(status["chroma"]["healthy"])
    assert _get(values, "rem_sessions") == status["counts"]["sessions"]
    tools = status["tools"]
    for tool, states in tools["by_tool"].items():
        for outcome in ("completed", "error", "denied"):
            key = ("rem_tool_calls_total", frozenset({"tool": tool, "outcome": outcome}.items()))
            assert values.get(key) == states.get(outcome)  # no sample for an outcome never seen
    for state, key in (("awaiting_approval", "awaiting_approval"), ("unknown", "unknown_outcome")):
        assert _get(values, "rem_tool_calls_waiting", state=state) == tools["counts"][state]
        oldest = tools[key][0]["age_ms"] / 1000 if tools[key] else 0.0  # type: ignore[literal-required]
        assert _get(values, "rem_tool_calls_waiting_oldest_seconds", state=state) == oldest
    assert _get(values, "rem_up") == 1


async def test_the_known_incident_reads_as_expected(known_dir: DataDir) -> None:
    """The scene's contents, counted by hand: a scrape that drifted from them fails here."""
    values = _values(exposition(await _status(known_dir)).decode(), parse_openmetrics)
    # executor B was killed 42 s ago (heartbeat stale): its one lease expired 12 s ago
    assert _get(values, "rem_leases", kind="execution") == 2
    assert _get(values, "rem_leases_dead_owner", kind="execution") == 1
    assert _get(values, "rem_leases_expired", kind="execution") == 1
    assert _get(values, "rem_lease_expired_max_seconds", kind="execution") == 12.0
    assert _get(values, "rem_recoveries", state="parked") == 1
    assert _get(values, "rem_recoveries", state="waiting") == 1
    # 4 waiting inputs, and the 2 of the session a model error holds (s-tango: asleep 80 s)
    assert _get(values, "rem_backlog_items", kind="input") == 6
    assert _get(values, "rem_backlog_oldest_age_seconds", kind="input") == 80.0
    for verdict in ("missing", "document_differs", "keys_differ", "quarantined"):
        assert _get(values, "rem_receipts", verdict=verdict) == 1
    assert _get(values, "rem_workers_alive", role="executor") == 1
    # 4 turns with a latency, 1 without (a takeover), 1 claim handed back: not a turn
    assert _get(values, "rem_turns_completed_total") == 5
    assert _get(values, "rem_turn_latency_seconds_count") == 4
    assert _get(values, "rem_turn_latency_seconds_bucket", le="0.5") == 2
    assert _get(values, "rem_turn_latency_seconds_bucket", le="5.0") == 3
    assert _get(values, "rem_turn_latency_seconds_sum") == pytest.approx(8.68)
    assert _get(values, "rem_summaries_completed_total") == 1
    assert _get(values, "rem_summaries_failed_total") == 1
    assert _get(values, "rem_dream_digested_total") == 1
    assert _get(values, "rem_receipts_quarantined_total") == 1
    assert _get(values, "rem_operator_actions_total", action="release", result="ok") == 1
    assert _get(values, "rem_operator_actions_total", action="release", result="forced") == 1
    assert _get(values, "rem_operator_actions_total", action="drain", result="draining") == 1
    assert _get(values, "rem_chroma_up") == 0  # no Chroma server for this data dir
    # the endpoint: 3 of 12 attempts rate-limited and a 401 in the window; s-tango held after it
    assert _get(values, "rem_model_state", state="down") == 1
    assert _get(values, "rem_model_errors", **{"class": "rate_limited"}) == 3
    assert _get(values, "rem_model_errors", **{"class": "auth"}) == 1
    assert _get(values, "rem_sessions_held") == 1
    assert _get(values, "rem_model_sessions") == 4
    # a read completed; a send waits for approval (95 s); a send's outcome is unknown (44 s)
    assert _get(values, "rem_tool_calls_total", tool="demo.notes_search", outcome="completed") == 1
    sent = frozenset({"tool": "demo.outbox_send", "outcome": "completed"}.items())
    assert ("rem_tool_calls_total", sent) not in values
    assert _get(values, "rem_tool_calls_waiting", state="awaiting_approval") == 1
    assert _get(values, "rem_tool_calls_waiting", state="unknown") == 1
    assert _get(values, "rem_tool_calls_waiting_oldest_seconds", state="awaiting_approval") == 95.0


def test_an_unreadable_state_db_is_rem_up_0_with_the_reason_not_a_500() -> None:
    def broken() -> dict[str, Any]:
        raise OSError("state.db: disk I/O error")

    registry = registry_for(SnapshotCollector(broken))
    from prometheus_client.openmetrics.exposition import generate_latest

    values = _values(generate_latest(registry).decode(), parse_openmetrics)
    assert _get(values, "rem_up") == 0
    assert _get(values, "rem_scrape_error_info", error="OSError: state.db: disk I/O error") == 1


def test_concurrent_scrapes_within_a_second_share_one_snapshot() -> None:
    taken: list[float] = []

    def load() -> dict[str, Any]:
        taken.append(time.monotonic())
        raise RuntimeError("counted")

    collector = SnapshotCollector(load, max_age_s=60)
    for _ in range(5):
        list(collector.collect())
    assert len(taken) == 1
    collector.max_age_s = 0
    list(collector.collect())
    assert len(taken) == 2


def test_the_server_binds_loopback_serves_openmetrics_and_writes_nothing(tmp_path: Path) -> None:
    data = scenes.build(tmp_path / "data", scenes.incident, journal, now=int(time.time() * 1000))
    before = data_fingerprint(data.root)
    log = tmp_path / "metrics.log"
    proc = subprocess_rem(["metrics", "--listen", "127.0.0.1:0", "--data", str(data.root)], log)
    try:
        line = wait_until(lambda: "serving http" in log.read_text() and log.read_text(), message="listening")
        url = line.split("serving ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        request = urllib.request.Request(
            url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
            text = response.read().decode()
        values = _values(text, parse_openmetrics)
        assert _get(values, "rem_leases_dead_owner", kind="execution") == 1
        assert _get(values, "rem_receipts", verdict="quarantined") == 1
        with urllib.request.urlopen(url, timeout=10) as response:  # a plain scraper gets text 0.0.4
            assert response.headers["Content-Type"].startswith("text/plain")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    assert data_fingerprint(data.root) == before
    assert "stopped after" in log.read_text()


def subprocess_rem(args: list[str], log: Path) -> Any:
    import subprocess

    out = open(log, "ab")
    return subprocess.Popen([REM, *args], stdout=subprocess.DEVNULL, stderr=out, env=rem_env())


def test_once_prints_one_scrape_and_json_is_refused_for_the_server(tmp_path: Path) -> None:
    data = scenes.build(tmp_path / "data", scenes.incident, now=int(time.time() * 1000))
    proc = run_rem("metrics", "--once", "--data", str(data.root))
    assert proc.returncode == 0, proc.stderr
    values = _values(proc.stdout, parse_openmetrics)
    assert _get(values, "rem_recoveries", state="parked") == 1
    status = run_rem("status", "--json", "--data", str(data.root))
    import json

    assert _get(values, "rem_sessions") == json.loads(status.stdout)["counts"]["sessions"]
    human = run_rem("status", "--data", str(data.root))
    assert human.returncode == 0 and "dead owner" in human.stdout, human.stderr
    refused = run_rem("metrics", "--json", "--data", str(data.root))
    assert refused.returncode == 2 and refused.stderr.startswith("rem: error: --json goes with --once")
    bad = run_rem("metrics", "--listen", "nowhere", "--data", str(data.root))
    assert bad.returncode == 2 and "is not HOST:PORT" in bad.stderr
    assert os.path.exists(data.state_db)


def test_tool_labels_stay_bounded_however_many_names_a_model_invents() -> None:
    """200 names a model made up (each only ever an error, each asked for more often than the real
    tool ran) and a few malformed ones: the real tool keeps its series, the rest are `(other)` or
    `(unknown)`, and the label set stays under the cap."""
    keyed = {f"error:madeup{i}.tool": 5 for i in range(200)}
    keyed |= {"completed:demo.notes_add": 1, "error:evil\x1b]0;x\x07.\u202etool": 30, "error:no-dot": 20}
    outcomes = tool_outcomes(by_tool(keyed))
    labels = {tool for tool, _ in outcomes}
    assert len(labels) <= TOOL_CAP + 2 and {"demo.notes_add", OTHER_TOOL, UNKNOWN_TOOL} <= labels
    assert outcomes[("demo.notes_add", "completed")] == 1
    assert outcomes[(UNKNOWN_TOOL, "error")] == 50
    assert sum(outcomes.values()) == sum(keyed.values())  # nothing dropped, only summed
