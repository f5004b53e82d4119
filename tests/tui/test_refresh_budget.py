"""The refresh budget (`tui/refresh.py`): when the next refresh may start, on injected clocks.

The scheduler is driven here without an app: `load` records each start, the
timer is a list of (delay, callback) the test fires by hand, and the wall
clock and the process's CPU clock are numbers the test moves. What the
console does with it over a real store is in test_console.py and
test_console_window.py; what it costs under load, in benchmarks/console_load.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tui.refresh import CREDIT_S, MAX_INTERVAL_S, RefreshScheduler


class Clocks:
    """A wall clock and a CPU clock the test moves, and the timers the scheduler set."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 0.0
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.starts: list[tuple[float, bool]] = []  # (wall time, forced)

    def scheduler(
        self, share: float | None = 0.1, min_interval_s: float = 0.04, first_free: bool = False
    ) -> RefreshScheduler:
        return RefreshScheduler(
            lambda force: self.starts.append((self.wall, force)),
            lambda delay, callback: self.timers.append((delay, callback)),
            min_interval_s=min_interval_s,
            health_s=10.0,
            cpu_share=share,
            cpu_clock=lambda: self.cpu,
            clock=lambda: self.wall,
            first_free=first_free,
        )

    def spend(self, cpu_s: float, wall_s: float) -> None:
        """The console used `cpu_s` of CPU over `wall_s` of wall time."""
        self.cpu += cpu_s
        self.wall += wall_s

    def fire(self) -> float:
        """Let the one pending timer fire at its time; returns its delay."""
        (delay, callback) = self.timers.pop()
        self.wall += delay
        callback()
        return delay


def cycle(clocks: Clocks, refresher: RefreshScheduler, cpu_s: float) -> None:
    """A refresh that cost `cpu_s` (read, shown, painted) ends, and a commit is already waiting."""
    refresher.request()  # a commit heard while it ran
    clocks.spend(cpu_s, cpu_s)
    refresher.finished()


def test_a_quiet_fleets_commit_is_read_at_once() -> None:
    clocks = Clocks()
    refresher = clocks.scheduler()
    refresher.request()
    clocks.spend(0.005, 0.005)
    refresher.finished()
    clocks.spend(0.002, 5.0)  # five quiet seconds: a tick or two
    refresher.request()
    assert [t for t, _ in clocks.starts] == [100.0, 105.005] and not clocks.timers
    assert not refresher.throttled and not refresher.describe().endswith("budget")  # nothing waited


def test_a_refresh_that_costs_more_makes_the_next_one_wait_longer() -> None:
    waits = []
    for cost in (0.01, 0.02, 0.04):
        clocks = Clocks()
        refresher = clocks.scheduler(share=0.1)
        refresher.request()
        cycle(clocks, refresher, cost)
        waits.append(clocks.fire() + cost)  # from the start of one refresh to the next
    # the gap is what the CPU spent over the share: 10x the cost at 10 %
    assert waits == pytest.approx([0.1, 0.2, 0.4])


def test_under_sustained_commits_the_console_stays_within_its_share() -> None:
    clocks = Clocks()
    refresher = clocks.scheduler(share=0.08)
    refresher.request()
    started_cpu, started_wall = clocks.cpu, clocks.wall
    for _ in range(200):  # every refresh costs 15 ms; commits never stop
        cycle(clocks, refresher, 0.015)
        if clocks.timers:
            clocks.fire()
    share = (clocks.cpu - started_cpu) / (clocks.wall - started_wall)
    assert share == pytest.approx(0.08, rel=1e-6)
    assert len(clocks.starts) == 201  # every cycle ran: coalesced, never dropped
    assert refresher.describe().endswith("budget")  # the header says the budget throttles


def test_waiting_costs_are_in_the_budget_too() -> None:
    clocks = Clocks()
    refresher = clocks.scheduler(share=0.1)
    refresher.request()
    # each wait costs 2 % of a core (ticks, the watch): the waits lengthen to keep 10 % in all
    for _ in range(100):
        cycle(clocks, refresher, 0.01)
        delay, callback = clocks.timers.pop()
        clocks.spend(0.02 * delay, delay)
        callback()
    start_cpu, start_wall = clocks.cpu, clocks.wall
    for _ in range(100):
        cycle(clocks, refresher, 0.01)
        delay, callback = clocks.timers.pop()
        clocks.spend(0.02 * delay, delay)
        callback()
    assert (clocks.cpu - start_cpu) / (clocks.wall - start_wall) <= 0.1 + 1e-3


def test_requests_during_a_refresh_are_one_refresh_after_it() -> None:
    clocks = Clocks()
    refresher = clocks.scheduler(share=None)
    refresher.request()
    for _ in range(50):  # fifty commits heard while the first refresh runs
        refresher.request()
    clocks.spend(0.001, 0.1)
    refresher.finished()
    assert len(clocks.starts) == 2 and not clocks.timers


def test_the_budget_never_holds_a_refresh_back_past_its_longest_wait() -> None:
    clocks = Clocks()
    refresher = clocks.scheduler(share=0.01)
    refresher.request()
    cycle(clocks, refresher, 1.0)  # a huge refresh: 100 s of waiting by the share alone
    assert clocks.fire() == pytest.approx(MAX_INTERVAL_S - 1.0)
    assert len(clocks.starts) == 2


def test_the_operators_own_asking_waits_for_no_budget() -> None:
    clocks = Clocks()
    refresher = clocks.scheduler(share=0.05)
    refresher.request()
    cycle(clocks, refresher, 0.05)  # the budget asks the next refresh to wait ~1 s
    assert clocks.timers[-1][0] > 0.9
    refresher.request(force=True, urgent=True)  # a key: rows scrolled into view, ctrl+r
    assert len(clocks.starts) == 2 and clocks.starts[-1] == (clocks.wall, True)  # at once, forced
    clocks.spend(0.001, 0.01)
    refresher.finished()
    clocks.fire()  # the budget's timer, set before: its refresh already ran
    assert len(clocks.starts) == 2 and refresher.idle


def test_idle_says_whether_a_refresh_is_still_to_come() -> None:
    clocks = Clocks()
    refresher = clocks.scheduler(share=0.1)
    refresher.request()
    assert not refresher.idle  # running
    cycle(clocks, refresher, 0.02)
    assert not refresher.running and not refresher.idle  # waiting for the budget
    clocks.fire()
    clocks.spend(0.001, 0.01)
    refresher.finished()
    assert refresher.idle


def test_the_refresh_timings_are_kept_in_memory_allocated_once() -> None:
    from tui.probes import Ring

    ring = Ring(4)
    allocated = ring._values.buffer_info()
    for value in range(10):
        ring.append(float(value))
    assert list(ring) == [6.0, 7.0, 8.0, 9.0] and len(ring) == 4
    assert ring[-1] == 9.0 and ring[0] == 6.0
    assert ring._values.buffer_info() == allocated  # no growth, no new buffer: a week open costs the same


def test_a_commit_after_a_quiet_stretch_is_read_at_once_though_the_ticks_spent_the_share() -> None:
    """What the console spends between refreshes (its ticks, the watch) is no refresh's cost: a
    commit heard long enough after the last refresh ended is on screen at once."""
    clocks = Clocks()
    refresher = clocks.scheduler(share=0.1)
    refresher.request()
    clocks.spend(0.02, 0.02)
    refresher.finished()
    clocks.spend(0.12, 1.0)  # a second of ticks at 12 % of a core: over the share by themselves
    refresher.request()
    assert len(clocks.starts) == 2 and not clocks.timers
    clocks.spend(0.02, 0.02)
    refresher.finished()
    clocks.spend(0.0, 0.1)  # not quiet yet (twice its cost over the share is 0.4 s): the budget decides
    refresher.request()
    assert len(clocks.starts) == 2 and clocks.timers


def test_the_interval_shown_stays_put_while_the_budget_holds_a_steady_pace() -> None:
    """Refreshes whose cost jitters (14-16 ms) keep the header's text as it is (a changed header is a
    line repainted on every refresh); a pace that really changes (the cost doubles) shows."""
    clocks = Clocks()
    refresher = clocks.scheduler(share=0.08)
    refresher.request()
    shown = []
    for n in range(80):
        cycle(clocks, refresher, 0.014 if n % 2 else 0.016)
        clocks.fire()
        shown.append(refresher.describe())
    assert len(set(shown[20:])) == 1, set(shown[20:])  # settled: one text for sixty refreshes
    assert shown[-1] == "↻200ms budget"  # 15 ms over 8 % of a core: 190 ms, the nearest step
    for _ in range(40):
        cycle(clocks, refresher, 0.03)
        clocks.fire()
    assert refresher.describe() == "↻400ms budget"  # 30 ms over 8 %: 375 ms


def test_the_interval_shown_is_the_floor_when_nothing_throttles() -> None:
    clocks = Clocks()
    refresher = clocks.scheduler(share=None, min_interval_s=0.04)
    refresher.request()
    cycle(clocks, refresher, 0.01)
    assert refresher.describe() == "↻40ms"


def steady(clocks: Clocks, refresher: RefreshScheduler, costs: list[float], every_s: float) -> None:
    """A commit every `every_s`, each read by a refresh that cost what `costs` says (in turn)."""
    for cost in costs:
        clocks.spend(cost, cost)
        refresher.finished()
        clocks.spend(0.0, every_s - cost)
        refresher.request()


def test_what_cheap_refreshes_leave_of_the_share_pays_for_a_dear_one() -> None:
    """Ten commits a second, 8 ms a refresh under 9 %: one refresh that cost 18 ms (a collection, a
    tick) holds back none of the commits behind it; without the credit saved before it, it does."""
    clocks = Clocks()
    refresher = clocks.scheduler(share=0.09)
    refresher.request()
    steady(clocks, refresher, [0.008] * 20 + [0.018] + [0.008] * 10, 0.1)
    assert len(clocks.starts) == 32 and not clocks.timers  # every commit's refresh started when asked
    clocks = Clocks()
    refresher = clocks.scheduler(share=0.09)
    refresher.request()
    steady(clocks, refresher, [0.018], 0.1)  # the same dear refresh, nothing saved before it
    assert len(clocks.starts) == 1 and clocks.timers


def test_the_credit_is_bounded_and_spent_at_once_under_sustained_commits() -> None:
    """After a quiet minute a stream of commits gets at most `CREDIT_S` of the share on top of it."""
    clocks = Clocks()
    refresher = clocks.scheduler(share=0.1, min_interval_s=0.04)
    refresher.request()
    clocks.spend(0.01, 0.01)
    refresher.finished()
    clocks.spend(0.0, 60.0)  # a quiet minute: far more share unspent than the credit keeps
    start_cpu, start_wall = clocks.cpu, clocks.wall
    refresher.request()
    gaps = []
    for _ in range(40):  # each refresh 10 ms; commits never stop
        cycle(clocks, refresher, 0.01)
        gaps.append(clocks.fire() + 0.01)
    assert gaps[:3] == pytest.approx([0.04] * 3)  # the credit spent: refreshes at the floor
    assert gaps[-10:] == pytest.approx([0.1] * 10)  # then the share's own pace
    spent, wall = clocks.cpu - start_cpu, clocks.wall - start_wall
    assert spent <= 0.1 * wall + 0.1 * CREDIT_S + 1e-9


def test_a_refresh_that_read_nothing_holds_no_refresh_back() -> None:
    """The slow poll found the gate shut just before a commit's news: the commit's refresh starts
    at once, not `min_interval_s` after the poll's (as it would had the poll read a snapshot)."""
    for read in (False, True):
        clocks = Clocks()
        refresher = clocks.scheduler(share=0.1, min_interval_s=0.04)
        refresher.request()
        clocks.spend(0.005, 0.005)
        refresher.finished()
        clocks.spend(0.0, 1.0)
        refresher.request()  # the poll
        clocks.spend(0.0003, 0.001)
        refresher.finished(read=read)
        refresher.request()  # the commit's news
        assert (len(clocks.starts), bool(clocks.timers)) == ((3, False) if not read else (2, True))


def test_the_first_snapshot_is_the_consoles_start_not_a_refresh() -> None:
    """The first cycle (every row read, every widget built) holds no commit back; the same cost
    in a later cycle does."""
    clocks = Clocks()
    refresher = clocks.scheduler(share=0.1, first_free=True)
    for n in (2, 2):
        refresher.request()
        clocks.spend(0.1, 0.15)
        refresher.finished()
        clocks.spend(0.0, 0.05)
        refresher.request()  # a commit, 50 ms after
        assert len(clocks.starts) == n
    assert clocks.timers  # the second time it waits: 0.1 s of CPU over 10 % of a core
