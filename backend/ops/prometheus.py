"""`rem metrics`: the status snapshot as Prometheus metric families (OpenMetrics or text 0.0.4).

Every value is read from one `status()` snapshot, never from a second query,
so a scrape and `rem status --json` taken from the same snapshot agree
(tests/backend/test_metrics.py parses the exposition with prometheus_client's
own parser and compares). A family is added here once the snapshot carries
its figures, never reported as a made-up zero: a time-to-first-token
quantile with no request in the window has no sample. Label values are bounded: kinds, roles, states, verdicts
and classes are fixed sets; the per-worker heartbeat gauge has one series per
listed worker (live ones, and those stopped in the last ten minutes). Tool names come
from the model (it may ask for any name): a name that is not a well-formed `SERVER.TOOL`
(letters, digits, `_`, `-`, and dots in the tool's part, as MCP names tools) is counted under
`(unknown)`, and past the 50 most used (the tools that ran first: `ops.tool_status.TOOL_CAP`)
under `(other)`, so a model inventing names can neither grow the series nor put a terminal
escape in a label. Every label value that comes from the data (a host, an owner id, a URL, an
error) is inert text (`backend.core.inert.visible`) of at most `LABEL_MAX` characters.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from backend.core.inert import visible
from backend.models.health import ModelState
from backend.ops.tool_status import OTHER_TOOL
from backend.ops.totals import BACKLOG_KINDS, LEASE_KINDS
from backend.store.workers import WorkerRole, WorkerState

ROLES = tuple(WorkerRole)
WORKER_STATES = tuple(WorkerState)
RECEIPT_VERDICTS = ("present", "missing", "document_differs", "keys_differ", "quarantined", "unchecked")
THROUGHPUT_HELP = {
    "turns_completed": "Turns completed (execution.completed events of a turn).",
    "summaries_completed": "Summaries completed (synthesis or receipt recovery).",
    "summaries_failed": "Summary jobs that failed.",
    "dream_digested": "Dream passes that attested a revision.",
    "receipts_replayed": "Receipts replayed into Chroma.",
    "receipts_quarantined": "Receipt envelopes quarantined as corrupt.",
}


LABEL_MAX = 128
UNKNOWN_TOOL = "(unknown)"
# a tool's name as rem lists it, SERVER.TOOL: a configuration key, then an MCP tool name
TOOL_LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}\.[A-Za-z0-9_.-]{1,128}")


def label(value: object) -> str:
    """A label value from the data: its control characters shown as escapes, at most LABEL_MAX long."""
    text = visible(str(value))  # StrEnum members as their plain values
    return text if len(text) <= LABEL_MAX else text[: LABEL_MAX - 1] + "…"


def tool_label(tool: str) -> str:
    """A tool's label: its name when well formed (or `(other)`), else `(unknown)` (a model's invention)."""
    return tool if tool == OTHER_TOOL or TOOL_LABEL.fullmatch(tool) else UNKNOWN_TOOL


def _seconds(ms: float | None) -> float:
    return 0.0 if ms is None else ms / 1000.0


def _gauge(name: str, doc: str, labels: list[str], rows: Iterable[tuple[list[str], float]]) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in rows:
        family.add_metric([label(v) for v in values], value)
    return family


def _state_families(status: Mapping[str, Any]) -> Iterator[Metric]:
    totals = status["totals"]
    yield _gauge(
        "rem_backlog_items",
        "Work waiting, by kind (input: admitted inputs; recovery: takeovers waiting; "
        "summary: sessions whose summary lags their turns; dream: revisions not digested).",
        ["kind"],
        (([k], totals["backlog"][k]) for k in BACKLOG_KINDS),
    )
    yield _gauge(
        "rem_backlog_oldest_age_seconds",
        "Age of the oldest waiting item of each backlog kind (0 when empty).",
        ["kind"],
        (([k], _seconds(totals["backlog_oldest_ms"][k])) for k in BACKLOG_KINDS),
    )
    leases = totals["leases"]
    for field, name, doc in (
        ("held", "rem_leases", "Leases held, by kind."),
        ("expired", "rem_leases_expired", "Leases past their expiry, not taken over yet, by kind."),
        ("dead_owner", "rem_leases_dead_owner", "Leases whose owner is stopped or stopped heartbeating."),
    ):
        yield _gauge(name, doc, ["kind"], (([k], leases[k][field]) for k in LEASE_KINDS))
    yield _gauge(
        "rem_lease_expired_max_seconds",
        "How long the longest-expired lease of each kind has been expired (0: none expired).",
        ["kind"],
        (([k], _seconds(leases[k]["expired_max_ms"])) for k in LEASE_KINDS),
    )
    recoveries = totals["recoveries"]
    yield _gauge(
        "rem_recoveries",
        "Recovery rows of interrupted executions: waiting for a takeover, or parked for the "
        "operator after the attempt budget.",
        ["state"],
        (([s], recoveries[s]) for s in ("waiting", "parked")),
    )
    counts = status["receipts"]["counts"]
    yield _gauge(
        "rem_receipts",
        "Staged summary receipts by their latest verification verdict.",
        ["verdict"],
        (([v], counts.get(v, 0)) for v in RECEIPT_VERDICTS),
    )
    yield _gauge(
        "rem_dream_drift",
        "Sessions whose Dream state lags, by drift class.",
        ["class"],
        (([c], n) for c, n in status["dream_counts"].items()),
    )
    yield _gauge("rem_sessions", "Sessions in state.db.", [], [([], status["counts"]["sessions"])])


def _worker_families(status: Mapping[str, Any]) -> Iterator[Metric]:
    listed = status["workers"]
    by_state = {(r, s): 0 for r in ROLES for s in WORKER_STATES}
    alive = dict.fromkeys(ROLES, 0)
    for w in listed:
        by_state[(w["role"], w["state"])] = by_state.get((w["role"], w["state"]), 0) + 1
        alive[w["role"]] = alive.get(w["role"], 0) + int(bool(w["alive"]))
    yield _gauge(
        "rem_workers",
        "Workers by role and recorded state (stopped: within the last ten minutes).",
        ["role", "state"],
        (([r, s], n) for (r, s), n in sorted(by_state.items())),
    )
    yield _gauge(
        "rem_workers_alive",
        "Workers running or draining with a fresh heartbeat, by role.",
        ["role"],
        (([r], n) for r, n in sorted(alive.items())),
    )
    yield _gauge(
        "rem_worker_heartbeat_age_seconds",
        "Seconds since each listed worker's last heartbeat.",
        ["owner_id", "role", "state", "host", "pid"],
        (
            (
                [w["owner_id"], w["role"], w["state"], w["host"], str(w["pid"])],
                _seconds(w["heartbeat_age_ms"]),
            )
            for w in listed
        ),
    )


def _throughput_families(status: Mapping[str, Any]) -> Iterator[Metric]:
    throughput = status["throughput"]
    created = throughput["since"] / 1000 if throughput.get("since") else None
    for name, value in throughput["counters"].items():
        yield CounterMetricFamily(
            f"rem_{name}", THROUGHPUT_HELP.get(name, name), value=value, created=created
        )
    latency = throughput["turn_latency"]
    buckets = [
        (floatToGoString(b), float(c))  # type: ignore[no-untyped-call]
        for b, c in zip(latency["buckets_s"], latency["cumulative"], strict=False)
    ]
    buckets.append(("+Inf", float(latency["count"])))
    yield HistogramMetricFamily(
        "rem_turn_latency_seconds",
        "Turn latency: the turn's oldest input admitted -> its reply completed.",
        buckets=buckets,
        sum_value=latency["sum_s"],
    )
    actions = CounterMetricFamily(
        "rem_operator_actions",
        "Operator actions journaled, by action and result.",
        labels=["action", "result"],
    )
    for row in throughput["operator_actions"]:
        actions.add_metric([label(row["action"]), label(row["result"])], row["count"], created=created)
    yield actions


def _chroma_families(status: Mapping[str, Any]) -> Iterator[Metric]:
    chroma = status.get("chroma") or {}
    yield _gauge(
        "rem_chroma_up",
        "1 when the Chroma server answers its heartbeat.",
        [],
        [([], int(bool(chroma.get("healthy"))))],
    )
    info = InfoMetricFamily("rem_chroma", "Where the Chroma server is.")
    info.add_metric(
        [], {"url": label(chroma.get("url") or ""), "external": str(bool(chroma.get("external"))).lower()}
    )
    yield info


def _recall_index_families(status: Mapping[str, Any]) -> Iterator[Metric]:
    """How far the recall index is behind Dream's published revisions."""
    index = status["backlog"]["index"]
    yield _gauge(
        "rem_recall_index_sessions_behind",
        "Sessions whose published revision the recall index has not indexed yet.",
        [],
        [([], index["sessions_behind"])],
    )
    yield _gauge(
        "rem_recall_index_oldest_behind_seconds",
        "Age of the oldest published revision not indexed yet (0: none).",
        [],
        [([], _seconds(index["oldest_ms"]))],
    )
    yield _gauge(
        "rem_recall_vectors_pending",
        "Indexed turns whose vector is not in Chroma yet.",
        [],
        [([], index["vectors_pending"])],
    )
    yield _gauge(
        "rem_recall_turns_indexed_approx",
        "Turn rows ever indexed (the highest row id: approximate, O(1)).",
        [],
        [([], index["turns_indexed_approx"])],
    )


def _model_families(status: Mapping[str, Any]) -> Iterator[Metric]:
    """The model endpoint over its recent window: state, requests, errors, retries, time to first token."""
    model = status["model"]
    yield _gauge(
        "rem_model_state",
        "1 for the model endpoint's state over the recent window (ok, degraded, down, idle, unused).",
        ["state"],
        (([state], int(model["state"] == state)) for state in ModelState),
    )
    window = f"in the last {model['window_ms'] / 1000:g} s"
    yield _gauge(
        "rem_model_window_seconds",
        "The window the model figures cover.",
        [],
        [([], _seconds(model["window_ms"]))],
    )
    yield _gauge("rem_model_requests", f"Model request attempts {window}.", [], [([], model["requests"])])
    yield _gauge(
        "rem_model_requests_by_kind",
        f"Model request attempts {window}, by call kind.",
        ["kind"],
        (([kind], n) for kind, n in model["requests_by_kind"].items()),
    )
    yield _gauge(
        "rem_model_errors",
        f"Failed model request attempts {window}, by error class.",
        ["class"],
        (([cls], n) for cls, n in model["errors_by_class"].items()),
    )
    yield _gauge(
        "rem_model_error_ratio",
        f"Failed / all model request attempts {window}.",
        [],
        [([], model["error_rate"])],
    )
    yield _gauge("rem_model_retries", f"Model request retries {window}.", [], [([], model["retries"])])
    yield _gauge(
        "rem_model_ttft_seconds",
        f"Time to first token {window} (quantiles; no sample without a request).",
        ["quantile"],
        (
            ([q], _seconds(v))
            for q, v in (("0.5", model["ttft_ms_p50"]), ("0.95", model["ttft_ms_p95"]))
            if v is not None
        ),
    )
    if model["last_call_at"] is not None:
        yield _gauge(
            "rem_model_last_call_timestamp_seconds",
            "When the last model request was made.",
            [],
            [([], model["last_call_at"] / 1000)],
        )


def _usage_families(status: Mapping[str, Any]) -> Iterator[Metric]:
    """The sessions a model error holds, and tokens and cost over every session."""
    yield _gauge(
        "rem_sessions_held",
        "Sessions a model error holds for an operator (`rem resume`).",
        [],
        [([], len(status["backlog"]["held"]))],
    )
    total = status["usage"]["total"]
    yield _gauge(
        "rem_model_sessions", "Sessions that used a model (or failed to).", [], [([], total["sessions"])]
    )
    yield _gauge(
        "rem_model_tokens",
        "Tokens over every session, by kind (input, output, reasoning, cache_read, cache_write).",
        ["kind"],
        (([kind], n) for kind, n in total["tokens"].items()),
    )
    yield _gauge(
        "rem_model_cost", "Cost over every session, in the price table's currency.", [], [([], total["cost"])]
    )


# the outcomes rem_tool_calls_total counts: the states a call never leaves (a counter only grows);
# the calls waiting for a person are rem_tool_calls_waiting's
TOOL_OUTCOMES = ("completed", "error", "denied")
TOOL_WAITING = ("awaiting_approval", "unknown")


def tool_outcomes(by_tool: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, str], int]:
    """The finished calls by (tool label, outcome): the names a label stands for summed."""
    out: dict[tuple[str, str], int] = {}
    for tool, states in by_tool.items():
        for outcome in TOOL_OUTCOMES:
            if states.get(outcome):
                key = (tool_label(tool), outcome)
                out[key] = out.get(key, 0) + states[outcome]
    return out


def _tool_families(status: Mapping[str, Any]) -> Iterator[Metric]:
    """Agent tool calls: finished ones by tool and outcome, and those waiting for a person."""
    tools = status.get("tools")  # (a moment recorded before tool calls existed has none)
    if tools is None:
        return
    total = CounterMetricFamily(
        "rem_tool_calls",
        "Agent tool calls finished, by tool (NAME.TOOL; a malformed name: (unknown); past the 50 most used: "
        "(other)) and outcome.",
        labels=["tool", "outcome"],
    )
    for (tool, outcome), n in sorted(tool_outcomes(tools["by_tool"]).items()):
        total.add_metric([tool, outcome], n)
    yield total
    yield _gauge(
        "rem_tool_calls_waiting",
        "Agent tool calls waiting for an operator, by state (awaiting_approval: `rem approve|deny`; "
        "unknown: an effect in flight when its executor died or timed out, `rem resolve`).",
        ["state"],
        (([state], tools["counts"].get(state, 0)) for state in TOOL_WAITING),
    )
    oldest = {"awaiting_approval": tools["awaiting_approval"], "unknown": tools["unknown_outcome"]}
    yield _gauge(
        "rem_tool_calls_waiting_oldest_seconds",
        "How long the oldest call of each waiting state has waited since it was made (0: none).",
        ["state"],
        (([state], _seconds(calls[0]["age_ms"]) if calls else 0.0) for state, calls in oldest.items()),
    )


def _api_families(status: Mapping[str, Any]) -> Iterator[Metric]:
    """Each live API server's requests, latency, open requests and streams (`ops.api_status`)."""
    servers = (status.get("api") or {}).get("servers", [])  # a moment recorded before the API has none
    requests = CounterMetricFamily(
        "rem_api_requests",
        "Requests each API server answered since it started, by method, route template and status code.",
        labels=["owner_id", "method", "route", "code"],
    )
    latency = HistogramMetricFamily(
        "rem_api_request_duration_seconds",
        "Time from a request to its response's start (a stream's: to its headers), per API server and route.",
        labels=["owner_id", "method", "route"],
    )
    for server in servers:
        for row in server["requests"]:
            requests.add_metric(
                [server["owner_id"], row["method"], row["route"], str(row["code"])], row["count"]
            )
        for row in server["latency"]:
            buckets = [
                (floatToGoString(b), float(c))  # type: ignore[no-untyped-call]
                for b, c in zip(row["buckets_s"], row["cumulative"], strict=True)
            ]
            buckets.append(("+Inf", float(row["count"])))
            latency.add_metric([server["owner_id"], row["method"], row["route"]], buckets, row["sum_s"])
    yield requests
    yield latency
    for name, key, doc in (
        (
            "rem_api_requests_in_flight",
            "requests_in_flight",
            "Requests each API server is answering (open streams included).",
        ),
        ("rem_api_streams_open", "streams_open", "Event streams each API server holds open."),
        (
            "rem_api_server_error_ratio",
            "server_error_ratio",
            "The share of requests each API server answered with a 5xx in its last five minutes (0: none).",
        ),
    ):
        yield _gauge(name, doc, ["owner_id"], (([s["owner_id"]], s[key]) for s in servers))


def families(status: Mapping[str, Any]) -> list[Metric]:
    """Every metric family of one status snapshot."""
    out: list[Metric] = [
        _gauge("rem_up", "1: the snapshot was read from state.db.", [], [([], 1)]),
        _gauge(
            "rem_snapshot_timestamp_seconds",
            "When the snapshot these metrics come from was taken.",
            [],
            [([], status["generated_at"] / 1000)],
        ),
    ]
    for produce in (
        _state_families,
        _worker_families,
        _throughput_families,
        _chroma_families,
        _model_families,
        _usage_families,
        _recall_index_families,
        _tool_families,
        _api_families,
    ):
        out.extend(produce(status))
    return out


def down_families(error: str) -> list[Metric]:
    """What a scrape reports when state.db cannot be read: `rem_up 0` and why, never an HTTP 500."""
    info = InfoMetricFamily("rem_scrape_error", "Why the last snapshot could not be read.")
    info.add_metric([], {"error": label(error[:200])})
    return [_gauge("rem_up", "1: the snapshot was read from state.db.", [], [([], 0)]), info]


class SnapshotCollector(Collector):
    """A prometheus_client collector over a snapshot source, cached for at most `max_age_s`.

    `load` returns a status snapshot (it runs on the scraping thread); a
    failure is reported as `rem_up 0` with the error, and retried next scrape.
    """

    def __init__(self, load: Callable[[], Mapping[str, Any]], max_age_s: float = 1.0) -> None:
        self._load = load
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._cached: list[Metric] | None = None
        self._taken = 0.0
        self.snapshots = 0

    def collect(self) -> Iterator[Metric]:
        with self._lock:  # concurrent scrapes share one snapshot instead of each taking their own
            if self._cached is None or time.monotonic() - self._taken > self.max_age_s:
                try:
                    self._cached = families(self._load())
                    self.snapshots += 1
                except Exception as exc:  # reported as a metric, not a 500: Prometheus keeps the series
                    self._cached = down_families(f"{type(exc).__name__}: {exc}")
                self._taken = time.monotonic()
            cached = self._cached
        yield from cached


class StaticCollector(Collector):
    """The families of one snapshot (for `rem metrics --once` and the tests)."""

    def __init__(self, status: Mapping[str, Any]) -> None:
        self._families = families(status)

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def registry_for(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(status: Mapping[str, Any], *, openmetrics: bool = True) -> bytes:
    """The snapshot in the OpenMetrics text format (or Prometheus text 0.0.4)."""
    registry = registry_for(StaticCollector(status))
    if openmetrics:
        # import time: prometheus_client's exposition formats, only when one is written
        from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

        text: bytes = generate_openmetrics(registry)  # type: ignore[no-untyped-call]
        return text
    # import time: prometheus_client's exposition formats, only when one is written
    from prometheus_client.exposition import generate_latest

    return generate_latest(registry)


def samples(status: Mapping[str, Any]) -> list[tuple[str, dict[str, str], float]]:
    """Every sample (name, labels, value) of a snapshot: what the alert rules read."""
    return [(s.name, dict(s.labels), float(s.value)) for f in families(status) for s in f.samples]
