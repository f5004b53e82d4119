"""Synthetic load for the demo, drills and soaks: a steady stream of inputs.

Sessions are named after what they are about (`demo-billing-1`); the inputs
are varied sentences with named systems and people in them, so summaries and
the Dream graph have real content to work with. Deterministic given `seed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass

from backend import ops
from backend.core.errors import RemError
from backend.execution.sessions import Delivery
from backend.runtime.context import Context

log = logging.getLogger("rem.load")

TOPICS = {
    "billing": ("Stripe webhooks", "the Invoice Service", "Maria Lopez", "the nightly ledger export"),
    "search": ("the Elastic cluster", "Query Planner", "Ken Tanaka", "the synonym dictionary"),
    "deploys": ("the Canary Pipeline", "Argo Rollouts", "Priya Shah", "the Frankfurt region"),
    "onboarding": ("the Welcome Flow", "Segment events", "Tom Berger", "the trial conversion report"),
    "payments": ("the Payment Gateway", "Adyen retries", "Lena Fischer", "the refund queue"),
    "infra": ("the Postgres primary", "PgBouncer", "Omar Haddad", "the disk pressure alert"),
}
ASKS = (
    "Why did {a} fail after the last change to {b}?",
    "Summarise what {c} said about {d} yesterday.",
    "Draft a runbook step for when {a} stalls during {d}.",
    "Compare {b} with {a} for the incident review.",
    "What should {c} check first if {d} is late again?",
    "List the risks of moving {a} behind {b}.",
    "Explain the timeline: {d} slowed down, then {a} timed out.",
    "Who owns {b}, and does {c} need to approve the fix?",
)
# what the offline agent answers with a tool call (a note: `notes_add`, idempotent; a send or a
# payment: `outbox_send`, an effect that waits for approval); asked when the agent has tools
TOOL_ASKS = (
    "Note that {a} was the cause of the {d} delay.",
    "Make a note for {c}: check {b} before the next release.",
    "Send {c} an email that {a} is fixed.",
    "Send a message to {c} about {d}.",
)
STEERS = (
    "Actually, focus on {a} only.",
    "Keep it short, {c} is waiting.",
    "Also mention {d}.",
)


@dataclass
class LoadGenerator:
    """Sends inputs to a fixed set of sessions at a steady rate (inputs per second)."""

    ctx: Context
    sessions: int = 6
    rate: float = 1.0
    steer_ratio: float = 0.2
    seed: int | None = None
    # the share of inputs that ask for a tool (a note or a send); 0: none, and the inputs drawn
    # are the same as before tools existed for a given seed
    tool_ratio: float = 0.0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        names = sorted(TOPICS)
        self.session_ids = [
            f"demo-{names[i % len(names)]}-{i // len(names) + 1}" for i in range(self.sessions)
        ]
        self.sent = 0

    def next_input(self) -> tuple[str, str, Delivery]:
        """(session id, text, delivery) of the next input."""
        sid = self.rng.choice(self.session_ids)
        a, b, c, d = TOPICS[sid.split("-")[1]]
        steer = self.rng.random() < self.steer_ratio
        tool = not steer and self.tool_ratio > 0 and self.rng.random() < self.tool_ratio
        template = self.rng.choice(STEERS if steer else TOOL_ASKS if tool else ASKS)
        return sid, template.format(a=a, b=b, c=c, d=d), Delivery.STEER if steer else Delivery.QUEUE

    async def send_one(self) -> None:
        sid, text, delivery = self.next_input()
        await ops.send(self.ctx, sid, text, delivery=delivery)
        self.sent += 1

    async def run(self, stop: asyncio.Event) -> None:
        """Send until `stop` is set; errors are logged and retried, never fatal."""
        interval = 1.0 / self.rate if self.rate > 0 else 1.0
        while not stop.is_set():
            try:
                await self.send_one()
            except RemError as exc:
                log.warning("load: %s", exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.uniform(0.5, 1.5) * interval)
