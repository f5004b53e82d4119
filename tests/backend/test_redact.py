"""Secrets kept out of what rem shows: URL passwords however they are written, and any run of a key."""

from __future__ import annotations

import pytest

from backend.core.redact import has_credentials, redact_text, redact_url, scrub_runs, url_secrets


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://rem:s3cret@db:5432/rem", "postgresql://rem:***@db:5432/rem"),
        (
            "postgresql://rem:s3cr%zzet@db/rem",
            "postgresql://rem:***@db/rem",
        ),  # libpq refuses it: still hidden
        ("postgresql://rem:p@ss/w?rd@db/rem?sslmode=require", "postgresql://rem:***@db/rem?sslmode=require"),
        (
            "postgresql://rem@/rem?host=/run/pg&password=s3cret&port=5",
            "postgresql://rem@/rem?host=/run/pg&password=***&port=5",
        ),
        ("postgresql://rem@db/rem", "postgresql://rem@db/rem"),
        ("postgres://db/rem", "postgres://db/rem"),
    ],
)
def test_a_urls_password_is_hidden_however_it_is_written(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    for secret in url_secrets(url):
        assert secret not in redact_text(f"could not parse {url!r}: bad token {secret!r}", url)


def test_any_run_of_eight_characters_of_a_key_is_scrubbed() -> None:
    key = "sk-proj-Zq81vLmR4tYw0Ne7HcXb2Ks9"
    text = f"key {key[:-4]}****, again {key[5:20]} and whole {key}; not {key[:7]}"
    scrubbed = scrub_runs(text, key)
    assert scrubbed == f"key *******, again *** and whole ***; not {key[:7]}"
    assert all(key[i : i + 8] not in scrubbed for i in range(len(key) - 7))
    assert scrub_runs("nothing here", key) == "nothing here"


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("https://me:hunter22@llm.example/v1", True),
        ("https://me@llm.example/v1", True),
        ("https://llm.example/v1?password=x", True),
        ("https://llm.example/v1", False),
        ("http://127.0.0.1:8000/v1", False),
    ],
)
def test_a_model_url_with_credentials_is_recognised(url: str, refused: bool) -> None:
    assert has_credentials(url) is refused
