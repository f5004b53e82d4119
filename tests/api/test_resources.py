"""The API's read and decision resources against a real `rem serve` on SQLite and PostgreSQL: sessions
and transcripts paged (opaque cursors, Link headers), a held session's state, tool-call decisions
journaled with the token's name and refused like the CLI's, status and recall kept to the token's
projects, and every by-id route answering another project's id exactly like a missing one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from backend import ops
from backend.core import clock
from backend.runtime.context import Context
from backend.store.db import Database
from backend.store.states import ToolCallState
from tests.api.conftest import Served, parked_turn, unique
from tests.helpers import await_until, run_rem


async def _transcript(db: Database, sid: str, project: str, messages: int) -> None:
    """A session of `project` with `messages` messages (every assistant one in three streamed parts)."""
    now = clock.now_ms()
    async with db.tx() as conn:
        await conn.execute(
            "INSERT INTO session (id, project, time_created, time_updated, last_seq, message_count) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (sid, project, now, now, messages, messages),
        )
        for seq in range(1, messages + 1):
            kind = "user" if seq % 2 else "assistant"
            text = f"{kind} {seq}"
            data = {"text": text, "status": "completed"} if kind == "assistant" else {"text": text}
            await conn.execute(
                "INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (f"{sid}:m{seq}", sid, kind, seq, now, now, json.dumps(data)),
            )
            for idx, piece in enumerate((text[:3], text[3:6], text[6:]) if kind == "assistant" else ()):
                await conn.execute(
                    "INSERT INTO session_part (id, message_id, session_id, idx, type, time_created, data) "
                    "VALUES (?, ?, ?, ?, 'text', ?, ?)",
                    (f"{sid}:m{seq}:p{idx}", f"{sid}:m{seq}", sid, idx, now, json.dumps({"text": piece})),
                )


def _pages(api: Any, path: str, key: str, **params: Any) -> list[list[dict[str, Any]]]:
    pages, cursor = [], None
    while True:
        answer = api.get(path, params={**params, **({"cursor": cursor} if cursor else {})})
        assert answer.status_code == 200, answer.text
        pages.append(answer.json()[key])
        cursor = answer.json()["next_cursor"]
        assert ("link" in answer.headers) == bool(cursor)
        if not cursor:
            return pages


def test_sessions_come_newest_first_a_page_at_a_time_with_opaque_cursors(served: Served) -> None:
    project = unique("p")
    with served.client("ops") as api:
        made = [
            api.post(f"/v1/sessions/{unique('s')}/inputs", json={"text": "x", "project": project}).json()[
                "session_id"
            ]
            for _ in range(5)
        ]
        pages = _pages(api, "/v1/sessions", "sessions", project=project, limit=2)
        assert [len(p) for p in pages] == [2, 2, 1]
        listed = [s["id"] for page in pages for s in page]
        assert listed == made[::-1]  # newest first, each once
        assert {s["state"] for page in pages for s in page} == {"queued"}
        first = api.get("/v1/sessions", params={"project": project, "limit": 2}).json()
        tampered = api.get(
            "/v1/sessions", params={"project": project, "cursor": first["next_cursor"][:-2] + "xx"}
        )
        assert tampered.status_code == 400 and "cursor" in tampered.json()["error"]["message"]
        other = api.get("/v1/sessions", params={"project": unique("p"), "cursor": first["next_cursor"]})
        assert other.status_code == 400 and "another filter" in other.json()["error"]["message"]
        assert api.get("/v1/sessions", params={"limit": 0}).status_code == 400
    with served.client("alpha") as alpha:
        assert alpha.get("/v1/sessions", params={"project": project}).status_code == 403
        assert all(
            s["project"] == "alpha"
            for s in alpha.get("/v1/sessions", params={"limit": 100}).json()["sessions"]
        )


async def test_a_transcript_comes_in_order_with_its_parts_a_page_at_a_time(
    served: Served, store_ctx: Context
) -> None:
    sid = unique("s")
    await _transcript(await store_ctx.db(), sid, "alpha", 7)
    with served.client("alpha") as api:
        first = api.get(f"/v1/sessions/{sid}/messages", params={"limit": 3})
        assert first.status_code == 200
        assert [m["seq"] for m in first.json()["messages"]] == [1, 2, 3]
        assert first.json()["next_after"] == 3 and 'rel="next"' in first.headers["link"]
        second = api.get(f"/v1/sessions/{sid}/messages", params={"after": 3, "limit": 10}).json()
        assert [m["seq"] for m in second["messages"]] == [4, 5, 6, 7] and second["next_after"] is None
        reply = second["messages"][0]
        assert reply["type"] == "assistant" and reply["text"] == "assistant 4"
        assert [(p["idx"], p["type"]) for p in reply["parts"]] == [(0, "text"), (1, "text"), (2, "text")]
        assert "".join(p["text"] for p in reply["parts"]) == "assistant 4"
        assert api.get(f"/v1/sessions/{sid}/messages", params={"after": -1}).status_code == 400


async def test_a_session_held_for_a_tool_call_says_so_and_names_the_calls(
    served: Served, store_ctx: Context
) -> None:
    sid = unique("s")
    (call,) = await parked_turn(await store_ctx.db(), sid, "alpha", [ToolCallState.AWAITING_APPROVAL])
    with served.client("alpha") as api:
        state = api.get(f"/v1/sessions/{sid}").json()
    assert state["state"] == "held" and state["execution"] is not None
    assert state["held"]["reason"] == "tool_awaiting_approval"
    assert state["held"]["tool_calls"] == [
        {"call_id": call, "tool": "outbox.outbox_send", "state": "awaiting_approval"}
    ]
    assert set(state["usage"]) == {"tokens", "cost"} and state["counts"]["messages"] == 0


async def test_decisions_over_http_are_journaled_with_the_tokens_name_and_refused_like_the_clis(
    served: Served, store_ctx: Context
) -> None:
    db = await store_ctx.db()
    sid = unique("s")
    ask, effect = await parked_turn(
        db, sid, "alpha", [ToolCallState.AWAITING_APPROVAL, ToolCallState.RUNNING]
    )
    with served.client("alpha") as api:
        listed = api.get("/v1/tool-calls").json()["tool_calls"]
        assert {c["call_id"]: c["state"] for c in listed if c["session_id"] == sid} == {
            ask: "awaiting_approval",
            effect: "unknown",
        }
        only = api.get("/v1/tool-calls", params={"state": "unknown"}).json()["tool_calls"]
        assert {c["state"] for c in only} == {"unknown"}
        approved = api.post(f"/v1/tool-calls/{ask}/approve")
        assert approved.status_code == 200, approved.text
        assert (approved.json()["state"], approved.json()["decided_by"]) == ("pending", "alpha")
        again = api.post(f"/v1/tool-calls/{ask}/deny", json={"reason": "too late"})
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "wrong_state" and again.json()["error"]["state"] == "pending"
        mixed = api.post(f"/v1/tool-calls/{effect}/resolve", json={"outcome": "retry", "reason": "x"})
        assert mixed.status_code == 400
        done = api.post(
            f"/v1/tool-calls/{effect}/resolve", json={"outcome": "done", "result": "sent at 10:02"}
        )
        assert done.status_code == 200 and done.json()["state"] == "completed"
        assert done.json()["unparked"] is True
    events = await db.fetchall(
        "SELECT kind, actor, target FROM event WHERE kind LIKE 'operator.%' AND target IN (?, ?) ORDER BY id",
        (ask, effect),
    )
    assert [tuple(e) for e in events] == [
        ("operator.approve", "alpha", ask),
        ("operator.refused", "alpha", ask),
        ("operator.resolve", "alpha", effect),
    ]


async def test_every_by_id_route_answers_another_projects_id_exactly_like_a_missing_one(
    served: Served, store_ctx: Context
) -> None:
    theirs = unique("s")
    (call,) = await parked_turn(await store_ctx.db(), theirs, "beta", [ToolCallState.AWAITING_APPROVAL])
    missing_session, missing_call = unique("s"), unique("c")

    def answers(api: Any, session_id: str, call_id: str) -> list[tuple[int, str]]:
        out = [
            api.get(f"/v1/sessions/{session_id}"),
            api.get(f"/v1/sessions/{session_id}/messages"),
            api.post("/v1/recall", json={"query": "x", "session_id": session_id}),
            api.post(f"/v1/tool-calls/{call_id}/approve"),
            api.post(f"/v1/tool-calls/{call_id}/deny", json={}),
            api.post(f"/v1/tool-calls/{call_id}/resolve", json={"outcome": "fail"}),
        ]
        return [(a.status_code, a.text.replace(session_id, "ID").replace(call_id, "ID")) for a in out]

    with served.client("alpha") as alpha:
        foreign, missing = answers(alpha, theirs, call), answers(alpha, missing_session, missing_call)
        assert foreign == missing
        assert {status for status, _ in foreign} == {404}
        assert all(call not in c["call_id"] for c in alpha.get("/v1/tool-calls").json()["tool_calls"])
    with served.client("beta") as beta:  # and the owner sees them
        assert beta.get(f"/v1/sessions/{theirs}").status_code == 200
    row = await (await store_ctx.db()).fetchone("SELECT state FROM tool_call WHERE id = ?", (call,))
    assert row is not None and row[0] == "awaiting_approval"  # nothing was decided


async def test_status_is_kept_to_the_tokens_projects(served: Served, store_ctx: Context) -> None:
    mine, theirs = unique("s"), unique("s")
    with served.client("alpha") as alpha, served.client("beta") as beta:
        assert alpha.post(f"/v1/sessions/{mine}/inputs", json={"text": "x"}).status_code == 202
        assert beta.post(f"/v1/sessions/{theirs}/inputs", json={"text": "x"}).status_code == 202
        kept = alpha.get("/v1/status").json()
    with served.client("ops") as api:
        whole = api.get("/v1/status").json()

    def sessions(status: dict[str, Any]) -> set[str]:
        return {r["session_id"] for r in status["backlog"]["inputs"]} | {
            e["session_id"] for e in status["events"] if e["session_id"]
        }

    assert {mine, theirs} <= sessions(whole)
    assert mine in sessions(kept) and theirs not in sessions(kept)
    assert all(e["session_id"] for e in kept["events"])  # journal rows of no session are the fleet's
    assert set(kept) == set(whole)  # rem status --json's shape, unchanged
    assert any(w["role"] == "server" for w in kept["workers"])


def test_recall_is_kept_to_the_tokens_projects(served: Served) -> None:
    with served.client("alpha") as api:
        found = api.post("/v1/recall", json={"query": "ledger export", "k": 3})
        assert found.status_code == 200, found.text
        assert isinstance(found.json()["items"], list)
        assert api.post("/v1/recall", json={"query": "x", "project": "beta"}).status_code == 403
        assert api.post("/v1/recall", json={"query": ""}).status_code == 400
        assert api.post("/v1/recall", json={"query": "x", "k": 0}).status_code == 400


@pytest.mark.parametrize(
    "path", ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"]
)
def test_the_protected_resource_metadata_needs_no_token(served: Served, path: str) -> None:
    with served.client(None) as anonymous:
        document = anonymous.get(path).json()
    suffix = "/mcp" if path.endswith("/mcp") else ""
    assert document["resource"] == served.url + suffix
    assert document["authorization_servers"] == [] and document["bearer_methods_supported"] == ["header"]
    assert document["scopes_supported"] == ["read", "write", "decide"]


async def test_the_server_records_its_requests_at_heartbeats_and_rem_metrics_serves_them(
    served: Served, store_ctx: Context
) -> None:
    with served.client("ops") as api:
        for _ in range(3):
            assert api.get("/v1/sessions", params={"limit": 1}).status_code == 200
        assert api.get(f"/v1/sessions/{unique('s')}").status_code == 404
        # admission's hot path answers before FastAPI's router: counted under the route all the same
        assert api.post(f"/v1/sessions/{unique('s')}/inputs", json={"text": "x"}).status_code == 202

    async def recorded() -> dict[str, Any] | None:
        status = await ops.status(store_ctx)
        (server,) = status["api"]["servers"]
        counted = {(r["route"], r["code"]): r["count"] for r in server["requests"]}
        heard = counted.get(("/v1/sessions", 200), 0) >= 3
        return server if heard and counted.get(("/v1/sessions/{session_id}/inputs", 202)) else None

    server = await await_until(
        recorded, timeout=20, message="the server's next heartbeat to record its requests"
    )
    assert server["url"] == served.url and server["streams_open"] == 0
    assert any(r["route"] == "/v1/sessions/{session_id}" and r["code"] == 404 for r in server["requests"])
    (latency,) = [h for h in server["latency"] if h["route"] == "/v1/sessions"]
    assert latency["count"] >= 3 and latency["cumulative"][-1] <= latency["count"]
    scraped = run_rem("--data", str(served.data), "metrics", "--once", env=served.env)
    assert scraped.returncode == 0, scraped.stderr
    families = {f.name: f for f in text_string_to_metric_families(scraped.stdout)}
    requests = [
        s
        for s in families["rem_api_requests"].samples
        if s.labels.get("route") == "/v1/sessions" and s.labels["code"] == "200"
    ]
    assert requests and requests[0].labels["owner_id"] == server["owner_id"] and requests[0].value >= 3
    assert {"rem_api_request_duration_seconds", "rem_api_streams_open", "rem_api_server_error_ratio"} <= set(
        families
    )
