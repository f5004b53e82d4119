"""Getting started, run as a reader runs it: from "Your own data dir" to the first recall.

Each `sh` block of docs/getting-started.md from that section on runs in bash, in a
fresh home folder, in order, with the exports of the blocks before it. A block that
says `# in a second terminal` is started in the background (`rem up`) and stopped at
the end. The `text` block after a command block is its expected output: what the
block printed (stderr and stdout) must match it, with whitespace and line wrapping
ignored, every number and hex id counted equal to any other (not the digits of a name:
`s1`, `v13`), a table's rule of any width, and `...` matching anything. A block that only reads (`rem show`, `rem recall`, `rem status`) and whose
output does not match yet (a reply still running, turns not indexed yet) is run again
until it does, as a reader would, within a deadline; any other block runs once.

The suite's Chroma server stands in for the one `rem up` would start (REM_CHROMA_URL,
a collection of this test's own): the rest is what the page says.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs.pages import DOCS, Block, code_blocks

PAGE = DOCS / "getting-started.md"
FIRST_SECTION = "## 3. Your own data dir"
DEADLINE_S = 90.0
READS_ONLY = re.compile(r"(rem (show|recall|status)\b[^\n;&|>]*\n?)+")


def walk() -> list[tuple[Block, Block | None]]:
    """The page's (command block, expected output block or None) pairs, from FIRST_SECTION to the
    first block that runs `rem recall`."""
    text = PAGE.read_text(encoding="utf-8")
    start = text[: text.index(FIRST_SECTION)].count("\n") + 1
    blocks = [b for b in code_blocks(PAGE) if b.line > start]
    pairs: list[tuple[Block, Block | None]] = []
    for block, after in zip(blocks, [*blocks[1:], None], strict=True):
        if block.lang != "sh":
            continue
        expected = after if after is not None and after.lang == "text" else None
        pairs.append((block, expected))
        if re.search(r"^rem recall ", block.text, re.M):
            return pairs
    raise AssertionError(f"{PAGE.name}: no `rem recall` block after {FIRST_SECTION!r}")


def normal(text: str) -> str:
    """Output as compared: numbers and hex ids as 0, whitespace as one space."""
    text = re.sub(r"(?<![0-9A-Za-z])[0-9a-f]*[0-9][0-9a-f]{7,}(?![0-9A-Za-z])", "0", text)
    text = re.sub(r"(?<![A-Za-z])\d+(\.\d+)?", "0", text)  # not a name's digits: s1, schema v13
    text = re.sub("─+", "─", text)  # a table's rule is as wide as its columns
    return " ".join(text.split())


def matches(expected: str, got: str) -> bool:
    parts = [re.escape(part.strip()).replace(r"\ ", r"\s*") for part in normal(expected).split("...")]
    pattern = r"\s*" + r".*".join(parts) + r"\s*"
    return re.fullmatch(pattern, normal(got), re.S) is not None


@pytest.fixture
def home(tmp_path: Path, chroma_url: str, collection: str) -> dict[str, str]:
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "REM_CHROMA_URL": chroma_url,
        "REM_CHROMA_COLLECTION": collection,
    }
    return env


def _run(script: str, env: dict[str, str], cwd: Path, state: Path) -> subprocess.CompletedProcess[str]:
    """One block in bash, with the exports of the blocks before it (kept in `state`)."""
    body = f"set -e\n. {state}\n{script}\nexport -p > {state}\n"
    return subprocess.run(
        ["bash", "-c", body], cwd=cwd, env=env, capture_output=True, text=True, timeout=DEADLINE_S
    )


def _real_home(output: str, home: str) -> str:
    return output.replace(home, "/home/you")


@pytest.mark.slow  # a `rem up` and its daemons: ~20-35 s on the 2-core machine
def test_getting_started_runs_as_written_up_to_the_first_recall(home: dict[str, str], tmp_path: Path) -> None:
    state = tmp_path / ".exports"
    state.write_text("")
    background: list[subprocess.Popen[str]] = []
    try:
        for block, expected in walk():
            where = f"{PAGE.name}:{block.line}"
            if "# in a second terminal" in block.text:
                background.append(_start(block.text, home, tmp_path, state))
                if expected is not None:
                    _wait_for_output(background[-1], tmp_path / ".up.out", expected.text, home, where)
                continue
            _run_until_it_matches(block, expected, home, tmp_path, state, where)
    finally:
        for proc in background:
            _stop(proc)


def _start(script: str, env: dict[str, str], cwd: Path, state: Path) -> subprocess.Popen[str]:
    """The block's last line (`rem up`) in the background, its output in `.up.out`."""
    with open(cwd / ".up.out", "w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            ["bash", "-c", f". {state}\nexec {script.strip().splitlines()[-1]}"],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def _wait_for_output(
    proc: subprocess.Popen[str], log: Path, expected: str, env: dict[str, str], where: str
) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        got = _real_home(log.read_text(), env["HOME"])
        if matches(expected, got):
            return
        assert proc.poll() is None, f"{where}: it exited {proc.returncode}: {got}"
        time.sleep(0.2)
    raise AssertionError(f"{where}: printed {got!r}, the page shows {expected!r}")


def _run_until_it_matches(
    block: Block, expected: Block | None, env: dict[str, str], cwd: Path, state: Path, where: str
) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        proc = _run(block.text, env, cwd, state)
        got = _real_home(proc.stderr + proc.stdout, env["HOME"])
        assert proc.returncode == 0, f"{where}: exit {proc.returncode}: {got}"
        if expected is None or matches(expected.text, got):
            return
        # a reply still streaming, turns not indexed yet: a reader runs it again, so do we
        assert READS_ONLY.fullmatch(block.text.strip()), (
            f"{where}: printed\n{got}\nthe page shows\n{expected.text}"
        )
        assert time.monotonic() < deadline, f"{where}: printed\n{got}\nthe page shows\n{expected.text}"
        time.sleep(0.5)


def _stop(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C, as the page says (`rem up` drains and stops); SIGKILL to its group past a deadline."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_the_matcher_can_fail() -> None:
    assert matches(
        "rem: admitted in_001a24d7 into session s1 (queue, seq 1)",
        "rem: admitted in_00ff12ab34 into session s1 (queue, seq 2)\n",
    )
    assert not matches("rem: admitted in_0 into session s1", "rem: admitted in_0 into session s2")
    assert matches("Usage: rem [OPTIONS]\n...", "Usage: rem [OPTIONS]\n\nmore and more")
    assert not matches("3 item(s)\n 1 turn", "3 item(s)\n 1 summary")
    assert READS_ONLY.fullmatch('rem recall "payments cluster" --project ops')
    assert not READS_ONLY.fullmatch('rem send s1 "hi"') and not READS_ONLY.fullmatch("rem show s1 > x")
    assert [b.lang for b, _ in walk()][0] == "sh" and any(e is not None for _, e in walk())
