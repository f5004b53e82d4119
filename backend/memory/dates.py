"""Time said in words, resolved to absolute days: "yesterday", "last Tuesday", "two weeks ago".

Dream resolves each turn's expressions against the turn's own time and
stores the days in the memory graph (`date:` nodes, `on` edges: see
`backend.dream.graph`), and the recall index writes them beside the turn's
text; recall resolves a query's expressions against now, so "what did we
decide in July 2022" or "last month" favours turns whose own or resolved
days fall in that span.

A small module of our own, not dateparser: dateparser's `search_dates` is
built to read one date out of a web page, tries every substring in many
languages (a turn's "may" or "second" becomes a date), costs milliseconds a
turn (Dream digests thousands a second) and ~0.3 s of imports. What is
needed here is a fixed English grammar of relative expressions, resolved
deterministically against a given day, and tested case by case
(tests/backend/test_memory_dates.py).

Conventions: weeks run Monday to Sunday; "last Saturday" is the latest
Saturday before the day (1 to 7 days back), "next Saturday" the first after
it, "this Saturday" the one in the day's week; "two weeks ago" is the week
that holds the day 14 days back; "a month ago" the calendar month one back;
a date without its year ("June 5th") is the nearest such day.
A bare weekday ("on Saturday") is left alone: only the tense says which.
"""

from __future__ import annotations

import calendar
import functools
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
MONTHS["sept"] = 9
WEEKDAYS = {name.lower(): i for i, name in enumerate(calendar.day_name)}
NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "a few": 3,
    "a couple of": 2,
    "a couple": 2,
    "couple of": 2,
    "several": 3,
}
# a span longer than this is a month or a year, not a list of days
MAX_DAYS = 7
MAX_SPANS = 8  # per text: a turn that lists more dates than this is a table, not a story

_MONTH = "|".join(sorted(MONTHS, key=len, reverse=True))
_WEEKDAY = "|".join(WEEKDAYS)
_NUMBER = r"\d{1,3}|" + "|".join(sorted(NUMBERS, key=len, reverse=True))
_UNIT = r"days?|weeks?|months?|years?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"((?:19|20)\d\d)"

PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(r"(?<![\w-])" + pattern + r"(?![\w-])", re.IGNORECASE))
    for name, pattern in (
        ("day_before_yesterday", r"the day before yesterday"),
        ("day_after_tomorrow", r"the day after tomorrow"),
        ("yesterday", r"yesterday|last night"),
        ("today", r"today|tonight|this (?:morning|afternoon|evening)"),
        ("tomorrow", r"tomorrow"),
        ("ago", rf"({_NUMBER}) ({_UNIT}) ago"),
        ("in_n", rf"in ({_NUMBER}) ({_UNIT})"),
        ("weekday", rf"(last|this|next|past) ({_WEEKDAY})"),
        ("weekend", r"(last|this|next|past) weekend"),
        ("period", r"(last|this|next|past) (week|month|year)"),
        ("day_month_year", rf"{_DAY}(?: of)? ({_MONTH})\.?,? {_YEAR}"),
        ("month_day_year", rf"({_MONTH})\.? {_DAY},? {_YEAR}"),
        ("month_year", rf"({_MONTH}),? {_YEAR}"),
        ("day_month", rf"{_DAY}(?: of)? ({_MONTH})"),
        ("month_day", rf"({_MONTH}) {_DAY}"),
        ("year", rf"(?:in|of|since|during) {_YEAR}"),
    )
)


@dataclass(frozen=True, order=True)
class DaySpan:
    """The days an expression names, first to last (inclusive), and the words as written."""

    first: date
    last: date
    phrase: str = field(default="", compare=False)

    def words(self) -> str:
        """The span as people write it in a question: '7 May 2023', 'May 2023', '2023', or first to last."""
        if self.first == self.last:
            return day_words(self.first)
        if self.first.day == 1 and self.last == _month_end(self.first.year, self.first.month):
            return f"{calendar.month_name[self.first.month]} {self.first.year}"
        if (self.first.month, self.first.day, self.last.month, self.last.day) == (1, 1, 12, 31):
            return str(self.first.year) if self.first.year == self.last.year else ""
        return f"{day_words(self.first)} to {day_words(self.last)}"

    def node_ids(self) -> list[str]:
        """Its `date:` graph nodes: each day of a span of up to a week, else its months, else its years."""
        days = (self.last - self.first).days + 1
        if days <= MAX_DAYS:
            return [f"date:{self.first + timedelta(n)}" for n in range(days)]
        months = _months(self.first, self.last)
        if len(months) <= 3:
            return [f"date:{y:04d}-{m:02d}" for y, m in months]
        return [f"date:{y:04d}" for y in range(self.first.year, self.last.year + 1)]

    def node_range(self) -> tuple[str, str]:
        """The lowest and highest `date:` node id inside the span: its day, month and year nodes
        sort between them (ISO order), so one range scan of graph_edge's dst index finds them."""
        first = self.first
        if (first.month, first.day) == (1, 1) and self.last >= date(first.year, 12, 31):
            low = f"date:{first.year:04d}"
        elif first.day == 1 and self.last >= _month_end(first.year, first.month):
            low = f"date:{first.year:04d}-{first.month:02d}"
        else:
            low = f"date:{first}"
        return low, f"date:{self.last}"


def day_words(day: date) -> str:
    """'8 May 2023': how people name a day in a question."""
    return f"{day.day} {calendar.month_name[day.month]} {day.year}"


def day_of(ms: int) -> date:
    """The UTC day of a Unix time in ms."""
    return datetime.fromtimestamp(ms / 1000, UTC).date()


# a word every expression above holds: most turns have none, and one search rules them out
ANY_TIME_WORD = re.compile(
    r"(?<!\w)(?:yesterday|last night|today|tonight|tomorrow|this (?:morning|afternoon|evening)|days?|weeks?|"
    rf"weekend|months?|years?|{_WEEKDAY}|{_MONTH}|(?:19|20)\d\d)(?!\w)",
    re.IGNORECASE,
)


def resolve(text: str, when_ms: int) -> list[DaySpan]:
    """The spans of days `text`'s time expressions name, said at `when_ms` (in order, each once)."""
    return list(_resolve(text, when_ms))


# Dream resolves each turn three times in a row (its index row, the graph's nodes, its edges)
@functools.lru_cache(maxsize=256)
def _resolve(text: str, when_ms: int) -> tuple[DaySpan, ...]:
    if ANY_TIME_WORD.search(text) is None:
        return ()
    today = day_of(when_ms)
    found: list[tuple[int, DaySpan]] = []
    taken: list[tuple[int, int]] = []
    for name, pattern in PATTERNS:
        for match in pattern.finditer(text):
            start, end = match.span()
            if any(start < e and s < end for s, e in taken):
                continue  # part of a longer expression found first ("the day before yesterday")
            span = _span(name, match, today)
            if span is not None:
                taken.append((start, end))
                found.append((start, DaySpan(span[0], span[1], match.group(0))))
    spans = list(dict.fromkeys(span for _, span in sorted(found)))
    return tuple(spans[:MAX_SPANS])


def overlaps(a: DaySpan, b: DaySpan) -> bool:
    """Whether two spans share a day."""
    return a.first <= b.last and b.first <= a.last


def span_of_node(node_id: str) -> DaySpan:
    """The days a `date:` graph node stands for (`date:2023-05-07`, `date:2023-05`, `date:2023`)."""
    parts = [int(p) for p in node_id.removeprefix("date:").split("-")]
    if len(parts) == 3:
        day = date(*parts)
        return DaySpan(day, day)
    if len(parts) == 2:
        return DaySpan(date(parts[0], parts[1], 1), _month_end(parts[0], parts[1]))
    return DaySpan(date(parts[0], 1, 1), date(parts[0], 12, 31))


def _span(name: str, match: re.Match[str], today: date) -> tuple[date, date] | None:
    fixed = {"day_before_yesterday": -2, "yesterday": -1, "today": 0, "tomorrow": 1, "day_after_tomorrow": 2}
    if name in fixed:
        day = today + timedelta(fixed[name])
        return day, day
    if name in ("ago", "in_n"):
        count = _number(match.group(1))
        unit = match.group(2).lower().rstrip("s")
        return _shifted(today, unit, -count if name == "ago" else count)
    if name in ("weekday", "weekend", "period"):
        return _relative(name, match, today)
    return _absolute(name, match, today)


def _number(word: str) -> int:
    word = " ".join(word.lower().split())
    return int(word) if word.isdigit() else NUMBERS[word]


def _shifted(today: date, unit: str, count: int) -> tuple[date, date] | None:
    """The day, week, month or year `count` units from `today`."""
    if abs(count) > 400:
        return None
    if unit == "day":
        day = today + timedelta(count)
        return day, day
    if unit == "week":
        return _week(today + timedelta(7 * count))
    if unit == "month":
        index = today.year * 12 + today.month - 1 + count
        return _month(index // 12, index % 12 + 1)
    year = today.year + count
    return (date(year, 1, 1), date(year, 12, 31)) if 1 <= year <= 9999 else None


def _relative(name: str, match: re.Match[str], today: date) -> tuple[date, date] | None:
    """last / this / next: a weekday, the weekend, the week, the month or the year."""
    which = match.group(1).lower()
    step = {"last": -1, "past": -1, "this": 0, "next": 1}[which]
    if name == "period":
        return _shifted(today, match.group(2).lower(), step)
    if name == "weekend":
        saturday = _week(today + timedelta(7 * step))[0] + timedelta(5)
        if step == -1 and today.weekday() >= 5:
            saturday = _week(today)[0] - timedelta(2)  # said on a Sunday: the one before this one
        return saturday, saturday + timedelta(1)
    target = WEEKDAYS[match.group(2).lower()]
    if step == 0:
        day = _week(today)[0] + timedelta(target)
    elif step < 0:
        day = today - timedelta((today.weekday() - target - 1) % 7 + 1)
    else:
        day = today + timedelta((target - today.weekday() - 1) % 7 + 1)
    return day, day


def _absolute(name: str, match: re.Match[str], today: date) -> tuple[date, date] | None:
    """A date written out; without a year, the nearest such day to `today` (within half a year)."""
    groups = match.groups()
    try:
        if name == "year":
            year = int(groups[0])
            return date(year, 1, 1), date(year, 12, 31)
        if name == "month_year":
            return _month(int(groups[1]), MONTHS[groups[0].lower()])
        if name in ("day_month_year", "day_month"):
            day, month = int(groups[0]), MONTHS[groups[1].lower()]
        else:
            day, month = int(groups[1]), MONTHS[groups[0].lower()]
        year = int(groups[2]) if len(groups) > 2 else today.year
        found = date(year, month, day)
        if len(groups) == 2 and abs((found - today).days) > 183:
            found = date(year + (1 if found < today else -1), month, day)
    except ValueError:
        return None  # "31 February", "30th of Feb": not a day
    return found, found


def _week(day: date) -> tuple[date, date]:
    monday = day - timedelta(day.weekday())
    return monday, monday + timedelta(6)


def _month(year: int, month: int) -> tuple[date, date] | None:
    if not 1 <= year <= 9999:
        return None
    return date(year, month, 1), _month_end(year, month)


def _month_end(year: int, month: int) -> date:
    return date(year, month, calendar.monthrange(year, month)[1])


def _months(first: date, last: date) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    index = first.year * 12 + first.month - 1
    while index <= last.year * 12 + last.month - 1 and len(out) < 13:
        out.append((index // 12, index % 12 + 1))
        index += 1
    return out
