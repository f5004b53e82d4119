"""Bad input, much of it fuzzed: each gets one clear line (or is quarantined and shown), nothing else is lost.

Covered: `rem send` texts (huge, binary, control characters, invalid UTF-8
from the shell in argv and on stdin), malformed `--id`, session ids and
`--data`, corrupt receipt envelopes met by a live summarizer, Chroma rows
with wrong metadata types and foreign keys, a summary row deleted by hand,
and a state.db truncated mid-page. No case may print a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from backend import ops
from backend.chroma.collection import ChromaStore
from backend.chroma.ownership import DREAM_OWNED_KEYS, SYNTHESIS_OWNED_KEYS
from backend.cli.app import main
from backend.core.datadir import DataDir
from backend.core.errors import RemError
from backend.execution import sessions
from backend.runtime.context import Context
from backend.summaries import receipts
from backend.summaries.receipt_replay import Recovery, all_batches
from tests.helpers import REM, rem_env, run_rem
from tests.summaries import base_metadata, row_id, stage_receipt, vector_of

ROOT = Path(__file__).resolve().parents[2]
LIMIT = sessions.MAX_TEXT_BYTES


def _inputs(data: Path) -> list[tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(data / "state.db")) as conn:
        return conn.execute("SELECT id, prompt FROM session_input ORDER BY rowid").fetchall()


def _rem_in_process(argv: list[str], stdin: bytes = b"") -> tuple[int, str, str]:
    """`rem ARGV` in this process (fast enough to fuzz), with stdin, stdout and stderr captured."""
    out, err, saved = io.StringIO(), io.StringIO(), sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


def _assert_one_line(code: int, out: str, err: str, rc: int, needle: str = "") -> str:
    assert code == rc, (code, out, err)
    assert out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rem: error: ") and needle in lines[0], err
    return lines[0]


def _acceptable(text: str) -> bool:
    """The admission rule, stated independently: non-blank, valid Unicode, at most 256 KiB of UTF-8."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return bool(text.strip()) and size <= LIMIT


# -- rem send: texts ------------------------------------------------------------------------------

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
texts = st.one_of(
    st.text(),  # any Unicode, control characters included
    st.text(alphabet=st.characters(codec=None, exclude_categories=())),  # lone surrogates too
    st.binary().map(lambda b: b.decode("utf-8", "surrogateescape")),  # raw shell bytes, as Python gets argv
    st.sampled_from([" \t\n", "\x00", "\x1b[31mred\x1b[0m\x07", "\r\n\x0b\x0c"]),
    st.integers(LIMIT - 3, LIMIT + 3).map(lambda n: "x" * n),
    st.integers(LIMIT // 2 - 2, LIMIT // 2 + 2).map(lambda n: "é" * n),  # two bytes each
)


@FUZZ
@given(text=texts, use_stdin=st.booleans())
@example(text="-", use_stdin=False)
def test_send_admits_exactly_the_acceptable_texts_and_stores_them_verbatim_nul_as_u_fffd(
    tmp_path: Path, text: str, use_stdin: bool
) -> None:
    if text == "-" and not use_stdin:  # `rem send S -` reads the text from stdin (README); ours is empty
        text, use_stdin = "", True
    data = tmp_path / "d"
    before = _inputs(data) if data.exists() else []
    argv = ["send", "--json", "--data", str(data), "--", "s1"]
    if use_stdin:
        raw = _as_bytes(text)  # what a pipe would carry
        code, out, err = _rem_in_process([*argv, "-"], stdin=raw)
        text = raw.decode("utf-8", "surrogateescape")
    else:
        code, out, err = _rem_in_process([*argv, text])
    after = _inputs(data) if data.exists() else []
    if _acceptable(text):
        assert code == 0, err
        admitted = json.loads(out)
        assert after[:-1] == before and after[-1][0] == admitted["input_id"]
        # byte for byte, control characters and all, but NUL, kept as U+FFFD on both stores (PostgreSQL
        # cannot hold it: tests/backend/test_nul_input.py)
        assert json.loads(after[-1][1])["text"] == text.replace("\x00", "\ufffd")
    else:
        _assert_one_line(code, out, err, 2, _expected_refusal(text, use_stdin))
        assert after == before


def _as_bytes(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no byte decodes to: the invalid UTF-8 that encodes it
        return text.encode("utf-8", "surrogatepass")


def _expected_refusal(text: str, from_stdin: bool) -> str:
    """Which rule refuses the text, in the order rem applies them."""
    if from_stdin and not _acceptable_bytes(text):
        return "the text on stdin is not valid UTF-8"
    if not text.strip():
        return "the input text is empty"
    if not _acceptable_bytes(text):
        return "the input text is not valid UTF-8"
    return f"over the {LIMIT} byte (256 KiB) limit"


def _acceptable_bytes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@pytest.mark.parametrize(
    ("args", "stdin", "needle"),
    [
        ([b"s1", b"caf\xe9 au lait"], None, "not valid UTF-8 (byte 0xe9 at character 3)"),
        ([b"s1", b"\xff\xfe"], None, "not valid UTF-8 (byte 0xff at character 0)"),
        (
            [b"s1", b"-"],
            b"ok so far \xc3\x28",
            "the text on stdin is not valid UTF-8 (byte 0xc3 at offset 10)",
        ),
        # stdin is read only up to the limit + 1 byte, so the refusal cannot name the whole size
        ([b"s1", b"-"], b"x" * (LIMIT + 1), f"the text on stdin is over the {LIMIT} byte (256 KiB) limit"),
        ([b"s1", b"-"], b" \n\t ", "the input text is empty"),
    ],
    ids=["latin1-argv", "binary-argv", "bad-utf8-stdin", "huge-stdin", "blank-stdin"],
)
def test_raw_shell_bytes_get_one_line_and_write_nothing(
    tmp_path: Path, args: list[bytes], stdin: bytes | None, needle: str
) -> None:
    data = tmp_path / "d"
    assert run_rem("send", "s1", "baseline", "--data", str(data)).returncode == 0
    before = _inputs(data)
    proc = subprocess.run(
        [REM.encode(), b"send", b"--data", str(data).encode(), *args],
        input=stdin,
        capture_output=True,
        env=rem_env(),
        timeout=60,
    )
    err = proc.stderr.decode("utf-8", "replace")
    _assert_one_line(proc.returncode, proc.stdout.decode(), err, 2, needle)
    assert _inputs(data) == before


def test_control_characters_from_stdin_are_stored_verbatim_and_nul_as_u_fffd(tmp_path: Path) -> None:
    # NUL is kept as U+FFFD on both stores (PostgreSQL cannot hold it: tests/backend/test_nul_input.py)
    data = tmp_path / "d"
    raw = b"tab\tbell\x07 esc\x1b[2J nul\x00 del\x7f crlf\r\n"
    proc = subprocess.run(
        [REM, "send", "s1", "-", "--json", "--data", str(data)],
        input=raw,
        capture_output=True,
        env=rem_env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(_inputs(data)[0][1])["text"].encode() == raw.replace(b"\x00", "\ufffd".encode())


# -- rem send: ids -----------------------------------------------------------------------------------

ids = st.one_of(
    st.text(max_size=120),
    st.from_regex(sessions.ID_PATTERN, fullmatch=True),
    st.sampled_from(["", "-", ".x", "a" * 100, "a" * 101, "recovery:exe_1", "a/b", "a b", "ü"]),
)


@FUZZ
@given(input_id=ids, session_id=ids)
def test_malformed_ids_are_refused_in_one_line_and_write_nothing(
    tmp_path: Path, input_id: str, session_id: str
) -> None:
    data = tmp_path / uuid.uuid4().hex[:8]
    assert run_ok(["send", "--data", str(data), "baseline", "already here"])
    before = _inputs(data)
    code, out, err = _rem_in_process(
        ["send", "--json", "--data", str(data), "--id", input_id, "--", session_id, "a well-formed question?"]
    )
    valid = all(sessions.ID_PATTERN.fullmatch(v) for v in (input_id, session_id))
    after = _inputs(data)
    if valid:
        assert code == 0, err
        assert after[:-1] == before and after[-1][0] == input_id == json.loads(out)["input_id"]
    else:
        _assert_one_line(code, out, err, 2, "malformed")
        assert after == before


def run_ok(argv: list[str]) -> bool:
    code, _, err = _rem_in_process(argv)
    assert code == 0, err
    return True


# -- --data ------------------------------------------------------------------------------------------


def _foreign_db(path: Path) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE session (id TEXT PRIMARY KEY, owner TEXT)")
        conn.execute("INSERT INTO session VALUES ('x', 'another program')")
        conn.commit()
    return path.read_bytes()


COMMANDS = [
    ["init"],
    ["status", "--json"],
    ["check", "--json"],
    ["send", "s1", "hello"],
    ["replay", "--all", "--dry-run"],
    ["drain", "w1"],
    ["release", "exe_1"],
    ["daemon", "--role", "executor", "--once"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_another_programs_sqlite_file_is_refused_and_left_untouched(
    tmp_path: Path, command: list[str]
) -> None:
    data = tmp_path / "d"
    original = _foreign_db(data / "state.db")
    proc = run_rem(*command, "--data", str(data), env=rem_env(REM_CHROMA_AUTOSTART="0"))
    line = _assert_one_line(
        proc.returncode, proc.stdout, proc.stderr, 2, "is a SQLite database, but not rem's"
    )
    assert str(data / "state.db") in line and "move it aside or pass another --data" in line
    assert (data / "state.db").read_bytes() == original


@pytest.mark.parametrize(
    ("setup", "command", "rc", "needle"),
    [
        ("empty", ["status"], 2, "has no rem schema yet; run `rem init --data"),
        ("empty", ["check"], 2, "has no rem schema yet"),
        ("blank", ["send", "s1", "hi"], 2, "--data is empty: pass the data dir's path"),
        ("blank", ["init"], 2, "--data is empty"),
        ("file", ["send", "s1", "hi"], 2, "is a file, not a directory"),
    ],
    ids=["empty-status", "empty-check", "blank-send", "blank-init", "file-send"],
)
def test_malformed_data_dirs_get_one_line(
    tmp_path: Path, setup: str, command: list[str], rc: int, needle: str
) -> None:
    data = tmp_path / "d"
    if setup == "empty":
        data.mkdir()
        (data / "state.db").touch()
    elif setup == "file":
        data.write_text("not a directory")
    arg = "" if setup == "blank" else str(data)
    proc = subprocess.run(
        [REM, *command, "--data", arg],
        capture_output=True,
        text=True,
        env=rem_env(),
        cwd=tmp_path,
        timeout=60,
    )
    _assert_one_line(proc.returncode, proc.stdout, proc.stderr, rc, needle)
    assert not (tmp_path / "state.db").exists()  # never silently the current directory
    if setup == "empty":
        assert (data / "state.db").stat().st_size == 0


# -- a state.db truncated mid-page ------------------------------------------------------------------


@pytest.fixture(scope="module")
def populated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpointed state.db of a few dozen pages, with its -wal folded in and gone."""
    data = tmp_path_factory.mktemp("populated") / "d"

    async def build() -> None:
        ctx = Context(DataDir(data), start_chroma=False)
        db = await ctx.db()
        for i in range(40):
            await sessions.admit(db, f"s{i % 4}", f"Question {i}: " + "why is the refund queue late? " * 40)
        await ctx.close()

    asyncio.run(build())
    assert not (data / "state.db-wal").exists()
    return data / "state.db"


ALL_COMMANDS = [
    *COMMANDS,
    ["replay", "--all"],
    ["daemon", "--role", "summarizer", "--once"],
    ["daemon", "--role", "dream", "--once"],
    ["up"],
]


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=lambda c: "-".join(c[:3]))
def test_every_command_on_a_truncated_state_db_says_so_in_one_line(
    tmp_path: Path, populated_db: Path, command: list[str]
) -> None:
    data = tmp_path / "d"
    data.mkdir()
    pages = populated_db.stat().st_size // 4096
    shutil.copy(populated_db, data / "state.db")
    os.truncate(data / "state.db", 4096 * (pages // 2) + 1234)  # mid-page, half the file gone
    proc = run_rem(*command, "--data", str(data), env=rem_env(REM_CHROMA_AUTOSTART="0"), timeout=60)
    err = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("rem up: data dir"))
    line = _assert_one_line(proc.returncode, proc.stdout, err, 1, "is not a readable rem database")
    assert str(data / "state.db") in line and "restore it from a backup or move it aside" in line


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.0, 1.0))
def test_any_truncation_is_a_rem_error_or_a_readable_report_never_a_crash(
    tmp_path: Path, populated_db: Path, cut: float
) -> None:
    data = tmp_path / f"d{uuid.uuid4().hex[:6]}"
    data.mkdir()
    shutil.copy(populated_db, data / "state.db")
    os.truncate(data / "state.db", int(populated_db.stat().st_size * cut))

    async def probe() -> None:
        for call in (ops.status, lambda c: ops.check(c, verify_chroma=False)):
            ctx = Context(DataDir(data), read_only=True, start_chroma=False)
            try:
                await call(ctx)  # a survivable cut (only free pages lost) may still read fine
            except RemError as exc:
                assert "\n" not in str(exc) and str(data) in str(exc)
            finally:
                await ctx.close()

    asyncio.run(probe())


# -- receipts and Chroma rows ----------------------------------------------------------------------


async def _summarized(ctx: Context, sessions_: list[str]) -> None:
    """Sessions with acknowledged receipts whose rows are in Chroma, as a finished synthesis leaves them."""
    db = await ctx.db()
    for sid in sessions_:
        document = f"Summary of {sid}: the refund queue and the ledger export."
        receipt = receipts.issue(document, base_metadata(sid), embedding=vector_of(document))
        await stage_receipt(db, sid, receipt.document, receipt.metadata, now=1_800_000_000_000)
        await ctx.store().upsert([row_id(sid)], [receipt.document], [receipts.chroma_metadata(receipt)])


def _rem_json(ctx: Context, chroma_url: str, *args: str, rc: int) -> dict[str, Any]:
    proc = run_rem(
        *args,
        "--json",
        "--data",
        str(ctx.data.root),
        "--chroma-url",
        chroma_url,
        env=rem_env(REM_CHROMA_COLLECTION=ctx.collection),
    )
    assert proc.returncode == rc and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    return dict(json.loads(proc.stdout))


def _whats(report: dict[str, Any]) -> set[str]:
    return {v["what"] for v in report["violations"]}


async def test_a_summary_row_deleted_by_hand_is_shown_by_check_and_repaired_by_replay(
    ctx: Context, chroma_url: str
) -> None:
    await _summarized(ctx, ["s1", "s2", "s3"])
    await ctx.store().update_metadata([row_id("s1")], [{"graphDigested": True, "note": "kept"}])
    await ctx.store().delete([row_id("s2")])

    report = await asyncio.to_thread(_rem_json, ctx, chroma_url, "check", rc=1)
    (finding,) = [
        v
        for v in report["violations"]
        if v["what"] == "acknowledged receipts whose Chroma row does not match"
    ]
    assert [r["summary_id"] for r in finding["rows"]] == [row_id("s2")]
    assert finding["rows"][0]["verdict"] == "missing"

    replayed = await asyncio.to_thread(_rem_json, ctx, chroma_url, "replay", "--all", rc=0)
    assert (replayed["counters"]["replayed"], replayed["counters"]["present"]) == (1, 2)
    assert (await asyncio.to_thread(_rem_json, ctx, chroma_url, "check", rc=0))["ok"]
    rows = await ctx.store().get([row_id(s) for s in ("s1", "s2", "s3")])
    assert rows[row_id("s1")][1]["note"] == "kept" and rows[row_id("s1")][1]["graphDigested"] is True


async def _turns_and_summaries(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the executor and the summarizer once, in this process (instant agent)."""
    from backend.execution.executor import Executor
    from backend.summaries.summarizer import Summarizer

    monkeypatch.setenv("REM_AGENT_DELAY_MS", "0")
    await Executor(ctx, once=True).run()
    await Summarizer(ctx, once=True).run()


async def test_a_corrupt_envelope_met_by_a_live_summarizer_is_quarantined_shown_and_outgrown(
    ctx: Context, chroma_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await ctx.db()
    for sid in ("s1", "s2", "s3"):
        await sessions.admit(db, sid, f"What happened to the nightly ledger export in {sid}?")
    await _turns_and_summaries(ctx, monkeypatch)
    envelope = bytearray(await db.scalar("SELECT result_envelope FROM summary_job WHERE session_id = 's2'"))
    at = next(i for i in range(len(b'{"document":"') + 5, len(envelope)) if chr(envelope[i]).isalpha())
    envelope[at] ^= 0x20  # one flipped bit: a letter of the document changes case, the JSON stays valid
    async with db.tx() as conn:
        await conn.execute(
            "UPDATE summary_job SET result_envelope = ? WHERE session_id = 's2'", (bytes(envelope),)
        )
    rows_before = await ctx.store().get([row_id(s) for s in ("s1", "s2", "s3")])

    proc = await asyncio.to_thread(
        run_rem,
        "daemon",
        "--role",
        "summarizer",
        "--once",
        "--data",
        str(ctx.data.root),
        "--chroma-url",
        chroma_url,
        env=rem_env(REM_CHROMA_COLLECTION=ctx.collection, REM_LOG="1"),
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "receipt summary_s2 quarantined" in proc.stderr
    (shown,) = (await ops.status(ctx))["receipts"]["mismatched"]
    assert (shown["summary_id"], shown["verdict"]) == (row_id("s2"), "quarantined")
    assert "checksum does not match its content" in shown["quarantine_reason"]
    report = await asyncio.to_thread(_rem_json, ctx, chroma_url, "check", rc=1)
    assert _whats(report) == {"corrupt receipt envelopes (quarantined for the operator)"}
    assert (
        await ctx.store().get([row_id(s) for s in ("s1", "s2", "s3")]) == rows_before
    )  # nothing else touched
    assert bytes(envelope) == await db.scalar(
        "SELECT result_envelope FROM summary_job WHERE session_id = 's2'"
    )

    await sessions.admit(db, "s2", "And did the Frankfurt region recover after the rollback?")
    await _turns_and_summaries(ctx, monkeypatch)
    assert (await ops.check(ctx))["ok"]  # the next synthesis of s2 replaced the quarantined receipt


# Chroma rows with owned keys of the wrong type, owned keys missing, foreign keys of every type
values = st.one_of(
    st.text(max_size=12),
    st.integers(-(2**40), 2**40),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.lists(st.text(max_size=6), min_size=1, max_size=3),
)
foreign_names = st.one_of(
    st.sampled_from(DREAM_OWNED_KEYS), st.from_regex(r"[a-z][A-Za-z0-9_]{0,12}", fullmatch=True)
).filter(lambda k: k not in SYNTHESIS_OWNED_KEYS)
damage = st.fixed_dictionaries({}, optional={k: st.one_of(st.none(), values) for k in SYNTHESIS_OWNED_KEYS})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(owned=damage, foreign=st.dictionaries(foreign_names, values, max_size=4), new_document=st.booleans())
def test_recovery_repairs_owned_keys_and_never_touches_foreign_ones(
    chroma_url: str, tmp_path: Path, owned: dict[str, Any], foreign: dict[str, Any], new_document: bool
) -> None:
    asyncio.run(
        _damage_and_recover(tmp_path / f"d{uuid.uuid4().hex[:6]}", chroma_url, owned, foreign, new_document)
    )


async def _damage_and_recover(
    root: Path, chroma_url: str, owned: dict[str, Any], foreign: dict[str, Any], new_document: bool
) -> None:
    ctx = Context(DataDir(root), chroma_url=chroma_url, collection=f"t_{uuid.uuid4().hex[:12]}")
    try:
        await _summarized(ctx, ["s1", "s2"])
        store: ChromaStore = ctx.store()
        receipt = receipts.decode(
            await (await ctx.db()).scalar("SELECT result_envelope FROM summary_job WHERE session_id = 's1'")
        )
        if new_document:
            await store.upsert([row_id("s1")], ["edited by hand"], [{"sessionId": "s1"}])
        if owned or foreign:  # None deletes an owned key; other values replace it, maybe with another type
            await store.update_metadata([row_id("s1")], [{**owned, **foreign}])
        damaged = (await store.get([row_id("s1")]))[row_id("s1")]
        was_present = receipts.is_present(receipt, damaged)
        kept = {k: damaged[1][k] for k in foreign if k in damaged[1]}

        report = await Recovery(await ctx.db(), store, actor="test").run(all_batches(await ctx.db()))

        c = report.counters
        assert (c.scanned, c.quarantined, c.unverified) == (2, 0, 0)
        assert c.replayed == (0 if was_present else 1)
        after = (await store.get([row_id("s1")]))[row_id("s1")]
        assert receipts.is_present(receipt, after)
        assert all(
            receipts.strict_equal(v, after[1].get(k)) for k, v in kept.items()
        )  # foreign keys untouched
        assert (await ops.check(ctx))["ok"]
    finally:
        with contextlib.suppress(Exception):
            await ctx.store().delete([row_id("s1"), row_id("s2")])
        await ctx.close()


async def test_a_deleted_row_replayed_gets_its_dream_keys_back(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backend import ops
    from backend.dream.digester import Dreamer

    await ops.send(ctx, "s1", "Why did the Invoice Service reject Stripe webhooks for Maria Lopez?")
    await _turns_and_summaries(ctx, monkeypatch)
    await Dreamer(ctx, once=True).run()
    before = (await ctx.store().get([row_id("s1")]))[row_id("s1")][1]
    assert before["graphDigested"] is True and before["dreamCompletedRevision"]
    await ctx.store().delete([row_id("s1")])

    report = await ops.replay(ctx, all_mismatched=True)
    assert report["counters"]["replayed"] == 1
    db = await ctx.db()
    assert await db.scalar("SELECT overlay_pending FROM dream_state WHERE session_id = 's1'") == 1
    lost = await ops.check(ctx)
    assert "Dream overlays not written to Chroma yet" in {f["what"] for f in lost["unsettled"]}

    await Dreamer(ctx, once=True).run()  # the overlay flush writes Dream's keys onto the new row
    after = (await ctx.store().get([row_id("s1")]))[row_id("s1")][1]
    assert after["dreamCompletedRevision"] == before["dreamCompletedRevision"]
    assert after["graphDigested"] is True
    assert (await ops.check(ctx, settled=True))["ok"]
