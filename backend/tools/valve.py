"""How much of what a tool server says reaches rem's log: a rate limit per server, and a count of the rest.

A tool server's log notifications (`notifications/message`), its stderr
lines and the stdout lines rem cannot read are each one line in rem's log.
A server that writes them as fast as it can (20 000 notifications: 22 MB of
rem's log in 2 s) must not fill the disk or bury everything else, so each
server session has one `LogValve`: a token bucket that lets `RATE` lines a
second through, in bursts of up to `BURST` (a start's chatter, a traceback);
the rest are dropped, not queued. Every drop is counted, and at most every
`REPORT_S` seconds one WARNING says how many of how many were dropped (so
the count of lines a server sent is never lost, only their text); the last
report comes when the session ends. What a server wrote last on stderr is
kept for its exit message whatever the valve says (`StdioState.stderr_tail`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger("rem.tools.server")

RATE = 20.0  # lines a second, per server session
BURST = 200
REPORT_S = 10.0


class LogValve:
    """Admits a server's log lines at `rate` a second (bursts of `burst`), counts and reports the rest."""

    def __init__(
        self,
        server: str,
        rate: float = RATE,
        burst: int = BURST,
        report_s: float = REPORT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server = server
        self.rate = rate
        self.burst = burst
        self.report_s = report_s
        self.clock = clock
        self.tokens = float(burst)
        self.refilled = self.since = clock()
        self.offered = 0  # since the last report
        self.dropped = 0  # since the last report
        self._timer: asyncio.TimerHandle | None = None

    def admit(self) -> bool:
        """Whether this line may go to the log (False: dropped, counted)."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.refilled) * self.rate)
        self.refilled = now
        self.offered += 1
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        self.dropped += 1
        if self._timer is None:
            self._timer = _later(self.report_s, self.report)
        return False

    def report(self) -> None:
        """Log how many lines were dropped since the last report (nothing when none were)."""
        self._timer = None
        now = self.clock()
        if self.dropped:
            log.warning(
                "tool server %s: dropped %d of %d lines it logged in the last %.1f s "
                "(rem logs at most %g a second of each server, in bursts of %d)",
                self.server,
                self.dropped,
                self.offered,
                now - self.since,
                self.rate,
                self.burst,
            )
        self.offered = self.dropped = 0
        self.since = now

    def close(self) -> None:
        """The session ended: report what is left now."""
        if self._timer is not None:
            self._timer.cancel()
        self.report()


def _later(delay_s: float, callback: Callable[[], None]) -> asyncio.TimerHandle | None:
    try:
        return asyncio.get_running_loop().call_later(delay_s, callback)
    except RuntimeError:  # no loop (a test's direct use): reported at close
        return None
