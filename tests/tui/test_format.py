"""The console's text helpers: durations that fit their columns, ids cut where they differ."""

from __future__ import annotations

import pytest

from tui.format import age, fitted, owner_short, short_id, time_left


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (999, "0s"),
        (12_000, "12s"),
        (65_000, "1m05s"),
        (599_000, "9m59s"),
        (3_133_000, "52m"),
        (11_100_000, "3h05m"),
        (43_200_000, "12h"),
        (259_200_000, "3d00h"),
        (2_592_000_000, "30d"),
    ],
)
def test_durations_fit_five_characters(ms: int, text: str) -> None:
    assert fitted(ms) == text
    assert len(fitted(ms)) <= 5


def test_countdowns_round_up_and_expired_ones_are_negative() -> None:
    assert time_left(12_001) == "13s"
    assert time_left(1) == "1s"
    assert time_left(0) == "-0s"
    assert time_left(-12_500) == "-12s"
    assert time_left(-3_133_000) == "-52m"
    assert time_left(-65_000) == "-1m"  # four characters after the sign at most
    assert time_left(-11_100_000) == "-3h"


def test_age_of_unknown_time_is_a_dash() -> None:
    assert age(None, 5) == "-"
    assert age(1_000, 61_000) == "1m00s"
    assert age(5_000, 1_000) == "0s"  # clock skew never shows a negative age


def test_ids_are_cut_in_the_middle_and_owners_by_role_and_pid() -> None:
    assert short_id("ses_01HX2ZK3ABCDEF9Q", 10) == "…3ABCDEF9Q"
    assert short_id("demo-deploys-1") == "…deploys-1"
    assert short_id("s-alpha") == "s-alpha"
    assert owner_short("executor-ops-1-4102-d4e5f6") == "exec:4102"
    assert owner_short("executor-live") == "…tor-live"
