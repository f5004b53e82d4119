"""The default offline agent: a reply derived from the prompt, streamed in parts, pluggable."""

from __future__ import annotations

import time

import pytest

from backend.core.errors import UsageError
from backend.execution.agent import OfflineResponder, StepRequest, agent_delay_ms, key_terms, load_agent


def test_the_reply_is_derived_from_the_prompt_and_deterministic() -> None:
    agent = OfflineResponder(delay_ms=0)
    ask = StepRequest("s1", ["Why did the Postgres primary fail twice? Postgres restarts were slow."])
    parts = agent.compose(ask)
    assert parts == agent.compose(ask) and len(parts) >= 5
    reply = "".join(parts)
    assert 'You asked: "Why did the Postgres primary fail twice?"' in reply
    assert "postgres, mentioned 2 times" in reply and "11 words in 2 sentences" in reply
    other = "".join(agent.compose(StepRequest("s1", ["Deploy the canary to Frankfurt."])))
    assert other != reply and "canary" in other and "You said" in other
    steered = "".join(agent.compose(StepRequest("s1", ["first thing", "and a second"], step=2)))
    assert steered.startswith("Taking your 2 messages together.")
    resumed = "".join(agent.compose(StepRequest("s1", ["again"], resumed_from="exe_1")))
    assert resumed.startswith("(Resuming after execution exe_1 was interrupted.)")


def test_key_terms_skip_stopwords_and_rank_by_frequency() -> None:
    assert key_terms("the ledger and the ledger export for the export team ledger") == [
        "ledger",
        "export",
        "team",
    ]


async def test_parts_are_streamed_with_the_configured_pause() -> None:
    agent = OfflineResponder(delay_ms=40)
    request = StepRequest("s1", ["Is the refund queue growing?"])
    start = time.monotonic()
    arrivals = []
    async for part in agent.stream(request):
        arrivals.append((time.monotonic() - start, part))
    assert [p for _, p in arrivals] == agent.compose(request)
    assert arrivals[0][0] < 0.03 and arrivals[-1][0] >= 0.04 * (len(arrivals) - 1)


def test_the_delay_and_the_agent_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert agent_delay_ms() == 250
    monkeypatch.setenv("REM_AGENT_DELAY_MS", "0")
    assert load_agent().delay_ms == 0  # type: ignore[attr-defined]
    monkeypatch.setenv("REM_AGENT_DELAY_MS", "-5")
    with pytest.raises(UsageError, match="REM_AGENT_DELAY_MS='-5' is not a whole number of ms, at least 0"):
        agent_delay_ms()
    monkeypatch.setenv("REM_AGENT_DELAY_MS", "0")
    monkeypatch.setenv("REM_AGENT", "backend.execution.agent:OfflineResponder")
    assert isinstance(load_agent(), OfflineResponder)
    monkeypatch.setenv("REM_AGENT", "no.such.module:make")
    with pytest.raises(UsageError, match="cannot be loaded"):
        load_agent()


def test_a_default_reply_takes_about_a_second() -> None:
    agent = OfflineResponder()
    parts = agent.compose(StepRequest("s1", ["How long does a reply take?"]))
    assert 0.8 <= agent.delay_ms * (len(parts) - 1) / 1000 <= 1.5
