"""Secrets kept out of what rem shows: passwords in URLs, API keys in text an endpoint sends back.

* `redact_url` hides a URL's password, in its user info (`user:pw@`) or its
  query (`?password=pw`, as libpq takes it), without parsing the URL the way a
  strict parser would: a password holding `@`, `/`, `%` or `?` is hidden whole
  (everything between the first `:` of the user info and the last `@`), never
  cut where a parser gave up.
* `url_secrets` lists those passwords (as written and percent-decoded), and
  `redact_text` removes them from free text such as a driver's error message.
* `scrub_runs` removes every run of at least `RUN` characters of a secret, not
  just the whole secret: an endpoint that echoes a key with its last four
  characters starred would otherwise hand the rest to the journal and logs.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

HIDDEN = "***"
RUN = 8  # a run of this many characters of a key is scrubbed wherever it appears
SHORTEST_REDACTED = 3  # a shorter password is hidden in its URL but not hunted in free text


def _secret_spans(url: str) -> list[tuple[int, int]]:
    """Where `url` holds passwords: the user info's (after its first `:`, up to the last `@`, so a
    password holding `@`, `/` or `?` is covered whole) and each `password=` value; merged."""
    spans = []
    begin = url.find("://")
    begin = begin + 3 if begin >= 0 else 0
    at = url.rfind("@")
    colon = url.find(":", begin, at) if at > begin else -1
    if 0 <= colon < at - 1:
        spans.append((colon + 1, at))
    query = url.find("?")
    pos = query + 1
    for pair in url[pos:].split("&") if query >= 0 else []:
        key, eq, value = pair.partition("=")
        if eq and value and unquote(key).strip().lower() == "password":
            spans.append((pos + len(key) + 1, pos + len(pair)))
        pos += len(pair) + 1
    return _merged(spans)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` sorted, with overlapping ones joined into one."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def url_secrets(url: str) -> list[str]:
    """The passwords `url` carries, as written and percent-decoded, longest first."""
    raw = [url[start:end] for start, end in _secret_spans(url)]
    return sorted({s for r in raw for s in (r, unquote(r))}, key=len, reverse=True)


def redact_url(url: str) -> str:
    """`url` with its passwords (user info, `password=` parameter) replaced by `***`."""
    for start, end in reversed(_secret_spans(url)):
        url = url[:start] + HIDDEN + url[end:]
    return url


def has_password(url: str) -> bool:
    """Whether `url` carries a password (in its user info or as `password=`)."""
    return bool(_secret_spans(url))


def has_credentials(url: str) -> bool:
    """Whether `url` carries credentials: a user or password before its host, or `password=`."""
    return "@" in urlsplit(url).netloc or has_password(url)


def redact_text(text: str, url: str) -> str:
    """`text` with every password `url` carries (3 characters or more) replaced by `***`."""
    for secret in url_secrets(url):
        if len(secret) >= SHORTEST_REDACTED:
            text = text.replace(secret, HIDDEN)
    return text


def scrub_runs(text: str, secret: str, run: int = RUN) -> str:
    """`text` with every stretch made of `run`-character pieces of `secret` replaced by `***`.

    A secret shorter than `run` is scrubbed whole (when it is 4 characters or more).
    """
    if len(secret) < run:
        return text.replace(secret, HIDDEN) if len(secret) >= 4 else text
    starts = set()
    for piece in {secret[i : i + run] for i in range(len(secret) - run + 1)}:
        at = text.find(piece)
        while at >= 0:  # str.find per piece: C speed even on a long reply
            starts.add(at)
            at = text.find(piece, at + 1)
    spans: list[list[int]] = []
    for at in sorted(starts):
        if spans and at <= spans[-1][1]:
            spans[-1][1] = at + run
        else:
            spans.append([at, at + run])
    for start, end in reversed(spans):
        text = text[:start] + HIDDEN + text[end:]
    return text
