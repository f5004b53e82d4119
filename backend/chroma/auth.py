"""Chroma token auth, kept ready: the client sends the token, the server rem starts is told it.

`REM_CHROMA_TOKEN_FILE` names a private file holding one token. Every
client rem makes then sends it (`Authorization: Bearer <token>`, chromadb's
`TokenAuthClientProvider`), and the server rem starts runs from a config
file that names it. Chroma 1.5.9's server ignores token auth (an
unauthenticated create-collection still succeeds; tests/reliability/
test_chroma_auth.py probes exactly that and runs for real once a release
enforces it), so today the server is protected by what the README lists:
the same-uid listener check, loopback only, and a private data dir.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from backend.core import private
from backend.core.errors import UsageError
from backend.core.settings import settings

CLIENT_PROVIDER = "chromadb.auth.token_authn.TokenAuthClientProvider"
SERVER_PROVIDER = "chromadb.auth.token_authn.TokenAuthenticationServerProvider"
CONFIG_NAME = "chroma.yaml"


def token_file() -> Path | None:
    return settings.chroma_token_file


def read_token() -> str | None:
    """The token from `REM_CHROMA_TOKEN_FILE` (None when unset); the file must be private to this user."""
    path = token_file()
    if path is None:
        return None
    try:
        st = path.stat()
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"REM_CHROMA_TOKEN_FILE={path} cannot be read ({exc}); fix it or unset it") from None
    if not private.private_to_owner(st):
        raise UsageError(
            f"REM_CHROMA_TOKEN_FILE={path} must be yours and private (mode 600); `chmod 600 {path}`"
        )
    if not text or not text.isprintable() or " " in text:
        raise UsageError(f"REM_CHROMA_TOKEN_FILE={path} must hold one token (printable, no spaces)")
    return text


def client_settings() -> dict[str, Any]:
    """Extra chromadb client `Settings` for token auth (empty when no token is configured)."""
    token = read_token()
    if token is None:
        return {}
    return {"chroma_client_auth_provider": CLIENT_PROVIDER, "chroma_client_auth_credentials": token}


def server_config(persist_path: Path, port: int, config_dir: Path) -> Path | None:
    """A private config file for `chroma run` naming the token (None when no token is configured).

    `chroma run CONFIG` takes the address, port and path from the file too.
    The auth keys are the server settings chromadb documents; 1.5.9 accepts
    and ignores them.
    """
    path = token_file()
    if path is None or read_token() is None:
        return None
    values = {
        "port": port,
        "listen_address": "127.0.0.1",
        "persist_path": str(persist_path),
        "chroma_server_authn_provider": SERVER_PROVIDER,
        "chroma_server_authn_credentials_file": str(path),
    }
    config = config_dir / CONFIG_NAME
    # JSON scalars are YAML scalars: one `key: value` line each
    private.write_private_text(config, "".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items()))
    return config


def server_env() -> dict[str, str]:
    """The same settings as environment variables, for a server that reads those instead."""
    path = token_file()
    if path is None:
        return {}
    return {
        "CHROMA_SERVER_AUTHN_PROVIDER": SERVER_PROVIDER,
        "CHROMA_SERVER_AUTHN_CREDENTIALS_FILE": str(path),
    }
