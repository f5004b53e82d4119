"""What a process holds, and when each of its leases needs renewing.

A daemon keeps its leases here (`backend.runtime.daemon`: `self.leases`);
its upkeep sleeps until the earliest renewal is due (a third into a lease,
`backend.store.fencing.Lease.renewal_due_at`) or its next heartbeat, so a
daemon that holds nothing never wakes to renew.
"""

from __future__ import annotations

import asyncio
from functools import partial

from backend.core import clock
from backend.store.db import Database
from backend.store.fencing import Lease, renew_sync
from backend.store.workers import LeaseKind


class LeaseKeeper:
    """The leases one process holds, renewed once a third of each is used (and never polled for when none is)."""

    def __init__(self) -> None:
        self._held: dict[tuple[LeaseKind, str], Lease] = {}
        # set when a lease is taken: the upkeep loop sleeping until the next renewal looks again
        self.changed = asyncio.Event()

    def hold(self, lease: Lease) -> None:
        self._held[(lease.kind, lease.key)] = lease
        self.changed.set()

    def drop(self, lease: Lease) -> None:
        if self._held.get((lease.kind, lease.key)) is lease:
            del self._held[(lease.kind, lease.key)]

    def held(self) -> list[Lease]:
        return list(self._held.values())

    def __len__(self) -> int:
        return len(self._held)

    def next_renewal_at(self) -> int | None:
        """When the next held lease needs renewing (None: nothing held)."""
        return min((lease.renewal_due_at() for lease in self._held.values() if not lease.lost), default=None)

    async def renew_due(self, db: Database) -> list[Lease]:
        """Renew the held leases a third used; returns (and marks) the lost ones.

        Each lease on its session's write connection (`write_in_thread`'s key): a renewal never
        holds one session's row while waiting for another's, so it cannot deadlock a turn's
        transaction committing on another connection. The renewals of one connection share
        its next group commit.
        """
        now = clock.now_ms()
        due = [lease for lease in self._held.values() if not lease.lost and lease.renewal_due(now)]
        if not due:
            return []
        lost = await asyncio.gather(
            *(
                db.write_in_thread(partial(renew_sync, leases=[lease], now=now), key=lease.session_id)
                for lease in due
            )
        )
        return [lease for each in lost for lease in each]
