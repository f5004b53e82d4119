"""Live refresh for the console: when to read the next snapshot, within a CPU budget.

`RefreshScheduler` decides when a snapshot is read: the watch on state.db and
its WAL (`backend.store.watch`, shared with the daemons) or PostgreSQL's
change feed heard a commit, the slow poll fired, or an action asked. A
refresh is one cycle: the read, then showing it (or holding it: paused, a
modal, the past). Cycles never overlap: a request during one is remembered
and served after it, so any number of commits in between cost one refresh.

The budget: the console may use `cpu_share` of one core (9 %; the fleet it
watches needs the rest, most of all during an incident). A cycle ends once
the screen shows what it read, so its cost is all of it: the read (on every
thread), the show, the screen update. The next refresh starts when the
process's CPU time since the last one started (that cycle, the countdowns'
ticks, keys), net of what the console spends between refreshes anyway
(`idle_share`, measured from each cycle's end to the next start), fits in
that share of the time since: a refresh that cost more makes the next one
wait longer. What a cycle leaves unspent of its share is kept as credit, up to
`CREDIT_S` of the share (27 ms of CPU): a refresh after a dearer one, a
collection, a tick, starts at once on it instead of holding back the commits
behind it, each a little later than the last (a steady 10 commits a second at
~8 ms a refresh fits the share, but one 10 ms spike held the next four back
20-80 ms each); over any second the console stays within the share plus that
credit, and under sustained commits it is spent at once. The first snapshot is
the console's start, not a refresh: what it cost holds no commit back. A quiet fleet's commit, asked for well after the last refresh
ended (`QUIET_S`), is read at once. Two bounds: refreshes are at least `min_interval_s` apart
(at most 25 a second) and never held back more than `max_interval_s`, like
k9s's and pg_activity's 2 s clock. The operator's own asking (a key, the
rows scrolled into view, an action's result) waits for no budget. The
header shows the interval in use, and when the budget is what holds
refreshes back (`describe`). Every `health_s` one refresh is forced past the
`data_version` gate: Chroma health and heartbeat ages change without a
commit.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from enum import StrEnum

from backend.ops.records import Status

# panels with live (time-derived) cells, redrawn by the 1 s tick
TICK_ORDER = ("leases", "workers", "backlog", "receipts", "drift")
# the share of one core the console may use (the target is 10 %: the rest is headroom, for keys)
CPU_SHARE = 0.09
# the longest a refresh is held back by the budget (k9s and pg_activity refresh every 2 s)
MAX_INTERVAL_S = 2.0
# the share the console may save while refreshes cost less than it, in seconds of the share (at 9 %:
# 27 ms of CPU, three or four refreshes): spent on the next refreshes after a dear one (module doc)
CREDIT_S = 0.3
# how fast the interval shown follows the one in use (a weight per refresh)
SHOWN_WEIGHT = 0.3
# a refresh asked for at least this long after the last one ended, and twice what that one cost
# over the share, starts at once whatever the budget says: a quiet fleet's commit is on screen in
# milliseconds (what the console spends between refreshes, its ticks and the watch, is not a
# refresh's cost), and such refreshes take at most half the share; the budget paces a stream
QUIET_S = 0.3
# the header says "throttled" while the budget held a refresh back within this long
THROTTLED_FOR_S = 3.0
# the intervals the header shows: 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 in each decade (~25 % apart), from
# 1 ms to 8 s; the one shown moves once the interval in use is more than `SHOWN_SLACK` from it, not
# with every refresh's jitter (a header that changes is a line repainted on every refresh)
SHOWN_STEPS_S = tuple(m * 10.0**e for e in range(-3, 1) for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8))
SHOWN_SLACK = 1.15


class WorkerGroup(StrEnum):
    """The console's worker groups: the one `Worker.StateChanged` handler tells them apart."""

    SNAPSHOT = "snapshot"  # data_version gate + ops.status
    WATCH = "watch"  # the watch on state.db and its WAL
    ACTION = "action"  # a confirmed replay, drain or release
    DRY_RUN = "dry-run"  # the replay dry run shown in the confirmation
    DETAIL_HISTORY = "detail-history"  # a detail screen's journal rows
    DETAIL_TOOLS = "detail-tools"  # a detail screen's tool calls of its session
    DETAIL_DIFF = "detail-diff"  # a detail screen's live receipt diff
    TIMELINE = "timeline"  # a recorded moment read from the status history
    EXPORT = "export"  # the rows a CSV export reads


class RefreshScheduler:
    """Starts refresh cycles through `load(force)`, one at a time, within the CPU budget (module doc)."""

    def __init__(
        self,
        load: Callable[[bool], object],
        set_timer: Callable[[float, Callable[[], None]], object],
        *,
        min_interval_s: float,
        health_s: float,
        cpu_share: float | None = CPU_SHARE,
        max_interval_s: float = MAX_INTERVAL_S,
        cpu_clock: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
        first_free: bool = True,
    ) -> None:
        self._load = load
        self._set_timer = set_timer
        self.min_interval_s = min_interval_s
        self.max_interval_s = max(max_interval_s, min_interval_s)
        self.health_s = health_s
        self.cpu_share = cpu_share  # None: no budget (only `min_interval_s`)
        self.first_free = first_free  # the first cycle (the console's start) costs the budget nothing
        self._cpu, self._clock = cpu_clock, clock
        self.running = False
        self._wanted = self._force_next = self._urgent_next = self._timer_pending = False
        self._last_start = self._last_forced = -1e9
        self._cpu_at_start = 0.0
        self._due = 0.0  # when the pending timer fires
        # timers set and not fired yet, and how many of them a start since made pointless
        self._timers_out = self._timers_stale = 0
        # the share of a core the console spends between refreshes (the 1 s ticks, keys, the
        # watch): it costs too, so it is in the budget; measured from each cycle's end to the next
        # start, smoothed
        self.idle_share = 0.0
        self._ended = (self._clock(), self._cpu())  # (clock, CPU) when the last cycle ended
        self._last_cycle_cpu = 0.0  # what it cost
        self._credit = 0.0  # CPU seconds of the share left unspent, at most `CREDIT_S` of it
        self._before = (self._last_start, self._cpu_at_start, self._credit)  # the budget before a start
        self.started = asyncio.Event()  # set when a refresh starts (the change watchers wait on it)
        self._throttled_at = -1e9
        self.cycles = 0
        # the gap between refreshes the budget asks for now (smoothed, for the header), and the step
        # of `SHOWN_STEPS_S` the header shows for it
        self.interval_s = min_interval_s
        self._shown_s: float | None = None

    def request(self, force: bool = False, urgent: bool = False) -> None:
        """Start a refresh now, or once the running one ended and the budget allows (never two at
        once); `urgent` (the operator asked: a key, an action's result) skips the budget."""
        self._force_next |= force
        self._urgent_next |= urgent
        if self.running:
            self._wanted = True
            return
        wait = self.wait_s(self._urgent_next)
        if wait > 0:
            due = self._clock() + wait
            if not self._timer_pending or due < self._due - 0.001:  # none yet, or an urgent one sooner
                self._timer_pending, self._due = True, due
                self._timers_out += 1
                self._set_timer(wait, self._timer_fired)
            return
        self._start()

    @property
    def idle(self) -> bool:
        """No refresh running, and none asked for (waiting for the running one, or for the budget)."""
        return not (self.running or self._timer_pending or self._wanted)

    def poll(self) -> None:
        """The slow fallback poll: a refresh, forced once every `health_s`."""
        self.request(force=self._clock() - self._last_forced >= self.health_s)

    def finished(self, read: bool = True) -> None:
        """The running cycle ended (shown, held, skipped at the gate, or failed): serve what waited.
        One that read nothing (the gate was shut: the slow poll, or a look just before a commit's
        news) is as if it had not started, for the budget: the commit's own refresh is not held
        `min_interval_s` behind it (its CPU, ~0.3 ms, is the next cycle's to pay)."""
        if not self.running:
            return
        self.running = False
        if not read:
            self._last_start, self._cpu_at_start, self._credit = self._before
        elif self.cycles == 1 and self.first_free:  # the first snapshot is the console's start
            # (every row read, every widget built: ~0.1 s of CPU), not a refresh: the commits
            # after it are not held back ~1 s
            self._last_start, self._cpu_at_start = self._clock(), self._cpu()
        self._ended = (self._clock(), self._cpu())
        self._last_cycle_cpu = max(0.0, self._ended[1] - self._cpu_at_start)
        if self._wanted or self._force_next or self._urgent_next:
            self._wanted = False
            self.request()

    def gap_s(self, credit: bool = True) -> float:
        """The least time between the last refresh's start and the next one's, as the budget has it
        now: the CPU spent since that start, and what waiting on costs (`idle_share`), fit in
        `cpu_share` of the time and the credit saved (without it: the pace the share keeps up)."""
        gap = self.min_interval_s
        if self.cpu_share:
            elapsed = self._clock() - self._last_start
            spent = max(0.0, self._cpu() - self._cpu_at_start) - (self._credit if credit else 0.0)
            idle = min(self._between_share(), 0.75 * self.cpu_share)  # bounded: a wait must end
            gap = max(gap, (spent - idle * elapsed) / (self.cpu_share - idle))
        return min(gap, self.max_interval_s)

    def _save_credit(self, now: float) -> None:
        """At a start: what the share allowed since the last start and was not spent, kept as credit
        (at most `CREDIT_S` of the share; spending past it is no debt: the gap already paid it)."""
        if self.cpu_share:
            earned = self.cpu_share * (now - self._last_start) - (self._cpu() - self._cpu_at_start)
            self._credit = min(self.cpu_share * CREDIT_S, max(0.0, self._credit + earned))

    def _between_share(self) -> float:
        """What the console spends between refreshes: the smoothed share, or the share since the
        last cycle ended when that is higher and long enough to tell (a quiet stretch's ticks are
        no refresh's cost: its commit is read at once)."""
        since, cpu = self._ended
        waited = self._clock() - since
        if self.running or waited < 0.5:
            return self.idle_share
        return max(self.idle_share, (self._cpu() - cpu) / waited)

    def _quiet_after_s(self) -> float:
        """How long after the last cycle ended a refresh counts as a quiet fleet's (see QUIET_S)."""
        if not self.cpu_share:
            return QUIET_S
        return max(QUIET_S, 2 * self._last_cycle_cpu / self.cpu_share)

    def wait_s(self, urgent: bool = False) -> float:
        """How long a refresh asked for now waits (0: it starts now)."""
        quiet = not self.running and self._clock() - self._ended[0] >= self._quiet_after_s()
        gap = self.min_interval_s if urgent or quiet else self.gap_s()
        wait = self._last_start + gap - self._clock()
        if wait > 0 and gap > self.min_interval_s:
            self._throttled_at = self._clock()
        return wait

    @property
    def throttled(self) -> bool:
        """Whether the budget (not the floor of `min_interval_s`) held a refresh back lately."""
        return self._clock() - self._throttled_at < THROTTLED_FOR_S

    def describe(self) -> str:
        """The interval in use, for the header: `↻40ms`, or `↻600ms budget` while the budget throttles
        (to the nearest of `SHOWN_STEPS_S`, moved only once the interval moved past `SHOWN_SLACK`)."""
        interval, shown = max(self.interval_s, SHOWN_STEPS_S[0]), self._shown_s
        if shown is None or not shown / SHOWN_SLACK <= interval <= shown * SHOWN_SLACK:
            shown = self._shown_s = min(SHOWN_STEPS_S, key=lambda step: abs(math.log(step / interval)))
        text = f"{shown * 1000:.0f}ms" if shown < 1 else f"{shown:.1f}s"
        return f"↻{text} budget" if self.throttled else f"↻{text}"

    def _timer_fired(self) -> None:
        self._timers_out -= 1
        if self._timers_stale:  # a refresh started since it was set (an urgent one, sooner)
            self._timers_stale -= 1
            return
        self._timer_pending = False
        if self.running:
            self._wanted = True
            return
        # not asked again: the CPU spent while it waited (a tick, a key) is the next cycle's to
        # pay, and asking again here would spend CPU to wait (a timer a few ms at a time)
        self._start()

    def _start(self) -> None:
        force, self._force_next, self._urgent_next = self._force_next, False, False
        self._timers_stale, self._timer_pending = self._timers_out, False
        now = self._clock()
        since, cpu = self._ended
        if self.cycles and now - since > 0.01:  # what the time between refreshes cost a second
            self.idle_share += SHOWN_WEIGHT * ((self._cpu() - cpu) / (now - since) - self.idle_share)
        if self.cycles:  # what the last cycle (and the ticks since) asked of the budget
            self.interval_s += SHOWN_WEIGHT * (self.gap_s(credit=False) - self.interval_s)
            self._save_credit(now)
        self.running, self._wanted = True, False
        self._before = (self._last_start, self._cpu_at_start, self._credit)
        self._last_start, self._cpu_at_start = now, self._cpu()
        self.cycles += 1
        self.started.set()
        if force:
            self._last_forced = now
        self._load(force)


class Ticker:
    """Re-renders countdowns and ages without touching the database.

    Every panel's live cells are redrawn once a second, all in one callback:
    only the rows on screen whose text changed are redrawn, so the screen
    is updated once a second, not once per panel. While snapshots are shown
    more often than that (each one draws the live cells of a new second,
    `SnapshotTable.show`), the tick has nothing to add and does nothing: a
    screen update of its own a second was ~2 ms, and ~1.5 ms of ticks.
    """

    every_s = 1.0
    # a tick this soon after a snapshot was shown does nothing: that one drew this second's countdowns
    fresh_s = 0.5

    def __init__(self, tick_panel: Callable[[str], None], shown_within: Callable[[float], bool]) -> None:
        self._tick_panel = tick_panel
        self._shown_within = shown_within  # whether a live snapshot was shown within so many seconds
        self.skipped = 0  # ticks a snapshot shown lately made unneeded, ever: for tests

    def all(self) -> None:
        """Every panel's tick at once (call every `every_s`), unless a snapshot was shown within
        `fresh_s`."""
        if self._shown_within(self.fresh_s):
            self.skipped += 1
            return
        for name in TICK_ORDER:
            self._tick_panel(name)


def new_events(latest: Status | None, applied: Status | None) -> str:
    """How many journal events arrived since the snapshot shown (`100+` past the tail)."""
    if latest is None or applied is None or latest is applied:
        return "0 new events"
    shown = max((e["id"] for e in applied["events"]), default=0)
    new = [e["id"] for e in latest["events"]]
    count = sum(1 for i in new if i > shown)
    more = "+" if new and count == len(new) and min(new) > shown + 1 else ""
    return f"{count}{more} new events"
