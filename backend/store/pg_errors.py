"""The PostgreSQL store's doors to the operator: its URL shown without a password, the server's
version checked, and every psycopg error as one line with its SQLSTATE.

* `display_url` hides the password however the URL carries it (`backend.core.redact`);
  `check_url` refuses a URL libpq cannot parse (a bare `%` in a password) in one line that
  does not quote it.
* `refuse_old_server`: rem needs PostgreSQL 14 or newer (`MIN_SERVER_VERSION`); an older
  server is refused on connecting, in one line naming both versions.
* `translate_postgres_error` maps *every* psycopg error to a one-line `RemError` with its
  SQLSTATE and the password removed, and `postgres_errors` raises it `from None`, so no
  traceback of the driver's (which may quote the URL) is chained to it.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import parse_qsl, urlsplit

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict

from backend.core.errors import (
    BadInput,
    DatabaseFull,
    DatabaseLocked,
    DatabaseRefused,
    DatabaseTooOld,
    DatabaseUnreachable,
    DataDirError,
    LeaseLost,
    ReadOnly,
    RemError,
)
from backend.core.redact import HIDDEN, redact_text, redact_url, url_secrets
from backend.core.settings import settings

SCHEMES = ("postgresql://", "postgres://")


def check_url(url: str) -> None:
    """Refuse, in one line without its password, a URL libpq cannot parse (a bare `%` in a password)."""
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        reason = _first_line(exc, url)
        for secret in url_secrets(url):  # libpq quotes the token it could not parse, however short
            reason = reason.replace(f'"{secret}"', f'"{HIDDEN}"')
        raise BadInput(
            f"--db / REM_DB_URL {display_url(url)!r} is not a valid PostgreSQL URL ({reason}); "
            "percent-encode the special characters of a password (% as %25, @ as %40, / as %2F)"
        ) from None


def is_postgres_url(url: str | None) -> bool:
    return bool(url) and str(url).startswith(SCHEMES)


def display_url(url: str) -> str:
    """The URL without its password (user info or `password=`), for messages and logs."""
    return redact_url(url)


def store_label(url: str) -> str:
    """`postgresql://user@host:port/db`: which store, for a header; no password, no other parameters.

    A host or port given as a query parameter (a socket directory) is shown in its place.
    """
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    host = parts.hostname or query.get("host", "")
    port = parts.port or query.get("port")
    user = f"{parts.username}@" if parts.username else ""
    where = f"{host}:{port}" if port else host
    return f"{parts.scheme}://{user}{where}{parts.path}"


# the oldest PostgreSQL rem runs on (`server_version_num`): 14 (CREATE OR REPLACE TRIGGER, the
# oldest major still supported upstream when this was written); tests run 15 and 18
MIN_SERVER_VERSION = 140000


def server_version_text(number: int) -> str:
    """`server_version_num` as people write it: 150018 -> 15.18 (9.6.24 before 10)."""
    major = number // 10000
    return (
        f"{major}.{number % 10000}"
        if major >= 10
        else f"{number // 10000}.{number // 100 % 100}.{number % 100}"
    )


def refuse_old_server(version: int, url: str) -> None:
    """Refuse a server older than `MIN_SERVER_VERSION` in one line naming the minimum."""
    if version < MIN_SERVER_VERSION:
        raise DatabaseTooOld(
            f"{display_url(url)} runs PostgreSQL {server_version_text(version)}; rem needs PostgreSQL "
            f"{MIN_SERVER_VERSION // 10000} or newer: upgrade the server, or point --db at a newer one"
        )


# -- errors ----------------------------------------------------------------------
# rem's own SQLSTATE: a fenced write sent unread (`backend.store.db.fenced_write(unread=True)`) changed no
# row; raised by `rem_fenced` (schema_pg), translated back to `LeaseLost` with its message
FENCE_SQLSTATE = "RL001"
CONNECTION_SQLSTATES = ("08", "57P01", "57P02", "57P03")


# what a connection that was never made reports: libpq gives no SQLSTATE for it, and 08001
# (sqlclient_unable_to_establish_sqlconnection) is the standard's code, as pgjdbc reports it
NO_CONNECTION_SQLSTATE = "08001"


def _first_line(exc: BaseException, url: str) -> str:
    """The error's first line, with the URL's passwords removed (a driver may quote the URL)."""
    text = str(exc).strip()
    return redact_text(text.splitlines()[0] if text else type(exc).__name__, url)


def translate_postgres_error(exc: psycopg.Error, url: str) -> RemError:
    """Every psycopg error as the one-line RemError an operator can act on, with its SQLSTATE and
    no password (`url` may be the full URL or its display form)."""
    where = display_url(url)
    state = exc.sqlstate or ""
    connecting = not state and isinstance(exc, psycopg.OperationalError)
    code = f"SQLSTATE {state or (NO_CONNECTION_SQLSTATE if connecting else 'none')}"
    if state == FENCE_SQLSTATE:  # a fenced write sent unread changed no row: its own message
        return LeaseLost(exc.diag.message_primary or str(exc))
    if isinstance(exc, psycopg.errors.SerializationFailure | psycopg.errors.DeadlockDetected):
        return DatabaseLocked(
            f"{where}: a concurrent transaction conflicted with this one ({code}); "
            "nothing of it was written; retry"
        )
    if isinstance(exc, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled):
        return DatabaseLocked(
            f"{where}: a row lock stayed held by another transaction for more than "
            f"{settings.busy_timeout_ms / 1000:g} s ({code}); retry, or find the holder in pg_stat_activity"
        )
    if isinstance(exc, psycopg.errors.DiskFull):
        return DatabaseFull(
            f"{where}: the database server is out of disk space ({code}); free space, then retry"
        )
    if state == "26000" and "rem_" in str(exc):  # a statement this connection prepared is gone
        return DatabaseRefused(
            f"{where}: the server no longer knows a statement rem prepared on this connection ({code}): "
            "is --db a transaction-mode pooler such as PgBouncer? set REM_DB_POOLED=1 (and REM_DB_LISTEN_URL "
            "to a direct connection for LISTEN)",
            state,
        )
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return ReadOnly(f"{where} is opened read-only ({code}); this action needs a writable rem")
    detail = _first_line(exc, url)
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return DataDirError(
            f"{where}: permission denied ({detail}; {code}); grant rem's role access, or use another --db"
        )
    if state.startswith(CONNECTION_SQLSTATES) or connecting:
        return DatabaseUnreachable(
            f"cannot reach the state store at {where} ({detail}; {code}); "
            "check --db / REM_DB_URL and that the server is up"
        )
    who = "server" if state else "client"  # no SQLSTATE: psycopg itself refused it, before sending
    return DatabaseRefused(f"{where}: the database {who} refused a statement ({detail}; {code})", state)


class postgres_errors:
    """Raise a psycopg error from inside as the one-line RemError for `url` (others unchanged)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> Literal[False]:
        if isinstance(exc, psycopg.Error):
            # `from None`: a traceback of the translated error must not print psycopg's (its
            # message may quote the URL, password included)
            raise translate_postgres_error(exc, self.url) from None
        return False
