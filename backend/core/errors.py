"""One exception tree for rem, and its mapping to process exit codes."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # a refused action or a failed check
    USAGE = 2  # bad usage or bad input
    UNREACHABLE = 3  # a dependency (Chroma, the database) is unreachable
    INTERRUPTED = 130


class RemError(Exception):
    """Base of every error rem reports to a user: one line, naming the fix."""

    exit_code: ExitCode = ExitCode.FAILED


class UsageError(RemError):
    exit_code = ExitCode.USAGE


class BadInput(UsageError):
    """Input that rem refuses before writing anything."""


class InputConflict(BadInput):
    """An input id already taken by another input (another session, text or delivery) or a message."""


class DataDirError(UsageError):
    """The data directory is unusable (a file, unwritable, ...)."""


class SchemaTooNew(RemError):
    """state.db was written by a newer rem."""


class SchemaTooOld(RemError):
    """state.db has an older schema and this open may not migrate it (read-only)."""


class DatabaseCorrupt(RemError):
    """state.db is not a readable SQLite database."""


class DatabaseLocked(RemError):
    exit_code = ExitCode.UNREACHABLE


class DatabaseUnreachable(RemError):
    """The PostgreSQL state store cannot be reached (down, wrong URL, connection lost)."""

    exit_code = ExitCode.UNREACHABLE


class DatabaseFull(RemError):
    exit_code = ExitCode.UNREACHABLE


class DatabaseIOError(RemError):
    """The disk under state.db failed a read or write (not a sign of corruption by itself)."""

    exit_code = ExitCode.UNREACHABLE


class DatabaseRefused(RemError):
    """The PostgreSQL server refused a statement for a reason with no more specific class (its SQLSTATE says)."""

    def __init__(self, message: str, sqlstate: str = "") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class DatabaseTooOld(DataDirError):
    """The PostgreSQL server is older than rem supports."""


class ChromaUnreachable(RemError):
    exit_code = ExitCode.UNREACHABLE


class ChromaStartFailed(ChromaUnreachable):
    pass


class ChromaUntrusted(ChromaUnreachable):
    """What listens where the data dir's Chroma server was is not it (another uid, or not its server).

    Carries what a journal row and the console need: the URL and who listens there.
    """

    def __init__(
        self, message: str, *, url: str | None = None, uids: tuple[int, ...] = (), pids: tuple[int, ...] = ()
    ) -> None:
        super().__init__(message)
        self.url = url
        self.uids = uids
        self.pids = pids

    def __reduce__(self) -> tuple[object, ...]:  # keep the fields across pickling (check workers)
        return (_untrusted, (str(self), self.url, self.uids, self.pids))


def _untrusted(
    message: str, url: str | None, uids: tuple[int, ...], pids: tuple[int, ...]
) -> ChromaUntrusted:
    return ChromaUntrusted(message, url=url, uids=uids, pids=pids)


class ChromaBadReply(ChromaUnreachable):
    """Chroma answered, but not with what its API returns (a malformed or foreign reply)."""


class ChromaNotReady(ChromaUnreachable):
    """Chroma answers but cannot read a collection's vectors yet (its index is not loaded)."""


class EmbedderMismatch(ChromaUnreachable):
    """A Chroma collection holding another embedder's vectors: unusable until `rem reindex`.

    A ChromaUnreachable, so a daemon waits it out with backoff (a reindex swaps
    the collection under it) instead of dying; the CLI exits 1, not 3.
    """

    exit_code = ExitCode.FAILED


class NotChroma(ChromaUnreachable):
    """A URL that answers, but not as a Chroma server: a configuration mistake."""

    exit_code = ExitCode.USAGE


class ServerUnreachable(RemError):
    """The `rem serve` a command was pointed at (`--server`, REM_SERVER) does not answer, or not as
    itself: down, the wrong address, a proxy without it behind, or draining."""

    exit_code = ExitCode.UNREACHABLE


class NotFound(RemError):
    """An id that names nothing."""


class SessionNotFound(NotFound):
    pass


class WorkerNotFound(NotFound):
    pass


class LeaseNotFound(NotFound):
    pass


class Refused(RemError):
    """An operator action whose preconditions do not hold right now."""


class ReadOnly(Refused):
    """An action attempted from a read-only context."""


class OutOfReach(Refused):
    """A project the caller may not use (an API token's projects, `rem mcp --project`)."""


class LeaseLost(RemError):
    """A fenced write changed 0 rows: another owner holds the lease now."""


class ReceiptError(RemError):
    pass


class ReceiptCorrupt(ReceiptError):
    """A receipt envelope that cannot be decoded."""


class UndeclaredReceiptKey(ReceiptError):
    """Synthesis tried to issue a receipt with a key it does not own."""


class ReceiptIncomplete(ReceiptError):
    """A receipt without a required key, or with a value Chroma cannot store."""


class ReceiptNotFound(NotFound):
    """A summary id with no staged receipt."""


class FaultInjected(RemError):
    """Raised by a fault point configured to raise rather than kill."""
