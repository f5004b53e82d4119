"""Export paths (the read-only console's `e`): operator-named, outside the data dir, never overwriting."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.core import private
from backend.core.errors import BadInput

SEGMENT = st.sampled_from(["data", "logs", "..", ".", "x.csv", "out", "a b", "ü", "", "~"]) | st.text(
    min_size=1, max_size=8
)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A data dir (with logs/ and a symlink into it from outside) next to a free folder."""
    root = tmp_path / "data"
    (root / "logs").mkdir(parents=True)
    (root / "state.db").write_text("db")
    outside = tmp_path / "out"
    outside.mkdir()
    (outside / "taken.csv").write_text("keep me")
    (outside / "link").symlink_to(root)
    return root, outside


def _check(raw: str, root: Path, outside: Path) -> None:
    try:
        path = private.export_path(raw, root)
    except BadInput as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert path.is_absolute() and path.parent.is_dir()
    assert not os.path.lexists(path)
    assert not private.inside(path, root)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.text(max_size=60))
def test_any_text_is_a_new_path_outside_the_data_dir_or_one_clear_refusal(
    layout: tuple[Path, Path], raw: str
) -> None:
    root, outside = layout
    _check(raw, root, outside)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.sampled_from(["root", "outside", "link"]), segments=st.lists(SEGMENT, max_size=4))
def test_paths_built_around_the_data_dir_never_land_inside_it(
    layout: tuple[Path, Path], base: str, segments: list[str]
) -> None:
    root, outside = layout
    start = {"root": root, "outside": outside, "link": outside / "link"}[base]
    _check(os.path.join(str(start), *segments), root, outside)


def test_the_refusals_name_the_fix(layout: tuple[Path, Path]) -> None:
    root, outside = layout
    cases = {
        "": "name the file",
        "   ": "name the file",
        "a\x1b[2Jb.csv": "control characters",
        str(root / "x.csv"): "inside the data dir",
        str(outside / "link" / "x.csv"): "inside the data dir",  # through a symlink
        str(outside / "taken.csv"): "already exists",
        str(outside / "nope" / "x.csv"): "does not exist",
    }
    for raw, why in cases.items():
        with pytest.raises(BadInput, match=why):
            private.export_path(raw, root)


def test_an_export_is_created_private_and_never_through_a_link(layout: tuple[Path, Path]) -> None:
    root, outside = layout
    target = outside / "new.csv"
    private.create_export(target, "a,b\n")
    assert target.read_text() == "a,b\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
    with pytest.raises(BadInput, match="already exists"):
        private.create_export(target, "other")
    assert target.read_text() == "a,b\n"
    dangling = outside / "dangling.csv"
    dangling.symlink_to(root / "planted.csv")
    with pytest.raises(BadInput, match="already exists"):
        private.create_export(dangling, "x")
    assert not (root / "planted.csv").exists()


def test_unusable_names_are_refused_in_one_line(layout: tuple[Path, Path]) -> None:
    root, outside = layout
    loop = outside / "loop"
    loop.symlink_to(loop)
    for raw in (str(outside / ("x" * 300)), str(loop / "x.csv")):
        with pytest.raises(BadInput):
            private.export_path(raw, root)
