"""Turn vectors as Chroma holds them, compared with what state.db says was written, and repaired.

state.db marks a turn's vector written (`memory_turn.vector_digest = digest`)
only after Chroma took it (`backend.memory.index.flush_vectors`), and keeps a
record of the row it wrote (`vector_sketch`, below). Chroma can still lose
or change rows behind rem's back: a new volume, a restore, another server on
the URL, a hand edit. So the marks are checked against Chroma:

* by Dream (`VectorSweep`): at start, after every Chroma restart this process
  sees, and every `REM_TURN_VECTOR_SWEEP_MS`, one batch of marked rows a
  pass. A row whose vector is missing, or whose digest, document or vector
  differs, is un-marked (a compare-and-swap on the digest it was marked for:
  a row rewritten meanwhile is left alone) with a `memory.vectors_repaired`
  row in the same transaction; the next flush writes it again (an idempotent
  upsert) and marks it. While that runs, `rem check` lists it as in flight
  (`turn vectors not written to Chroma yet`);
* by `rem check` (`compare`, all of them): a marked row Chroma lacks or holds
  otherwise is a violation.

The record (`sketch`): SHA-256 of the document, and the vector's norm and
its projections on 8 fixed ±1 directions. Not a hash of the vector: Chroma
hands a vector back up to 2 float32 ulps from the one written (see
`backend.summaries.receipts.embedding_digest`), which moves a projection by
about 1e-7 of the norm, while another text's vector moves it by a sizeable
fraction: `SKETCH_TOLERANCE` sits between. About 70 bytes a turn.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from backend.chroma.collection import ChromaStore, LiveRow
from backend.core import clock
from backend.core.errors import ChromaUnreachable
from backend.store.db import Database, execute
from backend.store.events import EventKind, append_event

log = logging.getLogger("rem.turn_vectors")

SKETCH_PREFIX = "k1:"
PROJECTIONS = 8
SKETCH_TOLERANCE = 1e-4  # of the vector's norm
SWEEP_BATCH = 500
MAX_BACKOFF_MS = 30_000
TurnStores = Callable[[str], ChromaStore]

MARKED_SQL = """
SELECT id, project, session_id, message_id, digest, vector_sketch FROM memory_turn
WHERE id > :after AND vector_digest = digest ORDER BY id LIMIT :n
"""
MARKED_AGAIN_SQL = """
SELECT id, project, session_id, message_id, digest, vector_sketch FROM memory_turn
WHERE id = ? AND vector_digest = digest
"""
# fenced on what was checked: a row re-indexed (new digest) or re-marked meanwhile is left alone
UNMARK_SQL = (
    "UPDATE memory_turn SET vector_digest = NULL WHERE id = ? AND digest = ? AND vector_digest = digest"
)


@lru_cache(maxsize=4)
def _directions(dim: int) -> Any:
    """PROJECTIONS fixed directions of ±1/sqrt(dim), from SHA-256 (the same on every host and version)."""
    import numpy  # import time: numpy, only where vectors are compared

    rows = []
    for i in range(PROJECTIONS):
        bits = b"".join(
            hashlib.sha256(f"rem-turn-sketch:{i}:{block}".encode()).digest()
            for block in range(-(-dim // 256))
        )
        signs = numpy.unpackbits(numpy.frombuffer(bits, dtype=numpy.uint8))[:dim]
        rows.append(numpy.where(signs == 1, 1.0, -1.0))
    return numpy.asarray(rows) / numpy.sqrt(dim)


def _shape(vector: Any) -> tuple[float, list[float]]:
    import numpy  # import time: numpy, only where vectors are compared

    values = numpy.asarray(vector, dtype=numpy.float32).astype(numpy.float64)
    return float(numpy.linalg.norm(values)), [float(x) for x in _directions(values.size) @ values]


def _document_hash(document: str | None) -> str:
    return hashlib.sha256((document or "").encode("utf-8", "surrogatepass")).hexdigest()[:16]


def sketch(document: str, vector: Sequence[float]) -> str:
    """The record of a turn row as written: `k1:` + its document's hash + its vector's shape."""
    norm, projections = _shape(vector)
    packed = struct.pack(f"<{PROJECTIONS + 1}f", norm, *projections)
    return f"{SKETCH_PREFIX}{_document_hash(document)}:{base64.b64encode(packed).decode('ascii')}"


def sketch_problem(recorded: str | None, document: str | None, vector: Any) -> str | None:
    """What differs between a live row and its record ("document", "vector"); None when they agree
    (or when there is no record: rows written before v9 are compared by digest alone)."""
    if not recorded or not recorded.startswith(SKETCH_PREFIX):
        return None
    doc_hash, _, packed = recorded[len(SKETCH_PREFIX) :].partition(":")
    if _document_hash(document) != doc_hash:
        return "document"
    try:
        norm, *projections = struct.unpack(f"<{PROJECTIONS + 1}f", base64.b64decode(packed))
        live_norm, live = _shape(vector)
    except (ValueError, struct.error):
        return "vector"
    tolerance = SKETCH_TOLERANCE * max(norm, 1e-6)
    if abs(live_norm - norm) > tolerance or any(
        abs(a - b) > tolerance for a, b in zip(live, projections, strict=True)
    ):
        return "vector"
    return None


@dataclass(frozen=True)
class MarkedTurn:
    """A memory_turn row whose vector state.db marks as written."""

    id: int
    project: str
    session_id: str
    message_id: str
    digest: str
    sketch: str | None


def problem(row: MarkedTurn, live: LiveRow | None) -> str | None:
    """Why Chroma's row is not the one state.db marks written ("missing", "digest", "document", "vector")."""
    if live is None:
        return "missing"
    if live.metadata.get("digest") != row.digest:
        return "digest"
    return sketch_problem(row.sketch, live.document, live.embedding)


async def marked_batch(db: Database, after: int, n: int = SWEEP_BATCH) -> list[MarkedTurn]:
    """The next `n` marked rows after id `after`, in id order."""
    rows = await db.fetchall(MARKED_SQL, {"after": after, "n": n})
    return [MarkedTurn(int(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), r[5]) for r in rows]


async def marked_again(db: Database, rows: Sequence[MarkedTurn]) -> list[MarkedTurn]:
    """Those of `rows` still marked written, as state.db holds them now (digest and record)."""
    again = []
    for row in rows:
        found = await db.fetchall(MARKED_AGAIN_SQL, (row.id,))
        again += [MarkedTurn(int(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), r[5]) for r in found]
    return again


async def compare(rows: Sequence[MarkedTurn], turn_stores: TurnStores) -> list[tuple[MarkedTurn, str]]:
    """The rows Chroma lacks or holds otherwise, each with its problem (one read per project)."""
    by_project: dict[str, list[MarkedTurn]] = {}
    for row in rows:
        by_project.setdefault(row.project, []).append(row)
    found = []
    for project, group in sorted(by_project.items()):
        live = await turn_stores(project).rows([r.message_id for r in group])
        found += [(r, why) for r in group if (why := problem(r, live.get(r.message_id))) is not None]
    return found


def _summary(found: Sequence[tuple[MarkedTurn, str]]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for _, why in found:
        counts[why] = counts.get(why, 0) + 1
    sessions = sorted({r.session_id for r, _ in found})
    return {"rows": len(found), "problems": counts, "sessions": sessions[:20], "session_count": len(sessions)}


async def unmark(db: Database, found: Sequence[tuple[MarkedTurn, str]], actor: str) -> int:
    """Mark these rows' vectors pending again (fenced per row), journaled in the same transaction."""
    if not found:
        return 0
    unmarked = 0
    async with db.tx() as conn:
        for row, _ in found:
            unmarked += max(0, await execute(conn, UNMARK_SQL, (row.id, row.digest)))
        if unmarked:
            await append_event(
                conn,
                kind=EventKind.MEMORY_VECTORS_REPAIRED,
                actor=actor,
                target="turn_vectors",
                data={**_summary(found), "unmarked": unmarked},
            )
    return unmarked


class VectorSweep:
    """Dream's walk over the marked turn vectors: one batch a pass, from the start when due.

    Due at start, every `interval_ms` after the last sweep ended, and whenever the
    caller's Chroma generation moved (a restarted server may have lost what the old one
    held). Backs off while Chroma is unreachable (the error is raised to the caller).
    """

    def __init__(self, interval_ms: int, batch: int = SWEEP_BATCH) -> None:
        self.interval_ms = interval_ms
        self.batch = batch
        self.cursor: int | None = 0  # None: no sweep in progress
        self.next_at = 0
        self.generation: int | None = None  # the Chroma generation the last batch ran on
        self._retry_at = 0
        self._backoff_ms = 500

    def restart(self) -> None:
        """Sweep from the first row now."""
        self.cursor = 0

    def _follow_generation(self, generation: int, actor: str) -> None:
        """A restarted Chroma (a new `generation`) may have lost vectors: sweep again from the start."""
        if self.generation is not None and generation != self.generation:
            log.info("%s: Chroma restarted; checking every turn vector again", actor)
            self.restart()
        self.generation = generation

    async def _compare(
        self, rows: list[MarkedTurn], turn_stores: TurnStores, now: int
    ) -> list[tuple[MarkedTurn, str]]:
        """`compare(rows)`, backing off (doubling, up to `MAX_BACKOFF_MS`) while Chroma cannot be reached."""
        try:
            found = await compare(rows, turn_stores)
        except ChromaUnreachable:
            self._retry_at = now + self._backoff_ms
            self._backoff_ms = min(self._backoff_ms * 2, MAX_BACKOFF_MS)
            raise
        self._backoff_ms = 500
        return found

    async def step(self, db: Database, turn_stores: TurnStores, actor: str, generation: int = 0) -> int:
        """Check the next batch if a sweep is due or under way; how many rows were un-marked."""
        now = clock.now_ms()
        self._follow_generation(generation, actor)
        if now < self._retry_at or (self.cursor is None and now < self.next_at):
            return 0
        rows = await marked_batch(db, self.cursor or 0, self.batch)
        if not rows:
            self.cursor, self.next_at = None, now + self.interval_ms
            return 0
        found = await self._compare(rows, turn_stores, now)
        unmarked = await unmark(db, found, actor)
        self.cursor = rows[-1].id
        if unmarked:
            log.warning(
                "%s: %d turn vector(s) missing or changed in Chroma: %s; writing them again",
                actor,
                unmarked,
                _summary(found)["problems"],
            )
        return unmarked
