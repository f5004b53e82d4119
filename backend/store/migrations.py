"""rem's forward migrations: one SQLite script per schema version, the source of both engines' schemas.

`MIGRATIONS[i]` brings a state.db from `PRAGMA user_version` i to i + 1
(`backend.store.schema` applies them). Tables, columns, defaults, CHECKs and
index names of the session tables follow opencode's (its
packages/core/src/session/sql.ts); the rest are rem's. Times are INTEGER Unix
times in ms, always supplied by Python. PostgreSQL's migrations are these
scripts translated statement by statement (`backend.store.schema_pg`), so
this module imports neither schema module: both import it.
"""

from __future__ import annotations

import sqlite3

from backend.store import api_schema, counters

V1 = """
CREATE TABLE session (
    id               TEXT PRIMARY KEY,
    parent_id        TEXT REFERENCES session(id) ON DELETE SET NULL,
    directory        TEXT NOT NULL DEFAULT '',
    title            TEXT NOT NULL DEFAULT '',
    version          TEXT NOT NULL DEFAULT '',
    metadata         TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
    agent            TEXT,
    model            TEXT,
    cost             REAL NOT NULL DEFAULT 0,
    tokens_input     INTEGER NOT NULL DEFAULT 0,
    tokens_output    INTEGER NOT NULL DEFAULT 0,
    tokens_reasoning INTEGER NOT NULL DEFAULT 0,
    tokens_cache_read  INTEGER NOT NULL DEFAULT 0,
    tokens_cache_write INTEGER NOT NULL DEFAULT 0,
    message_count    INTEGER NOT NULL DEFAULT 0,
    input_count      INTEGER NOT NULL DEFAULT 0,
    turn_count       INTEGER NOT NULL DEFAULT 0,
    -- the per-session sequence: admitted_seq, promoted_seq and message seq draw from it
    last_seq         INTEGER NOT NULL DEFAULT 0,
    -- the execution-lease fencing epoch; grows on every grant, survives row deletion
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    time_created     INTEGER NOT NULL,
    time_updated     INTEGER NOT NULL,
    time_compacting  INTEGER,
    time_archived    INTEGER
);
CREATE INDEX session_parent_idx ON session(parent_id);
CREATE INDEX session_time_updated_idx ON session(time_updated);

CREATE TABLE session_message (
    id           TEXT PRIMARY KEY,
    session_id   TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
    type         TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    time_created INTEGER NOT NULL,
    time_updated INTEGER NOT NULL,
    data         TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data))
);
CREATE UNIQUE INDEX session_message_session_seq_idx ON session_message(session_id, seq);
CREATE INDEX session_message_session_type_seq_idx ON session_message(session_id, type, seq);
CREATE INDEX session_message_session_time_created_id_idx
    ON session_message(session_id, time_created, id);
CREATE INDEX session_message_time_created_idx ON session_message(time_created);
-- incomplete assistant rows, so "a newer turn supersedes stale incomplete rows" is O(open rows)
CREATE INDEX session_message_open_assistant_idx ON session_message(session_id)
    WHERE type = 'assistant' AND json_extract(data, '$.status') = 'streaming';

-- the parts of a message (streamed text, tool calls), in order
CREATE TABLE session_part (
    id           TEXT PRIMARY KEY,
    message_id   TEXT NOT NULL REFERENCES session_message(id) ON DELETE CASCADE,
    session_id   TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
    idx          INTEGER NOT NULL,
    type         TEXT NOT NULL,
    time_created INTEGER NOT NULL,
    data         TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data))
);
CREATE UNIQUE INDEX session_part_message_idx_idx ON session_part(message_id, idx);
CREATE INDEX session_part_session_idx ON session_part(session_id);

CREATE TABLE session_input (
    -- the id the promoted `user` message will carry (a SessionMessage id)
    id            TEXT PRIMARY KEY,
    session_id    TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
    prompt        TEXT NOT NULL CHECK (json_valid(prompt)),
    delivery      TEXT NOT NULL CHECK (delivery IN ('steer', 'queue')),
    admitted_seq  INTEGER NOT NULL,
    promoted_seq  INTEGER,
    wake_pending  INTEGER NOT NULL DEFAULT 0,
    wake_attempts INTEGER NOT NULL DEFAULT 0,
    time_created  INTEGER NOT NULL
);
CREATE UNIQUE INDEX session_input_session_admitted_seq_idx
    ON session_input(session_id, admitted_seq);
CREATE UNIQUE INDEX session_input_session_promoted_seq_idx
    ON session_input(session_id, promoted_seq);
CREATE INDEX session_input_session_promoted_delivery_admitted_idx
    ON session_input(session_id, promoted_seq, delivery, admitted_seq);
CREATE INDEX session_input_wake_pending_promoted_attempts_created_id_idx
    ON session_input(wake_pending, promoted_seq, wake_attempts, time_created, id);

CREATE TABLE session_execution (
    id                   TEXT PRIMARY KEY,
    session_id           TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
    owner_id             TEXT NOT NULL,
    -- fencing epoch: every lease-dependent write names (owner_id, epoch)
    epoch                INTEGER NOT NULL,
    assistant_message_id TEXT,
    phase                TEXT NOT NULL,
    step                 INTEGER NOT NULL DEFAULT 0,
    time_created         INTEGER NOT NULL,
    time_renewed         INTEGER NOT NULL,
    expires_at           INTEGER NOT NULL,
    recovery_error       TEXT,
    CONSTRAINT session_execution_phase_check
        CHECK (phase IN ('ready', 'safe', 'unknown', 'continue'))
);
CREATE UNIQUE INDEX session_execution_session_idx ON session_execution(session_id);
CREATE INDEX session_execution_owner_idx ON session_execution(owner_id);
CREATE INDEX session_execution_expires_idx ON session_execution(expires_at);

CREATE TABLE session_recovery (
    execution_id            TEXT PRIMARY KEY,
    session_id              TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
    assistant_message_id    TEXT REFERENCES session_message(id) ON DELETE CASCADE,
    continuation_message_id TEXT NOT NULL REFERENCES session_message(id) ON DELETE CASCADE,
    phase                   TEXT NOT NULL CHECK (phase IN ('ready', 'unknown', 'continue')),
    wake_pending            INTEGER NOT NULL DEFAULT 1,
    wake_attempts           INTEGER NOT NULL DEFAULT 0,
    recovery_error          TEXT,
    time_created            INTEGER NOT NULL
);
CREATE UNIQUE INDEX session_recovery_continuation_message_idx
    ON session_recovery(continuation_message_id);
CREATE INDEX session_recovery_session_idx ON session_recovery(session_id);
CREATE INDEX session_recovery_wake_pending_error_attempts_created_execution_idx
    ON session_recovery(wake_pending, recovery_error, wake_attempts, time_created, execution_id);

CREATE TABLE session_context_epoch (
    session_id   TEXT PRIMARY KEY REFERENCES session(id) ON DELETE CASCADE,
    baseline     TEXT NOT NULL,
    snapshot     TEXT NOT NULL CHECK (json_valid(snapshot)),
    baseline_seq INTEGER NOT NULL,
    time_updated INTEGER NOT NULL
);

CREATE TABLE summary_job (
    session_id              TEXT PRIMARY KEY REFERENCES session(id) ON DELETE CASCADE,
    status                  TEXT NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'in_progress', 'completed', 'failed')),
    owner_id                TEXT,
    epoch                   INTEGER NOT NULL DEFAULT 0,
    lease_expires_at        INTEGER,
    attempts                INTEGER NOT NULL DEFAULT 0,
    last_error              TEXT,
    -- the dream input revision the running / staged synthesis was made from
    input_revision          TEXT,
    -- the input revision of the last completed synthesis (drift = raw != this)
    summarized_revision     TEXT,
    -- drift queue: the executor bumps dirty_seq in the same transaction as every
    -- raw-turn change; the summarizer sets clean_seq to the dirty_seq it read
    dirty_seq               INTEGER NOT NULL DEFAULT 0,
    clean_seq               INTEGER NOT NULL DEFAULT 0,
    result_envelope         BLOB,
    result_encoding         TEXT,
    result_staged_at        INTEGER,
    result_acknowledged_at  INTEGER,
    result_last_replayed_at INTEGER,
    quarantined_at          INTEGER,
    quarantine_reason       TEXT,
    -- latest verification verdict: present, missing, document_differs,
    -- keys_differ, quarantined (NULL: never checked)
    verdict                 TEXT,
    verdict_detail          TEXT CHECK (verdict_detail IS NULL OR json_valid(verdict_detail)),
    verdict_checked_at      INTEGER,
    time_created            INTEGER NOT NULL,
    time_updated            INTEGER NOT NULL
);
CREATE INDEX summary_job_status_updated_idx ON summary_job(status, time_updated);
CREATE INDEX summary_job_drift_idx ON summary_job(time_updated, session_id)
    WHERE dirty_seq > clean_seq;
CREATE INDEX summary_job_lease_idx ON summary_job(lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;
CREATE INDEX summary_job_verdict_idx ON summary_job(verdict, verdict_checked_at);
CREATE INDEX summary_job_staged_idx ON summary_job(result_staged_at)
    WHERE result_staged_at IS NOT NULL;
-- receipt recovery: staged receipts never acknowledged (their summarizer died)
CREATE INDEX summary_job_unacked_idx ON summary_job(result_staged_at, session_id)
    WHERE result_staged_at IS NOT NULL AND result_acknowledged_at IS NULL AND quarantined_at IS NULL;

CREATE TABLE dream_state (
    session_id         TEXT PRIMARY KEY REFERENCES session(id) ON DELETE CASCADE,
    -- published by synthesis (backend.store.handoffs.publish_input_revision)
    input_revision     TEXT,
    -- the exact revision Dream last attested (may lag input_revision: pending)
    completed_revision TEXT,
    -- grows on every publication and every Dream transition; the Chroma overlay carries it
    state_revision     INTEGER NOT NULL DEFAULT 0,
    digest_state       TEXT NOT NULL DEFAULT 'pending'
        CHECK (digest_state IN ('pending', 'in_progress', 'digested', 'deferred',
                                'undigestible', 'legacy')),
    -- failed digestions of attempts_revision (reset when a new revision is published)
    digest_attempts    INTEGER NOT NULL DEFAULT 0,
    attempts_revision  TEXT,
    defer_reason       TEXT,
    -- not before: 0 = ready since time_published; else retry/lease-expiry time
    next_attempt_at    INTEGER NOT NULL DEFAULT 0,
    owner_id           TEXT,
    epoch              INTEGER NOT NULL DEFAULT 0,
    lease_expires_at   INTEGER,
    legacy_digested    INTEGER NOT NULL DEFAULT 0,
    -- 1 while the Chroma overlay (Dream-owned keys) lags this row
    overlay_pending    INTEGER NOT NULL DEFAULT 0,
    overlay_retry_at   INTEGER NOT NULL DEFAULT 0,
    time_published     INTEGER NOT NULL DEFAULT 0,
    time_completed     INTEGER,
    time_updated       INTEGER NOT NULL
);
-- Dream's selection: sessions whose completed revision differs from the
-- published one, in ready-time order (fair, no window skipped; see backend/dream.py)
CREATE INDEX dream_state_pending_idx ON dream_state(next_attempt_at, time_published, session_id)
    WHERE input_revision IS NOT NULL AND completed_revision IS NOT input_revision;
CREATE INDEX dream_state_overlay_idx ON dream_state(overlay_retry_at, session_id)
    WHERE overlay_pending = 1;
CREATE INDEX dream_state_digest_state_idx ON dream_state(digest_state);
CREATE INDEX dream_state_lease_idx ON dream_state(lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;

CREATE TABLE graph_node (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,
    label        TEXT NOT NULL,
    session_id   TEXT REFERENCES session(id) ON DELETE CASCADE,
    data         TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data)),
    revision     TEXT,
    time_created INTEGER NOT NULL,
    time_updated INTEGER NOT NULL
);
CREATE INDEX graph_node_session_idx ON graph_node(session_id);
CREATE INDEX graph_node_kind_idx ON graph_node(kind, label);

CREATE TABLE graph_edge (
    src          TEXT NOT NULL REFERENCES graph_node(id) ON DELETE CASCADE,
    dst          TEXT NOT NULL REFERENCES graph_node(id) ON DELETE CASCADE,
    kind         TEXT NOT NULL,
    -- the session whose raw turns support the edge (provenance; replaced per revision)
    session_id   TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
    weight       REAL NOT NULL DEFAULT 1,
    revision     TEXT,
    time_created INTEGER NOT NULL,
    PRIMARY KEY (src, dst, kind, session_id)
) WITHOUT ROWID;
CREATE INDEX graph_edge_dst_idx ON graph_edge(dst, kind);
CREATE INDEX graph_edge_session_idx ON graph_edge(session_id);

CREATE TABLE worker (
    owner_id           TEXT PRIMARY KEY,
    role               TEXT NOT NULL CHECK (role IN ('executor', 'summarizer', 'dream')),
    pid                INTEGER NOT NULL,
    host               TEXT NOT NULL,
    started_at         INTEGER NOT NULL,
    heartbeat_at       INTEGER NOT NULL,
    state              TEXT NOT NULL DEFAULT 'running'
        CHECK (state IN ('running', 'draining', 'stopped')),
    drain_requested_at INTEGER,
    stopped_at         INTEGER,
    info               TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(info))
);
CREATE INDEX worker_state_heartbeat_idx ON worker(state, heartbeat_at);

CREATE TABLE event (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    time       INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    actor      TEXT NOT NULL,
    session_id TEXT,
    target     TEXT,
    data       TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data))
);
CREATE INDEX event_session_idx ON event(session_id, id) WHERE session_id IS NOT NULL;
CREATE INDEX event_target_idx ON event(target, id) WHERE target IS NOT NULL;
CREATE INDEX event_kind_idx ON event(kind, id);
CREATE INDEX event_time_idx ON event(time);

-- append-only: the journal may be pruned from the old end, never edited
CREATE TRIGGER event_no_update BEFORE UPDATE ON event
BEGIN
    SELECT RAISE(ABORT, 'event is append-only');
END;
"""

# v2: the journal is written in every transaction of the turn path, so each of its
# indexes costs a page per transaction. Keep one index on that path (by session);
# index the rest only where it is read: target lookups of session-less rows
# (workers, drains), the operator actions the console lists, and the legacy
# Dream events of the retirement rule. Pruning walks the journal in id order
# (`backend.store.maintenance`), so it needs no time index.
V2 = """
DROP INDEX event_target_idx;
DROP INDEX event_kind_idx;
DROP INDEX event_time_idx;
CREATE INDEX event_target_idx ON event(target, id) WHERE target IS NOT NULL AND session_id IS NULL;
CREATE INDEX event_operator_idx ON event(id)
    WHERE kind IN ('operator.replay', 'operator.drain', 'operator.release');
CREATE INDEX event_legacy_idx ON event(time)
    WHERE kind IN ('dream.legacy_imported', 'dream.legacy_superseded');
"""

# v3: real models. The usage columns on `session` (opencode's) were there from v1; this adds
# what an operator needs around them: a session held after a model error that needs
# them (`held_at`, `held_reason`; its inputs wait with wake_pending = 0 until `rem
# resume`), the session's last model error, the sessions view's index (sessions with
# usage or an error, by cost; covering, so the totals read only it), and one row per
# model request attempt for the model-health block (recent window by time; pruned
# with the journal).
V3 = """
ALTER TABLE session ADD COLUMN held_at INTEGER;
ALTER TABLE session ADD COLUMN held_reason TEXT;
ALTER TABLE session ADD COLUMN model_error TEXT CHECK (model_error IS NULL OR json_valid(model_error));
CREATE INDEX session_held_idx ON session(held_at) WHERE held_at IS NOT NULL;
CREATE INDEX session_usage_idx ON session(cost, tokens_input, tokens_output, tokens_reasoning,
                                          tokens_cache_read, tokens_cache_write, model_error)
    WHERE tokens_input > 0 OR tokens_output > 0 OR model_error IS NOT NULL;

CREATE TABLE model_call (
    id             INTEGER PRIMARY KEY,
    time           INTEGER NOT NULL,
    owner_id       TEXT NOT NULL,
    -- chat (the agent), synthesis, embedding
    kind           TEXT NOT NULL,
    endpoint       TEXT NOT NULL,
    model          TEXT NOT NULL,
    session_id     TEXT,
    -- 1: a first try; more: a retry
    attempt        INTEGER NOT NULL,
    -- ok, or an error class (backend/models/errors.py)
    outcome        TEXT NOT NULL,
    status         INTEGER,
    ttft_ms        REAL,
    duration_ms    REAL,
    tokens_in      INTEGER,
    tokens_out     INTEGER,
    retry_after_ms INTEGER,
    error          TEXT
);
CREATE INDEX model_call_time_idx ON model_call(time);

-- `rem resume` is an operator action like the others: listed with them
DROP INDEX event_operator_idx;
CREATE INDEX event_operator_idx ON event(id)
    WHERE kind IN ('operator.replay', 'operator.drain', 'operator.release', 'operator.resume');
"""

# v4: memory that can be recalled (backend.memory). Sessions belong to a project
# (opencode's session table has project/workspace fields; default `default`).
# `memory_turn` is the recall index of raw turns (one row per user prompt or
# completed assistant reply), written by Dream per revision under its lease.
# Its lexical side is one FTS5 table per project (`memory_fts_p<hash>`, rowid =
# memory_turn.id, created by the index writer with the project's first turn:
# `backend.memory.text.fts_table`), its dense side one Chroma turn collection
# per project. `dream_state.indexed_revision`
# is the revision the index covers (invariant 9, docs/architecture.md#guarantees-and-invariants).
V4 = """
ALTER TABLE session ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
CREATE INDEX session_project_idx ON session(project, time_updated);
ALTER TABLE dream_state ADD COLUMN indexed_revision TEXT;
ALTER TABLE dream_state ADD COLUMN time_indexed INTEGER;
CREATE INDEX dream_state_index_lag_idx ON dream_state(time_published, session_id)
    WHERE input_revision IS NOT NULL AND indexed_revision IS NOT input_revision;

CREATE TABLE memory_turn (
    id            INTEGER PRIMARY KEY,
    message_id    TEXT NOT NULL UNIQUE,
    session_id    TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
    project       TEXT NOT NULL,
    -- position in the session's canonical turn order (time, then id)
    ord           INTEGER NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    speaker       TEXT NOT NULL DEFAULT '',
    time          INTEGER NOT NULL,
    -- hash of everything indexed for the turn (FTS columns, dense text, metadata): the diff key
    digest        TEXT NOT NULL,
    -- the digest whose vector is in the Chroma turn collection (NULL: not written yet)
    vector_digest TEXT,
    revision      TEXT NOT NULL,
    time_indexed  INTEGER NOT NULL
);
CREATE INDEX memory_turn_session_idx ON memory_turn(session_id, ord);
CREATE INDEX memory_turn_vector_pending_idx ON memory_turn(session_id)
    WHERE vector_digest IS NOT digest;
"""

# v5: the audit journal holds. Operator events record the OS identity of who acted (effective
# uid and its user name) next to the claimed operator (`actor`), are hash-chained (`chain` is
# SHA-256 of the previous operator event's `chain` and this row's content; see
# backend/store/events.py), are never pruned or deleted, and refusals are journaled too.
V5 = """
ALTER TABLE event ADD COLUMN os_uid INTEGER;
ALTER TABLE event ADD COLUMN os_user TEXT;
ALTER TABLE event ADD COLUMN chain_prev TEXT;
ALTER TABLE event ADD COLUMN chain TEXT;
DROP INDEX event_operator_idx;
CREATE INDEX event_operator_idx ON event(id)
    WHERE kind IN ('operator.replay', 'operator.replay_intent', 'operator.drain', 'operator.release',
                   'operator.resume', 'operator.refused');
CREATE TRIGGER event_operator_kept BEFORE DELETE ON event
WHEN old.kind IN ('operator.replay', 'operator.replay_intent', 'operator.drain', 'operator.release',
                  'operator.resume', 'operator.refused')
BEGIN
    SELECT RAISE(ABORT, 'operator events are the audit journal: never pruned, never deleted');
END;
"""

# v6: the status snapshot's cost stops growing with the tables. Its counts come
# from `status_count`, kept by triggers in the same transaction as the rows they count and
# backfilled here (backend/store/counters.py); the oldest waiting input, the oldest Dream
# drift and the newest receipt mismatches are read from partial indexes in the order a panel
# lists them (a seek and LIMIT rows, not a walk and sort of the whole backlog). The input
# index is off the executor's path: its wake scan (`wake_pending = 1`) cannot use it.
V6 = """
CREATE INDEX session_input_waiting_idx ON session_input(time_created, session_id)
    WHERE wake_pending IN (0, 1) AND promoted_seq IS NULL;
CREATE INDEX dream_state_drift_age_idx ON dream_state(time_published)
    WHERE input_revision IS NOT NULL AND completed_revision IS NOT input_revision;
CREATE INDEX summary_job_mismatch_idx ON summary_job(verdict_checked_at)
    WHERE verdict IN ('missing', 'document_differs', 'keys_differ', 'quarantined');
""" + counters.migration_sql()

# v7: lexical recall on PostgreSQL. Nothing changes in state.db (its FTS5 tables are created
# per project at run time, `backend.memory.text.fts_table`); the version moves on both engines
# so migration N stays the same step on each (PostgreSQL's part: `schema_pg.AFTER[7]`).
V7 = """
-- v7: no statement on SQLite
"""

# v8: the model usage totals become counters too (`status_count`, kept by triggers like v6's,
# backfilled here): `rem status` and the console read the total tokens and cost of every session
# that used a model in one small read, instead of summing the usage index (a walk of one entry
# per such session: 1 000 000 of them in a fleet whose every session uses a model).
V8 = counters.migration_sql(8)

# v9: each turn vector's record (`backend.memory.turn_vectors.sketch`: its document's hash and a
# projection of the vector, tolerant of Chroma's float rounding), so `rem check` and Dream's
# sweep find a turn row changed in Chroma, not only a missing one. NULL on rows written before.
V9 = """
ALTER TABLE memory_turn ADD COLUMN vector_sketch TEXT;
"""

# v10: when a worker's supervisor saw its process exit (SIGCHLD, same host): it is dead from that
# moment in every view (`rem status`, the console, a release's confirmation), whether or not
# `rem up --no-reap` leaves its leases to count down (`state` says that: `stopped` is reaped).
V10 = """
ALTER TABLE worker ADD COLUMN exited_at INTEGER;
"""

# v11: an agent's tool calls, one durable row per call (`backend.execution.tool_calls`). The
# arguments are stored before anything runs; `running` (with the call's idempotency key, stable
# across re-runs) is committed before the request is sent; the result after, fenced by the
# execution lease's (owner_id, epoch), which the row records as the lease it last moved under.
# The effect class is recorded when the call is made: recovery never needs the server to know it.
# `starts` counts the times `running` was committed, `retries` the operator's journaled retries
# (`rem check`: an effect call never started more than 1 + retries times). A session whose turn
# can only wait for a person (an approval, an unknown outcome) is held and its execution parked
# (`session_execution.parked` names why): no executor holds or renews it until a decision.
# The operator's decisions (`operator.approve`, `operator.deny`, `operator.resolve`) join the
# audit journal: its partial index lists them, and a trigger keeps them like the others.
V11 = """
CREATE TABLE tool_call (
    id               TEXT PRIMARY KEY,
    session_id       TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
    execution_id     TEXT NOT NULL,
    message_id       TEXT,
    step             INTEGER NOT NULL,
    idx              INTEGER NOT NULL,
    model_call_id    TEXT NOT NULL,
    tool             TEXT NOT NULL,
    arguments        TEXT NOT NULL CHECK (json_valid(arguments)),
    effect           TEXT NOT NULL CHECK (effect IN ('read', 'idempotent', 'effect')),
    effect_source    TEXT NOT NULL,
    permission       TEXT NOT NULL CHECK (permission IN ('allow', 'ask', 'deny')),
    state            TEXT NOT NULL CHECK (state IN
        ('pending', 'awaiting_approval', 'running', 'completed', 'error', 'denied', 'unknown')),
    approved         INTEGER NOT NULL DEFAULT 0,
    idempotency_key  TEXT NOT NULL,
    owner_id         TEXT,
    epoch            INTEGER,
    starts           INTEGER NOT NULL DEFAULT 0,
    retries          INTEGER NOT NULL DEFAULT 0,
    result           TEXT,
    result_bytes     INTEGER,
    result_truncated INTEGER NOT NULL DEFAULT 0,
    is_error         INTEGER NOT NULL DEFAULT 0,
    reason           TEXT,
    decided_by       TEXT,
    decided_at       INTEGER,
    time_created     INTEGER NOT NULL,
    time_started     INTEGER,
    time_finished    INTEGER,
    time_updated     INTEGER NOT NULL
);
CREATE UNIQUE INDEX tool_call_execution_step_idx_idx ON tool_call(execution_id, step, idx);
CREATE INDEX tool_call_session_created_idx ON tool_call(session_id, time_created);
CREATE INDEX tool_call_open_state_created_idx ON tool_call(state, time_created)
    WHERE state IN ('pending', 'awaiting_approval', 'running', 'unknown');
ALTER TABLE session_execution ADD COLUMN parked TEXT;
DROP INDEX event_operator_idx;
CREATE INDEX event_operator_idx ON event(id)
    WHERE kind IN ('operator.replay', 'operator.replay_intent', 'operator.drain', 'operator.release',
                   'operator.resume', 'operator.refused', 'operator.approve', 'operator.deny',
                   'operator.resolve');
CREATE TRIGGER event_tool_decision_kept BEFORE DELETE ON event
WHEN old.kind IN ('operator.approve', 'operator.deny', 'operator.resolve')
BEGIN
    SELECT RAISE(ABORT, 'operator events are the audit journal: never pruned, never deleted');
END;
"""

# v12: tool calls are counted like the rest of the status snapshot (`status_count`, kept by
# triggers, backfilled here): `rem status`'s `tools.counts` and the tool-call metrics read one
# small table, never a walk of every call ever made.
V12 = counters.migration_sql(12)

# v13: the application API (`rem serve`): backend/store/api_schema.py says what it adds and why
V13 = api_schema.V13

# Forward migrations: MIGRATIONS[i] brings user_version from i to i + 1.
MIGRATIONS: list[str] = [V1, V2, V3, V4, V5, V6, V7, V8, V9, V10, V11, V12, V13]
SCHEMA_VERSION = len(MIGRATIONS)


def split_statements(script: str) -> list[str]:
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        if line.strip().startswith("--") and not buffer.strip():
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements
