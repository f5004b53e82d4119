"""`POST /v1/sessions/{id}/inputs` against a real `rem serve` on SQLite and PostgreSQL: exactly once
per id, forever; another body under the id is a 409 naming it; concurrent duplicates answer the
first admission (never a 500 from a unique violation); bad input is a 4xx in the one shape and
writes nothing; the token's projects and scopes hold."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest

from backend import ops
from backend.runtime.context import Context
from tests.api.conftest import Served, unique
from tests.helpers import wait_until


async def _inputs(ctx: Context, input_id: str) -> list[tuple[str, int]]:
    db = await ctx.db()
    rows = await db.fetchall("SELECT session_id, admitted_seq FROM session_input WHERE id = ?", (input_id,))
    return [(r[0], r[1]) for r in rows]


async def test_an_input_is_admitted_once_forever_and_another_body_under_its_id_is_a_409(
    served: Served, store_ctx: Context
) -> None:
    sid, iid = unique("s"), unique("in")
    with served.client("alpha") as api:
        first = api.post(f"/v1/sessions/{sid}/inputs", json={"text": "hello", "input_id": iid})
        assert first.status_code == 202, first.text
        assert first.json() == {
            "session_id": sid,
            "input_id": iid,
            "delivery": "queue",
            "admitted_seq": 1,
            "duplicate": False,
        }
        assert first.headers["location"] == f"/v1/inputs/{iid}"
        assert "idempotent-replayed" not in first.headers
        # a later input moves the session's sequence on: the retry still answers the first admission
        assert api.post(f"/v1/sessions/{sid}/inputs", json={"text": "next"}).status_code == 202
        again = api.post(
            f"/v1/sessions/{sid}/inputs", json={"text": "hello"}, headers={"Idempotency-Key": iid}
        )
        assert again.status_code == 202
        assert again.json() == {**first.json(), "duplicate": True}
        assert again.headers["idempotent-replayed"] == "true"
        for changed in ({"text": "hello!"}, {"text": "hello", "delivery": "steer"}):
            refused = api.post(f"/v1/sessions/{sid}/inputs", json={**changed, "input_id": iid})
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"]["code"] == "input_conflict"
            assert iid in refused.json()["error"]["message"]
        elsewhere = api.post(f"/v1/sessions/{unique('s')}/inputs", json={"text": "hello", "input_id": iid})
        assert elsewhere.status_code == 409 and iid in elsewhere.text
        both = api.post(
            f"/v1/sessions/{sid}/inputs",
            json={"text": "hello", "input_id": iid},
            headers={"Idempotency-Key": "x1"},
        )
        assert both.status_code == 400 and "differ" in both.json()["error"]["message"]
    assert await _inputs(store_ctx, iid) == [(sid, 1)]
    db = await store_ctx.db()
    actors = await db.fetchall(
        "SELECT actor FROM event WHERE kind = 'input.admitted' AND session_id = ? ORDER BY id", (sid,)
    )
    assert [a[0] for a in actors] == ["alpha", "alpha"]  # journaled as the token's doing


async def test_concurrent_duplicates_all_answer_the_first_admission(
    served: Served, store_ctx: Context
) -> None:
    sid, iid = unique("s"), unique("in")
    async with served.async_client("alpha") as api:
        answers = await asyncio.gather(
            *(
                api.post(
                    f"/v1/sessions/{sid}/inputs", json={"text": "race"}, headers={"Idempotency-Key": iid}
                )
                for _ in range(12)
            )
        )
    assert [a.status_code for a in answers] == [202] * 12, [a.text for a in answers if a.status_code != 202]
    bodies = [a.json() for a in answers]
    assert sorted(b["duplicate"] for b in bodies) == [False] + [True] * 11
    assert {b["admitted_seq"] for b in bodies} == {1}
    assert await _inputs(store_ctx, iid) == [(sid, 1)]


async def test_another_projects_session_is_a_404_and_its_input_ids_are_refused_without_naming_it(
    served: Served, store_ctx: Context
) -> None:
    theirs, iid = unique("s"), unique("in")
    with served.client("beta") as beta:
        assert (
            beta.post(f"/v1/sessions/{theirs}/inputs", json={"text": "x", "input_id": iid}).status_code == 202
        )
    with served.client("alpha") as alpha:
        foreign = alpha.post(f"/v1/sessions/{theirs}/inputs", json={"text": "x"})
        missing = alpha.get(f"/v1/sessions/{theirs}")
        assert foreign.status_code == missing.status_code == 404
        assert foreign.json() == missing.json()
        taken = alpha.post(f"/v1/sessions/{unique('s')}/inputs", json={"text": "x", "input_id": iid})
        assert taken.status_code == 409 and theirs not in taken.text
        out = alpha.post(f"/v1/sessions/{unique('s')}/inputs", json={"text": "x", "project": "beta"})
        assert out.status_code == 403 and out.json()["error"]["code"] == "forbidden"
    with served.client("ops") as ops_api:  # a token of every project names the project of a new session
        made = ops_api.post(f"/v1/sessions/{unique('s')}/inputs", json={"text": "x", "project": "gamma"})
        assert made.status_code == 202
        assert ops_api.get(f"/v1/sessions/{made.json()['session_id']}").json()["project"] == "gamma"
    assert await _inputs(store_ctx, iid) == [(theirs, 1)]


def test_a_new_session_goes_to_the_tokens_only_project(served: Served) -> None:
    sid = unique("s")
    with served.client("alpha") as api:
        assert api.post(f"/v1/sessions/{sid}/inputs", json={"text": "x"}).status_code == 202
        assert api.get(f"/v1/sessions/{sid}").json()["project"] == "alpha"


async def test_a_token_is_checked_by_every_admission_and_a_revoked_one_refused_from_its_next(
    served: Served, store_ctx: Context
) -> None:
    """Admission checks its token inside its own transaction: a revocation committed elsewhere (here
    by another process on the store, as by another replica) refuses the very next request."""
    name, sid = unique("brief"), unique("s")
    token = (await ops.token_create(store_ctx, name, all_projects=True, scopes=["write"]))["token"]
    with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {token}"}) as api:
        assert (
            api.post(f"/v1/sessions/{sid}/inputs", json={"text": "x", "input_id": unique("in")}).status_code
            == 202
        )
        await ops.token_revoke(store_ctx, name)
        refused = api.post(f"/v1/sessions/{sid}/inputs", json={"text": "x", "input_id": unique("in")})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    assert refused.headers["www-authenticate"].endswith('error="invalid_token"')
    never = httpx.post(
        f"{served.url}/v1/sessions/{sid}/inputs",
        json={"text": "x"},
        headers={"Authorization": "Bearer rem_" + "x" * 43},
    )
    assert never.status_code == 401 and never.json() == refused.json()
    db = await store_ctx.db()
    assert await db.scalar("SELECT count(*) FROM session_input WHERE session_id = ?", (sid,)) == 1


def test_the_hot_path_and_the_route_answer_alike(served: Served) -> None:
    """A JSON body is admitted by the hot path; the same as `+json` (which it leaves alone) by the
    route: first admissions, replays and conflicts get the same status, headers and body either way."""

    def post(api: httpx.Client, by: str, sid: str, fields: dict[str, str]) -> httpx.Response:
        kind = "application/json" if by == "hot" else "application/vnd.rem+json"
        raw = json.dumps(fields).encode()
        return api.post(f"/v1/sessions/{sid}/inputs", content=raw, headers={"content-type": kind})

    def exchange(api: httpx.Client, first: str, then: str) -> list[tuple[object, ...]]:
        sid, iid = unique("s"), unique("in")
        same, changed = {"text": "same", "input_id": iid}, {"text": "changed", "input_id": iid}
        answers = [
            post(api, by, sid, f)
            for by, f in ((first, same), (then, same), (then, changed), (first, changed))
        ]
        kept = ("content-type", "location", "idempotent-replayed")
        return [
            (
                a.status_code,
                {k: v.replace(iid, "IN") for k, v in a.headers.items() if k in kept},
                a.text.replace(iid, "IN").replace(sid, "S"),
            )
            for a in answers
        ]

    with served.client("alpha") as api:
        hot_first, route_first = exchange(api, "hot", "route"), exchange(api, "route", "hot")
    assert [a[0] for a in hot_first] == [202, 202, 409, 409]
    assert hot_first == route_first


def test_the_hot_path_and_the_route_refuse_alike(served: Served) -> None:
    """The store's refusals answered by the hot path (a JSON body) are the route's (the same body as
    `+json`, which the hot path leaves alone): another project's session, a project out of the
    token's reach, an input id another session holds; a body sent without a declared length (chunked)
    goes to the route, and the hot path then answers its replay."""
    theirs, held = unique("s"), unique("in")
    with served.client("beta") as beta:
        assert (
            beta.post(f"/v1/sessions/{theirs}/inputs", json={"text": "x", "input_id": held}).status_code
            == 202
        )

    def both(api: httpx.Client, sid: str, fields: dict[str, str]) -> list[tuple[int, str]]:
        raw = json.dumps(fields).encode()
        return [
            (answer.status_code, answer.text)
            for kind in ("application/json", "application/vnd.rem+json")
            for answer in [
                api.post(f"/v1/sessions/{sid}/inputs", content=raw, headers={"content-type": kind})
            ]
        ]

    with served.client("alpha") as alpha:
        for sid, fields, status in [
            (theirs, {"text": "x"}, 404),
            (unique("s"), {"text": "x", "project": "beta"}, 403),
            (unique("s"), {"text": "x", "input_id": held}, 409),
        ]:
            hot, route = both(alpha, sid, fields)
            assert hot == route and hot[0] == status, (fields, hot, route)
        sid, iid = unique("s"), unique("in")
        body = json.dumps({"text": "chunked", "input_id": iid}).encode()
        chunked = alpha.post(
            f"/v1/sessions/{sid}/inputs",
            content=iter([body[:5], body[5:]]),
            headers={"content-type": "application/json"},
        )
        assert chunked.status_code == 202 and "content-length" not in chunked.request.headers
        again = alpha.post(
            f"/v1/sessions/{sid}/inputs", content=body, headers={"content-type": "application/json"}
        )
        assert again.status_code == 202 and again.json() == {**chunked.json(), "duplicate": True}


def test_tokens_and_scopes_are_enforced(served: Served) -> None:
    sid = unique("s")
    with served.client(None) as anonymous:
        refused = anonymous.post(f"/v1/sessions/{sid}/inputs", json={"text": "x"})
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith('Bearer realm="rem", resource_metadata="')
        assert refused.json()["error"]["code"] == "unauthorized"
        assert anonymous.get("/healthz").json() == {"ok": True}
    with served.client("reader") as reader:
        scoped = reader.post(f"/v1/sessions/{sid}/inputs", json={"text": "x"})
        assert scoped.status_code == 403 and scoped.json()["error"]["code"] == "insufficient_scope"
        assert reader.post("/v1/tool-calls/c1/approve").status_code == 403
        assert reader.get("/readyz").json() == {"ok": True}


async def test_bad_input_gets_a_4xx_in_the_one_shape_and_writes_nothing(
    served: Served, store_ctx: Context
) -> None:
    sid = unique("s")
    db = await store_ctx.db()
    before = await db.scalar("SELECT count(*) FROM session_input")
    cases = [
        ({"json": {"text": ""}}, 400),
        ({"json": {"text": "   "}}, 400),
        ({"json": {"text": 5}}, 400),
        ({"json": {"text": "x", "input_id": "bad id"}}, 400),
        ({"json": {"text": "x", "delivery": "later"}}, 400),
        ({"json": {"text": "x", "inputid": "a"}}, 400),
        ({"json": ["x"]}, 400),
        ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 400),
        ({"content": b'{"text": "\xff"}', "headers": {"content-type": "application/json"}}, 400),
        ({"json": {"text": "x" * (256 * 1024 + 1)}}, 400),
        (
            {
                "content": b'{"text": "' + b"a" * (2 * 1024 * 1024) + b'"}',
                "headers": {"content-type": "application/json"},
            },
            413,
        ),
    ]
    with served.client("alpha") as api:
        for kwargs, status in cases:
            answer = api.post(f"/v1/sessions/{sid}/inputs", **kwargs)  # type: ignore[arg-type]
            assert answer.status_code == status, (kwargs.get("json"), answer.text)
            error = answer.json()["error"]
            assert set(error) == {"code", "message"} and "\n" not in error["message"]
            assert "Traceback" not in answer.text
        bad_session = api.post("/v1/sessions/bad%20id/inputs", json={"text": "x"})
        assert bad_session.status_code == 400
        assert api.get("/v1/nowhere").json()["error"]["code"] == "not_found"
        wrong_method = api.delete(f"/v1/sessions/{sid}")
        assert (
            wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"
        )
    assert await db.scalar("SELECT count(*) FROM session_input") == before
    assert await db.scalar("SELECT count(*) FROM session WHERE id = ?", (sid,)) == 0


def test_a_body_sent_in_chunks_past_the_bound_is_refused_as_it_arrives(served: Served) -> None:
    def chunks() -> object:
        yield b'{"text": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}'

    with served.client("alpha") as api:
        answer = api.post(
            f"/v1/sessions/{unique('s')}/inputs",
            content=chunks(),
            headers={"content-type": "application/json"},
        )
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "payload_too_large"


async def test_on_postgresql_an_admission_racing_a_commit_of_its_id_answers_that_admission(
    served: Served, store_ctx: Context
) -> None:
    """Deterministically, the race two replicas run: another transaction admits the id and holds the
    session's row while this server's admission reads (nothing yet) and then waits for the row. Once
    the other commits, this admission's INSERT meets the id (unique_violation): it must answer the
    committed admission, as a duplicate, not a 500."""
    if served.db_url is None:
        pytest.skip("SQLite: BEGIN IMMEDIATE serializes admissions, so this interleaving cannot happen")
    sid, iid = unique("s"), unique("in")
    with served.client("alpha") as api:
        assert api.post(f"/v1/sessions/{sid}/inputs", json={"text": "first"}).status_code == 202
    other = psycopg.connect(served.db_url)
    try:
        seq = other.execute(
            "UPDATE session SET last_seq = last_seq + 1, input_count = input_count + 1 WHERE id = %s "
            "RETURNING last_seq",
            (sid,),
        ).fetchone()[0]  # type: ignore[index]
        other.execute(
            "INSERT INTO session_input (id, session_id, prompt, delivery, admitted_seq, wake_pending, "
            "wake_attempts, time_created) VALUES (%s, %s, %s, 'queue', %s, 0, 0, 0)",
            (iid, sid, json.dumps({"text": "raced"}), seq),
        )
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(
                lambda: served.client("alpha").post(
                    f"/v1/sessions/{sid}/inputs", json={"text": "raced"}, headers={"Idempotency-Key": iid}
                )
            )
            with psycopg.connect(served.db_url) as watcher:
                wait_until(
                    lambda: watcher.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0],  # type: ignore[index]
                    message="the server's admission to wait for the session row",
                )
            other.commit()
            raced = answer.result(timeout=30)
    finally:
        other.close()
    assert raced.status_code == 202, raced.text
    assert raced.json() == {
        "session_id": sid,
        "input_id": iid,
        "delivery": "queue",
        "admitted_seq": seq,
        "duplicate": True,
    }
    assert await _inputs(store_ctx, iid) == [(sid, seq)]
