"""The rows recall keeps: each under one version, at most `limit`, least recently used out first."""

from __future__ import annotations

from backend.chroma.row_cache import CachedRow, RowCache


def _row(text: str) -> CachedRow:
    return CachedRow([1.0, 0.0], text, {"title": text})


def test_a_row_is_served_only_under_the_version_it_was_kept_under() -> None:
    cache = RowCache()
    cache.put("summary_a", (1, 10, 11, None), _row("A"))
    assert cache.get("summary_a", (1, 10, 11, None)) == _row("A")
    assert cache.get("summary_a", (2, 20, 21, None)) is None  # rewritten since: fetch again
    assert cache.get("summary_a", None) is None  # being written: never from the cache
    cache.put("summary_a", None, _row("A2"))  # fetched while being written: not kept, and the old row dropped
    assert cache.get("summary_a", (1, 10, 11, None)) is None and len(cache) == 0


def test_past_its_limit_the_least_recently_used_row_goes_first() -> None:
    cache = RowCache(limit=2)
    cache.put("a", 1, _row("a"))
    cache.put("b", 1, _row("b"))
    assert cache.get("a", 1) is not None  # a is now the most recently used
    cache.put("c", 1, _row("c"))
    assert len(cache) == 2 and cache.get("b", 1) is None
    assert cache.get("a", 1) is not None and cache.get("c", 1) is not None
    cache.clear()
    assert len(cache) == 0
