"""Model endpoints: rem's built-in OpenAI-compatible adapter and what it records.

`config` (endpoint, model, key, timeouts from the model settings), `errors` (every
failure as one `ModelError` with a class and what rem does about it),
`client` (requests through the official `openai` SDK: bounded retries that
honour `Retry-After`, a per-process cap on requests in flight, and streamed
replies parsed from the raw SSE lines), `usage` (tokens and cost),
`health` (one record per request attempt, buffered until a daemon writes it
to state.db) and `embedder` (the `openai` embedder). The agent and the
synthesizer that use this live with their protocols, in `execution` and
`summaries`.
"""
