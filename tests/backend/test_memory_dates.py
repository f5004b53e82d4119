"""Relative time expressions resolved against the day they were said (backend.memory.dates)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from backend.memory import dates


def ms(day: str, hour: int = 13) -> int:
    """A Unix time in ms at `hour` UTC of an ISO day."""
    parsed = datetime.fromisoformat(day).replace(hour=hour, tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


CASES = [
    # (said on, text, first day, last day)
    ("2023-05-08", "I went to a support group yesterday", "2023-05-07", "2023-05-07"),
    ("2023-03-01", "we met yesterday", "2023-02-28", "2023-02-28"),  # across a month end
    ("2024-03-01", "we met yesterday", "2024-02-29", "2024-02-29"),  # a leap year
    ("2023-01-01", "I was there last night", "2022-12-31", "2022-12-31"),  # across a year end
    ("2022-12-31", "see you tomorrow", "2023-01-01", "2023-01-01"),
    ("2023-05-08", "the day before yesterday", "2023-05-06", "2023-05-06"),
    ("2023-05-08", "I start today", "2023-05-08", "2023-05-08"),
    ("2023-05-08", "we won last Saturday", "2023-05-06", "2023-05-06"),  # said on a Monday
    ("2023-05-06", "we won last Saturday", "2023-04-29", "2023-04-29"),  # said on a Saturday: a week back
    ("2023-05-02", "I joined last Tues... no, last Tuesday", "2023-04-25", "2023-04-25"),
    ("2023-01-03", "last Friday", "2022-12-30", "2022-12-30"),  # across a year end
    ("2023-05-08", "next Friday", "2023-05-12", "2023-05-12"),
    ("2023-05-12", "next Friday", "2023-05-19", "2023-05-19"),
    ("2023-05-10", "this Sunday", "2023-05-14", "2023-05-14"),
    ("2023-05-08", "two weeks ago", "2023-04-24", "2023-04-30"),  # the week that holds the day
    ("2023-05-08", "a couple of days ago", "2023-05-06", "2023-05-06"),
    ("2023-05-08", "3 days ago", "2023-05-05", "2023-05-05"),
    ("2023-05-08", "in two weeks", "2023-05-22", "2023-05-28"),
    ("2023-05-08", "last week", "2023-05-01", "2023-05-07"),
    ("2023-01-04", "last week", "2022-12-26", "2023-01-01"),  # a week across a year end
    ("2023-05-08", "next week", "2023-05-15", "2023-05-21"),
    ("2023-05-08", "last weekend", "2023-05-06", "2023-05-07"),
    ("2023-05-07", "last weekend", "2023-04-29", "2023-04-30"),  # said on a Sunday
    ("2023-05-08", "next month", "2023-06-01", "2023-06-30"),
    ("2023-12-15", "next month", "2024-01-01", "2024-01-31"),  # across a year end
    ("2023-01-15", "last month", "2022-12-01", "2022-12-31"),
    ("2023-03-31", "a month ago", "2023-02-01", "2023-02-28"),  # the calendar month, not 31 days
    ("2023-05-08", "last year", "2022-01-01", "2022-12-31"),
    ("2023-05-08", "four years ago", "2019-01-01", "2019-12-31"),
    ("2023-05-08", "on 1 May, 2022", "2022-05-01", "2022-05-01"),
    ("2023-05-08", "May 8th, 2021", "2021-05-08", "2021-05-08"),
    ("2023-05-08", "in July 2022", "2022-07-01", "2022-07-31"),
    ("2023-05-08", "in the beginning of November 2022", "2022-11-01", "2022-11-30"),
    ("2023-05-08", "in 2022", "2022-01-01", "2022-12-31"),
    ("2023-05-08", "my show is on June 5th", "2023-06-05", "2023-06-05"),  # the nearest June 5th
    ("2023-01-10", "back on 28 December", "2022-12-28", "2022-12-28"),  # across a year end
]


@pytest.mark.parametrize(("said", "text", "first", "last"), CASES)
def test_a_time_expression_resolves_to_the_days_it_names(said: str, text: str, first: str, last: str) -> None:
    [span] = dates.resolve(text, ms(said))
    assert (span.first, span.last) == (date.fromisoformat(first), date.fromisoformat(last))


@pytest.mark.parametrize(
    "text",
    [
        "You may want to check it out, the second one is better",
        "I went hiking on Saturday",  # a bare weekday: only the tense says which
        "recently I painted a lot",
        "on 31 February",  # no such day
        "the 2023 model",
        "",
    ],
)
def test_words_that_name_no_day_resolve_to_nothing(text: str) -> None:
    assert dates.resolve(text, ms("2023-05-08")) == []


def test_a_text_gives_each_of_its_expressions_once_in_order() -> None:
    spans = dates.resolve("Tomorrow, not yesterday; yesterday was 7 May 2023.", ms("2023-05-08"))
    assert [(s.phrase, s.first.isoformat()) for s in spans] == [
        ("Tomorrow", "2023-05-09"),
        ("yesterday", "2023-05-07"),
    ]  # "yesterday" and "7 May 2023" name the same day: one span


def test_the_time_is_the_utc_day_of_the_turn() -> None:
    [span] = dates.resolve("yesterday", ms("2023-05-08", hour=23))
    assert span.first == date(2023, 5, 7)


@pytest.mark.parametrize(
    ("first", "last", "words", "nodes"),
    [
        ("2023-05-07", "2023-05-07", "7 May 2023", ["date:2023-05-07"]),
        ("2023-05-06", "2023-05-07", "6 May 2023 to 7 May 2023", ["date:2023-05-06", "date:2023-05-07"]),
        ("2023-06-01", "2023-06-30", "June 2023", ["date:2023-06"]),
        ("2022-01-01", "2022-12-31", "2022", ["date:2022"]),
    ],
)
def test_a_span_has_its_words_and_graph_nodes(first: str, last: str, words: str, nodes: list[str]) -> None:
    span = dates.DaySpan(date.fromisoformat(first), date.fromisoformat(last))
    assert span.words() == words
    assert span.node_ids() == nodes


def test_a_span_gives_the_range_of_graph_nodes_inside_it() -> None:
    lo, hi = dates.DaySpan(date(2022, 7, 1), date(2022, 7, 31)).node_range()
    inside = ["date:2022-07", "date:2022-07-01", "date:2022-07-31"]
    outside = ["date:2022", "date:2022-06-30", "date:2022-08", "date:2022-08-01"]
    assert all(lo <= n <= hi for n in inside)
    assert not any(lo <= n <= hi for n in outside)
