"""Schema v13, the application API's (`rem serve`, backend/api): one SQLite script, kept here because
`backend.store.migrations` holds every other version and would pass 600 lines with it.

PostgreSQL builds its twin from it like every migration (`backend.store.schema_pg`: the triggers'
hand-written twins, and `STREAM_ORDER`, the commit order PostgreSQL's journal adds).
"""

from __future__ import annotations

# v13: the application API (`rem serve`, backend/api). Its servers join the worker registry as
# role `server` (SQLite cannot alter a CHECK: the small table is rebuilt). Its bearer tokens are
# `api_token` rows holding only the SHA-256 of the secret, so every replica knows them; a revoked
# name may be created again. Creating, revoking tokens and killing a worker (`rem kill`) join the
# audit journal. The journal becomes the API's event streams (backend.store.stream): a streamed
# part and every tool-call state are journaled by triggers in the transaction that records them,
# whichever writer it was (PostgreSQL adds the commit-order column the streams need: schema_pg).
V13 = """
CREATE TABLE worker_v13 (
    owner_id           TEXT PRIMARY KEY,
    role               TEXT NOT NULL CHECK (role IN ('executor', 'summarizer', 'dream', 'server')),
    pid                INTEGER NOT NULL,
    host               TEXT NOT NULL,
    started_at         INTEGER NOT NULL,
    heartbeat_at       INTEGER NOT NULL,
    state              TEXT NOT NULL DEFAULT 'running'
        CHECK (state IN ('running', 'draining', 'stopped')),
    drain_requested_at INTEGER,
    stopped_at         INTEGER,
    info               TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(info)),
    exited_at          INTEGER
);
INSERT INTO worker_v13 (owner_id, role, pid, host, started_at, heartbeat_at, state, drain_requested_at,
                        stopped_at, info, exited_at)
    SELECT owner_id, role, pid, host, started_at, heartbeat_at, state, drain_requested_at, stopped_at,
           info, exited_at FROM worker;
DROP TABLE worker;
ALTER TABLE worker_v13 RENAME TO worker;
CREATE INDEX worker_state_heartbeat_idx ON worker(state, heartbeat_at);

CREATE TABLE api_token (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    hash       TEXT NOT NULL,
    projects   TEXT CHECK (projects IS NULL OR json_valid(projects)),
    scopes     TEXT NOT NULL CHECK (json_valid(scopes)),
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    revoked_at INTEGER
);
CREATE UNIQUE INDEX api_token_hash_idx ON api_token(hash);
CREATE UNIQUE INDEX api_token_live_name_idx ON api_token(name) WHERE revoked_at IS NULL;

DROP INDEX event_operator_idx;
CREATE INDEX event_operator_idx ON event(id)
    WHERE kind IN ('operator.replay', 'operator.replay_intent', 'operator.drain', 'operator.release',
                   'operator.resume', 'operator.refused', 'operator.approve', 'operator.deny',
                   'operator.resolve', 'operator.kill', 'operator.token_create', 'operator.token_revoke');
CREATE TRIGGER event_api_operator_kept BEFORE DELETE ON event
WHEN old.kind IN ('operator.kill', 'operator.token_create', 'operator.token_revoke')
BEGIN
    SELECT RAISE(ABORT, 'operator events are the audit journal: never pruned, never deleted');
END;

CREATE TRIGGER session_part_journaled AFTER INSERT ON session_part
BEGIN
    INSERT INTO event (time, kind, actor, session_id, target, data)
    VALUES (new.time_created, 'message.part', 'rem', new.session_id, new.id,
            json_object('message_id', new.message_id, 'idx', new.idx, 'type', new.type));
END;
CREATE TRIGGER tool_call_journaled AFTER INSERT ON tool_call
BEGIN
    INSERT INTO event (time, kind, actor, session_id, target, data)
    VALUES (new.time_updated, 'tool_call.state', 'rem', new.session_id, new.id,
            json_object('tool', new.tool, 'state', new.state, 'effect', new.effect));
END;
CREATE TRIGGER tool_call_state_journaled AFTER UPDATE OF state ON tool_call
WHEN old.state IS NOT new.state
BEGIN
    INSERT INTO event (time, kind, actor, session_id, target, data)
    VALUES (new.time_updated, 'tool_call.state', 'rem', new.session_id, new.id,
            json_object('tool', new.tool, 'state', new.state, 'effect', new.effect));
END;
"""
