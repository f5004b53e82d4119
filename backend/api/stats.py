"""What a `rem serve` process counts of its requests, for its worker row and `rem metrics`.

`Metered` (a plain ASGI middleware, so streams pass through untouched) counts each request by
method, route template and status code, times it to its response start (a stream's time to
its headers, not its length), keeps how many are in flight, and a five-minute window of how
many answered 5xx. `ApiStats.record` is the JSON the server writes into its worker row's
`info` at each heartbeat that changed it (never per request); `rem status` and `rem metrics`
read it from there (`backend.ops.api_status`), so a fleet of servers is one scrape target.

Every label is bounded: a route is a template of the app (a path that matched none is
`(unmatched)`), a method one of the few HTTP has (others are `OTHER`), a code a number.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.api.pinger import SERVER_SEND

# upper bounds (seconds) of the latency histogram's buckets, Prometheus' defaults
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "(unmatched)"
# the error ratio's window, kept as this many slots of ten seconds
WINDOW_S = 300
SLOT_S = 10


@dataclass
class Histogram:
    """Counts per bucket (not cumulative), their sum and count."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    sum_s: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS_S, seconds)] += 1
        self.sum_s += seconds

    def record(self) -> dict[str, Any]:
        cumulative, total = [], 0
        for n in self.counts[:-1]:
            total += n
            cumulative.append(total)
        return {
            "buckets_s": list(BUCKETS_S),
            "cumulative": cumulative,
            "count": sum(self.counts),
            "sum_s": round(self.sum_s, 6),
        }


@dataclass
class ApiStats:
    """One server's request counters (one event loop: no lock needed)."""

    requests: dict[tuple[str, str, int], int] = field(default_factory=dict)
    latency: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    in_flight: int = 0
    # (slot start, requests, 5xx) for the last WINDOW_S seconds
    window: deque[list[int]] = field(default_factory=deque)

    def started(self, method: str, route: str, seconds: float) -> None:
        """A response started: its time to headers."""
        histogram = self.latency.get((method, route))
        if histogram is None:  # not `setdefault`: that makes a Histogram on every call
            histogram = self.latency[(method, route)] = Histogram()
        histogram.observe(seconds)

    def finished(self, method: str, route: str, status: int, now: float | None = None) -> None:
        """A request ended (its response sent, or failed)."""
        key = (method, route, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        slot = int((time.monotonic() if now is None else now) // SLOT_S * SLOT_S)
        if not self.window or self.window[-1][0] != slot:
            self.window.append([slot, 0, 0])
        self.window[-1][1] += 1
        self.window[-1][2] += int(status >= 500)

    def error_ratio(self, now: float | None = None) -> float:
        """The share of requests answered 5xx in the last WINDOW_S seconds (0 when none)."""
        horizon = (time.monotonic() if now is None else now) - WINDOW_S
        while self.window and self.window[0][0] + SLOT_S <= horizon:
            self.window.popleft()
        total = sum(s[1] for s in self.window)
        return round(sum(s[2] for s in self.window) / total, 4) if total else 0.0

    def record(self, streams_open: int) -> dict[str, Any]:
        """What the worker row's `info` carries of this server's requests."""
        return {
            "requests_in_flight": self.in_flight,
            "streams_open": streams_open,
            "server_error_ratio": self.error_ratio(),
            "requests": [
                {"method": m, "route": r, "code": c, "count": n}
                for (m, r, c), n in sorted(self.requests.items())
            ],
            "latency": [
                {"method": m, "route": r, **h.record()} for (m, r), h in sorted(self.latency.items())
            ],
        }


def route_of(scope: Scope) -> str:
    """The template of the route a request matched (bounded), or `(unmatched)`."""
    route = scope.get("route")
    path = getattr(route, "path", None) if route is not None else None
    return str(path)[:200] if path else UNMATCHED


class Metered:
    """The middleware that feeds `ApiStats` (HTTP only; lifespan passes through)."""

    def __init__(self, app: ASGIApp, stats: ApiStats) -> None:
        self.app, self.stats = app, stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began, stats = time.perf_counter(), self.stats
        scope[SERVER_SEND] = send  # the server's own, for an event stream's heartbeats (`pinger`)
        method = scope["method"] if scope["method"] in METHODS else "OTHER"
        status = 500  # what the client gets when the app raises before answering

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                stats.started(method, route_of(scope), time.perf_counter() - began)
            await send(message)

        stats.in_flight += 1
        try:
            await self.app(scope, receive, sending)
        finally:
            stats.in_flight -= 1
            stats.finished(method, route_of(scope), status)
