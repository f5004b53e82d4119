"""Where the model endpoint is and how to talk to it: the model settings (`backend.core.settings`,
where each is declared with its default) as one value, with the API key read and guarded.

The API key comes from `REM_MODEL_API_KEY_FILE` (a file only its owner can
read: mode 0600 or stricter, else refused) or, accepted but second best,
`REM_MODEL_API_KEY`. The key is held only here, is never part of a repr, a
log line, an error message or a journal row, and is scrubbed from any error
text an endpoint sends back: every run of 8 characters of it, not just the
whole key. A base URL with `user:password@` is refused when the settings are
read, and again here for a config built another way. A local server that needs no key gets a
placeholder (the SDK refuses to run without one).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from backend.core.errors import UsageError
from backend.core.redact import has_credentials, redact_url, scrub_runs
from backend.core.settings import settings

NO_KEY = "no-key-configured"


class ModelConfigError(UsageError):
    """A model setting rem cannot use (a missing model name, a key file others can read)."""


def read_key_file(path: Path) -> str:
    """The key in `path`, refused unless only its owner can read it."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ModelConfigError(
            f"REM_MODEL_API_KEY_FILE={str(path)!r} cannot be read ({exc.strerror}); check the path"
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ModelConfigError(
            f"REM_MODEL_API_KEY_FILE={str(path)!r} is readable by others (mode {stat.S_IMODE(mode):o}); "
            f"run `chmod 600 {path}`"
        )
    if not text:
        raise ModelConfigError(f"REM_MODEL_API_KEY_FILE={str(path)!r} is empty; put the API key in it")
    return text


def endpoint_label(base_url: str) -> str:
    """The endpoint as shown and recorded: host, port and path, never credentials or a query."""
    parts = urlsplit(base_url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{host}{port}{parts.path.rstrip('/')}"


@dataclass(frozen=True)
class ModelConfig:
    """One process's view of the model endpoint."""

    base_url: str
    model: str | None
    embedding_model: str | None
    connect_timeout_s: float
    read_timeout_s: float
    request_timeout_s: float
    concurrency: int
    retries: int
    retry_max_s: float
    api_key: str = field(default=NO_KEY, repr=False)

    def __post_init__(self) -> None:
        # the SDK would send `user:password@` nowhere useful and fail every request as
        # `bad_response`; refused once, here, naming where a key goes
        if has_credentials(self.base_url):
            raise ModelConfigError(
                f"the model base URL {redact_url(self.base_url)!r} carries credentials (user:password@); "
                "remove them and put the key in REM_MODEL_API_KEY_FILE"
            )

    @classmethod
    def from_settings(cls) -> ModelConfig:
        key_file = settings.model_api_key_file
        key = read_key_file(key_file) if key_file is not None else settings.model_api_key
        return cls(
            base_url=settings.model_base_url,
            model=settings.model,
            embedding_model=settings.embedding_model,
            connect_timeout_s=settings.model_connect_timeout_ms / 1000,
            read_timeout_s=settings.model_read_timeout_ms / 1000,
            request_timeout_s=settings.model_request_timeout_ms / 1000,
            concurrency=settings.model_concurrency,
            retries=settings.model_retries,
            retry_max_s=settings.model_retry_max_ms / 1000,
            api_key=key or NO_KEY,
        )

    @property
    def endpoint(self) -> str:
        return endpoint_label(self.base_url)

    def require_model(self, what: str) -> str:
        if not self.model:
            raise ModelConfigError(
                f"{what} needs REM_MODEL (the chat model to ask); set it, e.g. gpt-4o-mini"
            )
        return self.model

    def require_embedding_model(self) -> str:
        if not self.embedding_model:
            raise ModelConfigError(
                "REM_EMBEDDER=openai needs REM_EMBEDDING_MODEL; set it, e.g. text-embedding-3-small"
            )
        return self.embedding_model

    def scrub(self, text: str) -> str:
        """`text` with every run of 8 or more characters of the API key removed, for errors and logs
        (an endpoint that echoes the key with its end starred must not leave the rest readable)."""
        return text if self.api_key == NO_KEY else scrub_runs(text, self.api_key)
