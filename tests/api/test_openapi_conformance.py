"""schemathesis against `/v1/openapi.json` of a real `rem serve` (SQLite and PostgreSQL): valid and
invalid requests generated from the document itself, with a live token; no answer is a 5xx, and
every answer (errors included) has a documented status, content type, headers and body shape."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.conftest import Served

# examples per operation (valid and invalid ones): enough to reach every documented refusal while
# the module stays near half a minute per store on the suite's 2 cores
EXAMPLES = 20
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture
def api_schema(served: Served) -> Any:
    loaded = schemathesis.openapi.from_url(f"{served.url}/v1/openapi.json")
    loaded.config.generation.update(max_examples=EXAMPLES, database="none", deterministic=True)
    return loaded


# The event streams are left out: a stream never ends, so no client that reads a whole answer can
# check one (tests/api/test_events.py covers them, their refusals included)
schema = schemathesis.pytest.from_fixture("api_schema").exclude(tag="events")
# a wait on an input holds its request up to a minute: the generated ones are kept to a second
MAX_WAIT_S = 1


@schema.parametrize()
def test_every_answer_is_documented_and_none_is_a_5xx(case: Any, served: Served) -> None:
    if case.query and _seconds(case.query.get("wait")) > MAX_WAIT_S:
        case.query["wait"] = MAX_WAIT_S
    case.call_and_validate(
        base_url=served.url, headers={"Authorization": f"Bearer {served.tokens['ops']}"}, checks=CHECKS
    )


def _seconds(value: Any) -> float:
    """A generated `wait` as a number (it may come as text), 0 when it is none."""
    try:
        return float(value) if value is not None and not isinstance(value, bool) else 0.0
    except (TypeError, ValueError):
        return 0.0
