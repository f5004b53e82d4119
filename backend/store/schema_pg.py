"""The PostgreSQL twin of the state.db schema, versioned in a table, forward migrations only.

Migration N on PostgreSQL is SQLite's migration N (`backend.store.migrations`)
translated statement by statement (`pg_ddl`): INTEGER -> BIGINT (times are
ms), REAL -> DOUBLE PRECISION, BLOB -> BYTEA, AUTOINCREMENT -> an identity
column, `IS [NOT]` -> `IS [NOT] DISTINCT FROM`, no WITHOUT ROWID, an alias for
a subquery in FROM. Everything here runs on PostgreSQL 14 (the oldest rem
supports, `postgres.MIN_SERVER_VERSION`) to 18; tests/backend/test_schema_pg.py
migrates on 15 too. A
statement that has no mechanical twin (a trigger, a virtual table) must have
a hand-written one in `TWINS`, named by its object; without it building the
PostgreSQL migrations fails, so a new SQLite-only construct cannot slip by
(tests/backend/test_schema_pg.py builds them all).

What PostgreSQL needs besides (`PRELUDE`, in migration 1): the SQLite
functions rem's SQL uses (`json_valid`, `json_extract`, `json_set`,
`json_each`, `group_concat`), the version table (`rem_schema_version`, one
row per applied migration: the `user_version` of this engine), and a
`rowid` identity column where rem reads SQLite's implicit one.

PostgreSQL's own migrations (`PG_ONLY`) sit between SQLite's at fixed version
numbers, so the numbering stays stable when SQLite adds one: PostgreSQL 8 is
the change feed (below), after SQLite's 1-7, and SQLite's migration 8 (the usage
counters: nothing to do here, `SQLITE_ONLY`) is PostgreSQL's 9; PostgreSQL 10 adds
`rem_fenced` (a fenced write sent unread fails when it changed no row). `pg_schema_version()` is
this engine's newest version.

The change feed (PostgreSQL 8): every rem table has a statement-level trigger
that calls `pg_notify('rem_change', <transaction id>)`. A notification is
part of its transaction: sent at COMMIT, never after a ROLLBACK, and
PostgreSQL delivers one per transaction and payload however many statements
fired it. NOTIFY is scoped to one database, so the console's LISTEN (instead
of watchfiles on state.db's WAL) hears this store's commits and no other's.
A statement that wrote nothing in a transaction that wrote nothing (a fenced
UPDATE matching no row) sends none: the transaction has no id yet. Since
PostgreSQL 15 a write to the journal (`event`) notifies `j<transaction id>`
instead, so a listener knows a journaled commit (news) from upkeep unasked;
since 16 it also notifies `rem_journal` (`JOURNAL_CHANNEL`), the channel idle
daemons LISTEN on, so upkeep reaches no daemon at all.

Lexical recall: SQLite's per-project FTS5 tables (created by `backend.memory`
at run time) have one twin here, created by migration 7 (`LEXICAL`): the
`memory_fts` table of `tsvector` documents with a GIN index, the scope
tokens (project, session) inside each document so a scoped query intersects
posting lists instead of filtering matches.
"""

from __future__ import annotations

import logging
import re
from typing import cast

from backend.core import clock
from backend.core.errors import DataDirError, SchemaTooNew
from backend.store import counters
from backend.store.db import Conn
from backend.store.events import append_event_sync
from backend.store.migrations import MIGRATIONS, split_statements
from backend.store.postgres import FENCE_SQLSTATE, PgConnection, alias_subqueries

log = logging.getLogger("rem.schema")

VERSION_TABLE = "rem_schema_version"
# one advisory lock key for migrations: two hosts running `rem init` at once take turns
MIGRATION_LOCK = 0x72656D5F736368  # "rem_sch"

PRELUDE = f"""
CREATE TABLE {VERSION_TABLE} (
    version    INTEGER PRIMARY KEY,
    applied_at BIGINT NOT NULL
);
-- SQLite's JSON functions, as rem's SQL uses them. json_valid parses as `json` (syntax only,
-- like `IS JSON`, which needs PostgreSQL 16); any data exception (class 22) means "not JSON"
CREATE FUNCTION json_valid(value text) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN CASE WHEN value IS NULL THEN NULL ELSE value::json IS NOT NULL END;
EXCEPTION WHEN data_exception THEN
    RETURN false;
END $$;
-- '$.a.b' paths only (all rem writes); values come back as text, numbers included
CREATE FUNCTION json_extract(value text, path text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT (value::jsonb) #>> coalesce(string_to_array(nullif(substr(path, 3), ''), '.'), '{{}}') $$;
-- json_set(doc, path, text, ...): rem sets strings (and NULL) only
CREATE FUNCTION json_set(doc text, VARIADIC kv text[]) RETURNS text
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    result jsonb := doc::jsonb;
BEGIN
    FOR i IN 1 .. coalesce(array_length(kv, 1), 0) - 1 BY 2 LOOP
        result := jsonb_set(result, string_to_array(substr(kv[i], 3), '.'),
                            coalesce(to_jsonb(kv[i + 1]), 'null'::jsonb), true);
    END LOOP;
    RETURN result::text;
END $$;
-- the table-valued json_each(doc, path): (key, value) of an object's members or an array's elements
CREATE FUNCTION json_each(doc text, path text) RETURNS TABLE (key text, value text)
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    WITH x(v) AS (SELECT (doc::jsonb) #> coalesce(string_to_array(nullif(substr(path, 3), ''), '.'), '{{}}'))
    SELECT e.key, e.value FROM x, jsonb_each_text(CASE WHEN jsonb_typeof(x.v) = 'object' THEN x.v END) AS e
    UNION ALL
    SELECT (a.o - 1)::text, a.v
    FROM x, jsonb_array_elements_text(CASE WHEN jsonb_typeof(x.v) = 'array' THEN x.v END)
         WITH ORDINALITY AS a(v, o)
$$;
-- SQLite's group_concat(x): comma-separated, NULLs skipped
CREATE FUNCTION rem_concat_comma(acc text, value text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN value IS NULL THEN acc WHEN acc IS NULL THEN value ELSE acc || ',' || value END $$;
CREATE AGGREGATE group_concat(text) (SFUNC = rem_concat_comma, STYPE = text);
-- group_concat(x, separator)
CREATE FUNCTION rem_concat_sep(acc text, value text, sep text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN value IS NULL THEN acc WHEN acc IS NULL THEN value ELSE acc || sep || value END $$;
CREATE AGGREGATE group_concat(text, text) (SFUNC = rem_concat_sep, STYPE = text);
CREATE FUNCTION json_each(doc text) RETURNS TABLE (key text, value text)
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT * FROM json_each(doc, '$') $$;
-- SQLite's total(x): a float sum, 0.0 over no rows
CREATE AGGREGATE total(double precision) (SFUNC = float8pl, STYPE = double precision, INITCOND = '0');
-- SQLite's comparisons are 0/1 integers: sum(a < b) counts the rows where it holds
CREATE FUNCTION rem_sum_bool(acc bigint, value boolean) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN value IS NULL THEN acc ELSE coalesce(acc, 0) + value::int END $$;
CREATE AGGREGATE sum(boolean) (SFUNC = rem_sum_bool, STYPE = bigint);
-- SQLite's `doc ->> 'key'` on JSON text (a member as SQL text; '$.a.b' paths too)
CREATE FUNCTION rem_json_field(doc text, key text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN left(key, 1) = '$'
                THEN (doc::jsonb) #>> coalesce(string_to_array(nullif(substr(key, 3), ''), '.'), '{{}}')
                ELSE (doc::jsonb) ->> key END $$;
CREATE OPERATOR ->> (LEFTARG = text, RIGHTARG = text, FUNCTION = rem_json_field);
-- json_group_array(x): a JSON array (text) of the group's values
CREATE FUNCTION rem_json_append(acc jsonb, value text) RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(acc, '[]'::jsonb) || jsonb_build_array(value) $$;
CREATE FUNCTION rem_json_text(acc jsonb) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(acc, '[]'::jsonb)::text $$;
CREATE AGGREGATE json_group_array(text) (SFUNC = rem_json_append, STYPE = jsonb, FINALFUNC = rem_json_text);
-- SQLite's catalog as rem reads it (which tables exist): this schema's tables; no FTS5 table
-- ever exists here, so lexical recall finds none to search (see the module doc)
CREATE VIEW sqlite_master AS
    SELECT 'table'::text AS type, tablename::text AS name, NULL::text AS sql
    FROM pg_tables WHERE schemaname = current_schema();
CREATE FUNCTION rem_refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END $$;
"""

# SQLite's implicit `rowid`, which rem reads on these two tables (the status snapshot counts
# rows added since the last refresh): an identity column of that name, so the SQL is shared
ROWID_COLUMNS = "".join(
    f"ALTER TABLE {table} ADD COLUMN rowid BIGINT GENERATED ALWAYS AS IDENTITY;\n"
    f"CREATE UNIQUE INDEX {table}_rowid_idx ON {table}(rowid);\n"
    for table in ("session", "session_input")
)


# Hand-written twins of the statements that do not translate, by object name.
TWINS: dict[str, str] = {
    "event_no_update": "CREATE TRIGGER event_no_update BEFORE UPDATE ON event "
    "FOR EACH ROW EXECUTE FUNCTION rem_refuse_update();",
    "event_operator_kept": """
CREATE FUNCTION rem_keep_operator_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF old.kind IN ('operator.replay', 'operator.replay_intent', 'operator.drain', 'operator.release',
                    'operator.resume', 'operator.refused') THEN
        RAISE EXCEPTION 'operator events are the audit journal: never pruned, never deleted';
    END IF;
    RETURN old;
END $$;
CREATE TRIGGER event_operator_kept BEFORE DELETE ON event
    FOR EACH ROW EXECUTE FUNCTION rem_keep_operator_events();""",
    "event_tool_decision_kept": """
CREATE FUNCTION rem_keep_tool_decisions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF old.kind IN ('operator.approve', 'operator.deny', 'operator.resolve') THEN
        RAISE EXCEPTION 'operator events are the audit journal: never pruned, never deleted';
    END IF;
    RETURN old;
END $$;
CREATE TRIGGER event_tool_decision_kept BEFORE DELETE ON event
    FOR EACH ROW EXECUTE FUNCTION rem_keep_tool_decisions();""",
}
# v13: the API's operator kinds are kept; parts and tool-call states are journaled (migrations.V13)
TWINS.update(
    {
        "event_api_operator_kept": """
CREATE FUNCTION rem_keep_api_operator_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF old.kind IN ('operator.kill', 'operator.token_create', 'operator.token_revoke') THEN
        RAISE EXCEPTION 'operator events are the audit journal: never pruned, never deleted';
    END IF;
    RETURN old;
END $$;
CREATE TRIGGER event_api_operator_kept BEFORE DELETE ON event
    FOR EACH ROW EXECUTE FUNCTION rem_keep_api_operator_events();""",
        "session_part_journaled": """
CREATE FUNCTION rem_journal_part() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event (time, kind, actor, session_id, target, data)
    VALUES (new.time_created, 'message.part', 'rem', new.session_id, new.id,
            json_build_object('message_id', new.message_id, 'idx', new.idx, 'type', new.type)::text);
    RETURN NULL;
END $$;
CREATE TRIGGER session_part_journaled AFTER INSERT ON session_part
    FOR EACH ROW EXECUTE FUNCTION rem_journal_part();""",
        "tool_call_journaled": """
CREATE FUNCTION rem_journal_tool_call() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event (time, kind, actor, session_id, target, data)
    VALUES (new.time_updated, 'tool_call.state', 'rem', new.session_id, new.id,
            json_build_object('tool', new.tool, 'state', new.state, 'effect', new.effect)::text);
    RETURN NULL;
END $$;
CREATE TRIGGER tool_call_journaled AFTER INSERT ON tool_call
    FOR EACH ROW EXECUTE FUNCTION rem_journal_tool_call();""",
        "tool_call_state_journaled": """
CREATE TRIGGER tool_call_state_journaled AFTER UPDATE OF state ON tool_call
    FOR EACH ROW WHEN (old.state IS DISTINCT FROM new.state) EXECUTE FUNCTION rem_journal_tool_call();""",
    }
)
# The status counters' triggers (schema v6) have none on purpose: PostgreSQL counts on each read
# and keeps no `status_count` (backend/store/counters.py says why); an empty twin is no statement.
TWINS.update(
    {
        name: ""
        for counter in counters.COUNTERS
        for name, _event, _when, _body in counters.trigger_parts(counter)
    }
)
# v7: the lexical side of the recall index (FTS5's twin; `backend.memory.index.write_rows`
# writes a row with each memory_turn row, `backend.memory.recall` searches it). `doc` is the
# turn's text (weight A), its context (B) and its scope tokens (D, never ranked). A database
# indexed before v7 has memory_turn rows without one: their digests are cleared and their
# sessions' Dream revision reopened, so Dream re-indexes each once (the graph is rewritten by
# difference: nothing changes there) and `rem check` holds (invariant 9).
LEXICAL = """
CREATE TABLE memory_fts (
    id         BIGINT PRIMARY KEY REFERENCES memory_turn(id) ON DELETE CASCADE,
    project    TEXT NOT NULL,
    doc        TSVECTOR NOT NULL
);
CREATE INDEX memory_fts_doc_idx ON memory_fts USING gin (doc);
"""
# rows indexed before v7 have no lexical row: rewrite them (a digest no plan has) and reopen
# their sessions' revision for Dream (which re-indexes them under its lease, then the graph)
LEXICAL_BACKFILL = """
UPDATE memory_turn SET digest = '' WHERE NOT EXISTS (SELECT 1 FROM memory_fts f WHERE f.id = memory_turn.id);
UPDATE dream_state SET completed_revision = NULL, indexed_revision = NULL
    WHERE session_id IN (SELECT session_id FROM memory_turn WHERE digest = '')
"""
# v13: the API's event streams read the journal in commit order (backend.store.stream). Journal ids
# come from a sequence and commit in any order, so a stream that followed them would skip a row
# whose transaction commits after a higher id's. Each row records its transaction id (`xact`,
# 64 bits: it never wraps); a stream reads in (xact, id) order and only rows whose transaction is
# older than every transaction still running (`pg_snapshot_xmin`): all of those have ended, so no
# row can appear later before one already read. Rows older than this migration share xact 1
# (added without rewriting the table), in id order, which is their commit order then.
STREAM_ORDER = """
ALTER TABLE event ADD COLUMN xact xid8 NOT NULL DEFAULT '1';
ALTER TABLE event ALTER COLUMN xact SET DEFAULT pg_current_xact_id();
CREATE INDEX event_stream_idx ON event(xact, id);
CREATE INDEX event_session_stream_idx ON event(session_id, xact, id) WHERE session_id IS NOT NULL;
"""
# what PostgreSQL adds after SQLite's migration N (1-based)
AFTER: dict[int, str] = {
    1: ROWID_COLUMNS,
    6: f"DROP TABLE {counters.TABLE}",
    7: LEXICAL + LEXICAL_BACKFILL,
    13: STREAM_ORDER,
}

# the change feed (see the module doc): the channel the console LISTENs on
CHANGE_CHANNEL = "rem_change"
CHANGE_FEED = f"""
CREATE FUNCTION rem_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    xact xid8 := pg_current_xact_id_if_assigned();
BEGIN
    IF xact IS NOT NULL THEN  -- the transaction has written: it will notify once, at COMMIT
        PERFORM pg_notify('{CHANGE_CHANNEL}', xact::text);
    END IF;
    RETURN NULL;
END $$;
-- the trigger on every table of the schema but the version table; run again by every later
-- migration, so a table a new migration creates is watched too
CREATE FUNCTION rem_watch_tables() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    name text;
BEGIN
    FOR name IN SELECT tablename FROM pg_tables
                WHERE schemaname = current_schema() AND tablename <> '{VERSION_TABLE}' LOOP
        EXECUTE format('CREATE OR REPLACE TRIGGER rem_change AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE '
                       'ON %I FOR EACH STATEMENT EXECUTE FUNCTION rem_notify_change()', name);
    END LOOP;
END $$;
SELECT rem_watch_tables();
"""
# PostgreSQL 10: a fenced write sent unread fails its statement when it changed no row
# (`backend.store.db.fenced_write(unread=True)`), with rem's own SQLSTATE and the caller's message
FENCED = f"""
CREATE FUNCTION rem_fenced(changed bigint, lost text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF changed = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '{FENCE_SQLSTATE}', MESSAGE = lost;
    END IF;
END $$
"""
# PostgreSQL 15: a commit that wrote the journal (`event`) says so in its notification ('j' before
# the transaction id), so an idle daemon tells news from upkeep (another worker's heartbeat, a lease
# renewal) without asking the server: before, every heartbeat woke every other daemon for a read
JOURNALED = "j"
CHANGE_FEED_JOURNALED = f"""
CREATE OR REPLACE FUNCTION rem_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    xact xid8 := pg_current_xact_id_if_assigned();
BEGIN
    IF xact IS NOT NULL THEN  -- the transaction has written: it will notify once a payload, at COMMIT
        PERFORM pg_notify('{CHANGE_CHANNEL}',
                          CASE WHEN TG_TABLE_NAME = 'event' THEN '{JOURNALED}' ELSE '' END || xact::text);
    END IF;
    RETURN NULL;
END $$
"""
# PostgreSQL 16: a journaled commit also notifies a channel of its own, the one idle daemons LISTEN
# on: upkeep (every worker's heartbeat, a lease renewal) is delivered to no daemon at all. Before, each
# heartbeat woke every other daemon's process to be set aside, the larger part of an idle daemon's CPU
JOURNAL_CHANNEL = "rem_journal"
CHANGE_FEED_JOURNAL_CHANNEL = f"""
CREATE OR REPLACE FUNCTION rem_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    xact xid8 := pg_current_xact_id_if_assigned();
BEGIN
    IF xact IS NULL THEN  -- the transaction has not written: nothing to say
        RETURN NULL;
    END IF;
    IF TG_TABLE_NAME = 'event' THEN  -- news: on both channels, once a payload each, at COMMIT
        PERFORM pg_notify('{CHANGE_CHANNEL}', '{JOURNALED}' || xact::text);
        PERFORM pg_notify('{JOURNAL_CHANNEL}', '{JOURNALED}' || xact::text);
    ELSE
        PERFORM pg_notify('{CHANGE_CHANNEL}', xact::text);
    END IF;
    RETURN NULL;
END $$
"""
# PostgreSQL-only migrations, by the version they bring this engine to (never renumbered)
PG_ONLY: dict[int, str] = {
    8: CHANGE_FEED,
    10: FENCED,
    15: CHANGE_FEED_JOURNALED,
    16: CHANGE_FEED_JOURNAL_CHANNEL,
}
# SQLite migrations with nothing to do here (by SQLite's number): 8 and 12 add status counters,
# which PostgreSQL does not keep (it counts on each read; backend/store/counters.py says why).
# The version still moves, so both engines' numbering stays in step.
SQLITE_ONLY: frozenset[int] = frozenset({8, 12})

_NO_TWIN = re.compile(r"^\s*(CREATE\s+(TRIGGER|VIRTUAL\s+TABLE)|DROP\s+TRIGGER|PRAGMA)\b", re.IGNORECASE)
_OBJECT_NAME = re.compile(
    r"^\s*(?:CREATE|DROP)\s+(?:VIRTUAL\s+TABLE|TRIGGER)\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?(\w+)", re.IGNORECASE
)
_TYPES = (
    (
        re.compile(r"\bINTEGER\s+PRIMARY\s+KEY\s+AUTOINCREMENT\b", re.I),
        "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    ),
    # SQLite's rowid alias assigns an id when none is given, as an identity column does
    (
        re.compile(r"\bINTEGER\s+PRIMARY\s+KEY\b(?!\s*\()", re.I),
        "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    ),
    (re.compile(r"\bINTEGER\b", re.I), "BIGINT"),
    (re.compile(r"\bREAL\b", re.I), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b", re.I), "BYTEA"),
    (re.compile(r"\)\s*WITHOUT\s+ROWID\s*;?\s*$", re.I), ")"),
    (re.compile(r"\bIS\s+NOT\s+(?!NULL\b|DISTINCT\b|TRUE\b|FALSE\b)", re.I), "IS DISTINCT FROM "),
    (re.compile(r"\bIS\s+(?!NOT\b|NULL\b|DISTINCT\b|TRUE\b|FALSE\b|JSON\b)", re.I), "IS NOT DISTINCT FROM "),
)


class SchemaTwinMissing(RuntimeError):
    """A SQLite migration statement with no PostgreSQL twin: add one to TWINS."""


def pg_ddl(script: str) -> list[str]:
    """One SQLite migration as PostgreSQL statements (see the module doc)."""
    statements = []
    for statement in split_statements(script):
        if _NO_TWIN.match(statement):
            name = _OBJECT_NAME.match(statement)
            twin = TWINS.get(name.group(1)) if name else None
            if twin is None:
                raise SchemaTwinMissing(
                    f"no PostgreSQL twin for: {statement.splitlines()[0]} ... "
                    "(add one to backend/store/schema_pg.py TWINS)"
                )
            if twin:
                statements.append(twin)
            continue
        for pattern, replacement in _TYPES:
            statement = pattern.sub(replacement, statement)
        statements.append(alias_subqueries(statement.rstrip().rstrip(";")))
    return statements


def pg_migrations() -> list[list[str]]:
    """Every PostgreSQL migration: statements of PostgreSQL version N at index N - 1.

    SQLite's migrations in order, with `PG_ONLY` ones at their own numbers.
    """
    sqlite_scripts = list(enumerate(MIGRATIONS, start=1))
    built: list[list[str]] = []
    while sqlite_scripts or len(built) + 1 in PG_ONLY:
        version = len(built) + 1
        if version in PG_ONLY:
            built.append([PG_ONLY[version]])
            continue
        number, script = sqlite_scripts.pop(0)
        if number in SQLITE_ONLY:
            built.append([])  # the version moves, nothing else
            continue
        statements = ([PRELUDE] if number == 1 else []) + pg_ddl(script)
        if number in AFTER:
            statements.append(AFTER[number])
        if version > min(PG_ONLY):  # a table it creates gets the change feed's trigger
            statements.append("SELECT rem_watch_tables()")
        built.append(statements)
    return built


def pg_schema_version() -> int:
    """This engine's newest schema version: SQLite's migrations plus PostgreSQL's own."""
    return len(MIGRATIONS) + len(PG_ONLY)


# whether the version table exists, then the highest migration it records
VERSION_TABLE_SQL = f"SELECT to_regclass('{VERSION_TABLE}') IS NOT NULL AS present"
VERSION_SQL = f"SELECT coalesce(max(version), 0) AS v FROM {VERSION_TABLE}"


def schema_version_sync(conn: Conn) -> int:
    """The highest migration applied (0: no rem schema)."""
    row = conn.execute(VERSION_TABLE_SQL).fetchone()
    if not row["present"]:
        return 0
    return int(conn.execute(VERSION_SQL).fetchone()["v"])


def foreign_tables_sync(conn: Conn) -> list[str]:
    rows = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"
    ).fetchall()
    return [r["tablename"] for r in rows]


def refuse_foreign(where: str, version: int, tables: list[str]) -> None:
    """Never touch another program's tables: rem's schema is versioned, or empty."""
    if version == 0 and tables:
        shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        raise DataDirError(
            f"{where} already holds tables that are not rem's ({shown}); "
            "point --db at an empty database (or a schema of its own via ?options=-csearch_path=...)"
        )


def refuse_newer(where: str, version: int, supported: int) -> None:
    if version > supported:
        raise SchemaTooNew(
            f"{where} has schema version {version}, newer than this rem supports "
            f"({supported}); upgrade rem or point --db at another database"
        )


def migrate_sync(conn: Conn, where: str) -> tuple[int, int]:
    """Bring the database to the newest schema in one transaction; returns (from, to)."""
    migrations = pg_migrations()
    target = len(migrations)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
        current = schema_version_sync(conn)
        refuse_newer(where, current, target)
        refuse_foreign(where, current, foreign_tables_sync(conn))
        raw = cast(PgConnection, conn).raw  # DDL with $$ bodies goes to psycopg as written
        now = clock.now_ms()
        for number in range(current + 1, target + 1):
            for statement in migrations[number - 1]:
                raw.execute(statement)
            conn.execute(f"INSERT INTO {VERSION_TABLE} (version, applied_at) VALUES (?, ?)", (number, now))
            log.info("migrated %s to schema version %d", where, number)
        if current < target:
            append_event_sync(
                conn, kind="schema.migrated", actor="rem", data={"from": current, "to": target}, now=now
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return current, target
